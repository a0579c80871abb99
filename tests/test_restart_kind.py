"""Which restart a settings change needs: serve-only keeps Ray, full takes it down."""

from __future__ import annotations

from dspark_launch.config.settings import resolve
from dspark_launch.serve.restart_kind import SERVE_LEVEL, restart_kind

EXAMPLE = "dspark_launch/config/env.dspark.example"


def values(**changed: str) -> dict[str, str]:
    return resolve(env_file=EXAMPLE, environ=dict(changed)).public_values()


def test_serve_level_changes_restart_only_vllm_serve():
    kind = restart_kind(values(), values(MAX_NUM_SEQS="8", DSPARK_MAX_INFLIGHT_PREFILLS="2", VLLM_PORT="9000"), True)
    assert kind.serve_only
    assert kind.why == (
        "serve-level setting(s) changed: DSPARK_MAX_INFLIGHT_PREFILLS 1 -> 2, MAX_NUM_SEQS 6 -> 8, "
        "VLLM_PORT 8888 -> 9000"
    )
    assert kind.line.startswith("restart: serve-only (Ray and the nodes kept up")
    assert restart_kind(values(), values(), True).why == "no setting changed"


def test_cluster_level_or_unknown_changes_and_a_down_cluster_restart_everything():
    kind = restart_kind(values(), values(MAX_NUM_SEQS="8", RAY_OBJECT_STORE_MB="4096"), True)
    assert not kind.serve_only and kind.why == "cluster-level setting(s) changed: RAY_OBJECT_STORE_MB 2048 -> 4096"
    assert kind.line.startswith("restart: full: ")
    unknown = restart_kind({**values(), "SOME_FUTURE_SETTING": "1"}, values(), True)
    assert not unknown.serve_only and "SOME_FUTURE_SETTING 1 -> None" in unknown.why
    assert restart_kind(values(), values(MAX_NUM_SEQS="8"), False).why == "Ray is not up on every node"
    assert restart_kind(None, values(), True).why == "no server recorded"


def test_secrets_show_only_as_set_or_unset():
    kind = restart_kind(values(), values(VLLM_API_KEY="sk-very-secret-value-123456"), True)
    assert kind.serve_only and "VLLM_API_KEY unset -> set" in kind.why and "sk-very" not in kind.why


def test_every_serve_level_name_is_a_setting_and_the_fabric_is_not_serve_level():
    names = set(values())
    assert SERVE_LEVEL <= names
    for cluster_level in (
        "RAY_PORT",
        "DSPARK_WORKER_IPS",
        "DSPARK_IMAGE",
        "DSPARK_FABRIC_IFNAME",
        "GPUS_PER_NODE",
        "RAY_AUTH_MODE",
        "DSPARK_MODEL_CACHE",
        "HF_HUB_OFFLINE",
        "DSPARK_FORWARD_ENV",
    ):
        assert cluster_level not in SERVE_LEVEL


def test_reload_takes_only_live_settings_and_names_every_other_change():
    from dspark_launch.hotfix.contract import LIVE_NAMES
    from dspark_launch.serve.restart_kind import LIVE_LEVEL, reload_changes

    assert LIVE_LEVEL == set(LIVE_NAMES)  # the hotfix's live settings, each declared level "live"
    start, now = (
        values(),
        values(DSPARK_MAX_INFLIGHT_PREFILLS="2", DSPARK_PREFILL_GATE_MODE="1", DSPARK_PREFILL_AGING="4"),
    )
    live = reload_changes(start, now)
    assert [c.line for c in live.live] == [
        "DSPARK_MAX_INFLIGHT_PREFILLS 1 -> 2",
        f"DSPARK_PREFILL_AGING {start['DSPARK_PREFILL_AGING']} -> {now['DSPARK_PREFILL_AGING']}",
        f"DSPARK_PREFILL_GATE_MODE {start['DSPARK_PREFILL_GATE_MODE']} -> 1",
    ]
    assert live.restart == ()
    mixed = reload_changes(values(), values(DSPARK_MAX_INFLIGHT_PREFILLS="2", MAX_NUM_SEQS="8"))
    assert [c.line for c in mixed.restart] == ["MAX_NUM_SEQS 6 -> 8"] and len(mixed.live) == 1
    # A value reload put in force is the running one: the same file again changes nothing.
    reloaded = {**values(), "DSPARK_MAX_INFLIGHT_PREFILLS": "2"}
    assert reload_changes(reloaded, values(DSPARK_MAX_INFLIGHT_PREFILLS="2")) == reload_changes(values(), values())
