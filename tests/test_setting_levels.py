"""A setting's level and `vllm serve` flag are in its declaration: the restart kind, reload,
the plan's flags, the `VLLM_EXTRA_ARGS` refusals and the docs table all follow it, with nothing else to edit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType

import pytest

from dspark_launch.config import profile_resolve
from dspark_launch.config.declared import DECLARED
from dspark_launch.config.knobs import NumericKnobs, declared_knobs, knob, switch
from dspark_launch.config.levels import Levels, declared_settings, owned
from dspark_launch.config.serve_flags import LAUNCHER_FLAGS, UNSET_FLAGS, launcher_flags
from dspark_launch.config.settings import Setting, resolve
from dspark_launch.config.text_settings import TextSettings, text, text_settings_of
from dspark_launch.hotfix import contract
from dspark_launch.node.vllm_offer import VllmOffer
from dspark_launch.profiles.catalog import NONE
from dspark_launch.serve.reload import refusal
from dspark_launch.serve.restart_kind import LIVE_LEVEL, SERVE_LEVEL, reload_changes, restart_kind
from tools.settings_docs import settings_reference

EXAMPLE = "dspark_launch/config/env.dspark.example"

# The hand list restart_kind.py held before the levels moved into the declarations: the regression reference.
OLD_SERVE_LEVEL = frozenset(
    {
        "MAX_NUM_SEQS",
        "MAX_NUM_BATCHED_TOKENS",
        "LONG_PREFILL_TOKEN_THRESHOLD",
        "MAX_MODEL_LEN",
        "GPU_MEMORY_UTILIZATION",
        "ENABLE_PREFIX_CACHING",
        "VLLM_EXTRA_ARGS",
        "DSPARK_MODEL",
        "DSPARK_MODEL_REVISION",
        "DSPARK_SERVED_MODEL_NAME",
        "DSPARK_PROFILE",
        "DSPARK_PROFILE_ENV",
        "VLLM_HOST",
        "VLLM_PORT",
        "VLLM_API_KEY",
        "DSPARK_API_KEYS",
        "DSPARK_TRUSTED_NETWORK",
        "HF_TOKEN",
        "DSPARK_MAX_INFLIGHT_PREFILLS",
        "DSPARK_PREFILL_GATE_MODE",
        "DSPARK_PREFILL_AGING",
        "DSPARK_ISSUE43_SCHED_DIAG",
        "START_TIMEOUT_S",
        "HEALTH_TIMEOUT_S",
        "DSPARK_DRAIN_TIMEOUT_S",
        "DSPARK_MODEL_COPY_STREAMS",
    }
)
# Live settings declared after that list (each a row of hotfix.contract.LIVE_SETTINGS, live hence serve level).
LATER_LIVE = frozenset({"DSPARK_TARGET_STEP_MS", "DSPARK_ADMISSION_CLOSED"})
# profile_resolve.SETTING_FLAGS as it was written by hand (the argv order of the plan's settings run).
OLD_SETTING_FLAGS = (
    ("MAX_NUM_SEQS", "--max-num-seqs"),
    ("MAX_NUM_BATCHED_TOKENS", "--max-num-batched-tokens"),
    ("LONG_PREFILL_TOKEN_THRESHOLD", "--long-prefill-token-threshold"),
    ("MAX_MODEL_LEN", "--max-model-len"),
    ("GPU_MEMORY_UTILIZATION", "--gpu-memory-utilization"),
)
# The settings' rows of serve_flags.LAUNCHER_FLAGS as written by hand: (spellings, setting, why).
OLD_SETTING_ROWS = {
    (("--model",), "DSPARK_MODEL", ""),
    (("--revision",), "DSPARK_MODEL_REVISION", ""),
    (("--served-model-name",), "DSPARK_SERVED_MODEL_NAME", ""),
    (("--host",), "VLLM_HOST", ""),
    (("--port",), "VLLM_PORT", ""),
    (("--api-key",), "VLLM_API_KEY or DSPARK_API_KEYS", ""),
    (("--tensor-parallel-size", "-tp"), "GPUS_PER_NODE", "the launcher passes GPUS_PER_NODE x the number of nodes"),
    (("--max-num-seqs",), "MAX_NUM_SEQS", ""),
    (("--max-num-batched-tokens",), "MAX_NUM_BATCHED_TOKENS", ""),
    (("--long-prefill-token-threshold",), "LONG_PREFILL_TOKEN_THRESHOLD", ""),
    (("--max-model-len",), "MAX_MODEL_LEN", ""),
    (("--gpu-memory-utilization", "--device-memory-utilization"), "GPU_MEMORY_UTILIZATION", ""),
    (
        ("--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-prefix-caching"),
        "ENABLE_PREFIX_CACHING",
        "",
    ),
    (("--shutdown-timeout",), "DSPARK_DRAIN_TIMEOUT_S", ""),
}


@dataclass(frozen=True, kw_only=True)
class Extended(NumericKnobs, TextSettings):
    """The real declarations (in `Settings`' order) and one fake setting of each level."""

    fake_cluster_knob: int = knob(3, ge=1, le=9, group="cluster")
    """a fake knob declared without a level"""
    fake_serve_knob: int = knob(7, ge=1, le=9, group="serving", level="serve", flag="--fake-serve-flag")
    """a fake serve-level knob the plan passes as --fake-serve-flag"""
    fake_live_switch: bool = switch(False, group="hotfix", level="live")
    """a fake live switch"""
    fake_serve_text: str = text("x", group="serving", level="serve", flag=owned("--fake-owned", "-fo"))
    """a fake serve-level text setting whose flag the launcher writes itself"""


FAKE = Levels.of(declared_settings(Extended))


def values(**changed: str) -> dict[str, str]:
    return resolve(env_file=EXAMPLE, environ=dict(changed)).public_values()


def with_fakes(base: dict[str, str], **fakes: str) -> dict[str, str]:
    return {
        **base,
        "FAKE_CLUSTER_KNOB": "3",
        "FAKE_SERVE_KNOB": "7",
        "FAKE_LIVE_SWITCH": "0",
        "FAKE_SERVE_TEXT": "x",
        **fakes,
    }


def test_the_derived_tables_are_the_hand_tables_they_replace():
    assert SERVE_LEVEL == OLD_SERVE_LEVEL | LATER_LIVE
    assert profile_resolve.SETTING_FLAGS == OLD_SETTING_FLAGS
    assert profile_resolve.DRAIN_FLAG == "--shutdown-timeout"
    rows = {(f.spellings, f.setting, f.why) for f in LAUNCHER_FLAGS if f.setting}
    assert rows == OLD_SETTING_ROWS


def test_the_live_declarations_are_the_hotfix_contracts_live_names():
    # hotfix is below config: its contract keeps its own names (the standalone patch is built from it)
    assert DECLARED.live == contract.LIVE_NAMES  # the order too: reload's help and the control file list them so
    assert LIVE_LEVEL == frozenset(contract.LIVE_NAMES) and LIVE_LEVEL <= SERVE_LEVEL


def test_every_declared_setting_has_a_level_and_an_undeclared_name_is_cluster_level():
    names = {f.name.upper() for f in dataclasses.fields(NumericKnobs) + dataclasses.fields(TextSettings)}
    assert {s.name for s in DECLARED.settings} == names
    assert DECLARED.level("SOME_FUTURE_SETTING") == "cluster" and FAKE.level("FAKE_CLUSTER_KNOB") == "cluster"


def test_a_bad_level_or_a_flag_declared_two_ways_is_refused():
    with pytest.raises(ValueError, match="level 'restart'"):
        knob(1, ge=0, le=1, group="cluster", level="restart")  # type: ignore[arg-type]

    @dataclass(frozen=True)
    class Clash:
        a: int = knob(1, ge=0, le=1, group="x", flag="--same")
        b: int = knob(1, ge=0, le=1, group="x", flag=owned("--same", "-s"))

    with pytest.raises(ValueError, match="declare --same differently"):
        Levels.of(declared_settings(Clash)).owned_flags


def test_restart_kind_follows_the_declared_level():
    start = with_fakes(values())
    assert restart_kind(start, with_fakes(values(), FAKE_SERVE_KNOB="8"), True, FAKE).serve_only
    assert restart_kind(start, with_fakes(values(), FAKE_LIVE_SWITCH="1"), True, FAKE).serve_only
    assert restart_kind(start, with_fakes(values(), FAKE_SERVE_TEXT="y"), True, FAKE).serve_only
    cluster = restart_kind(start, with_fakes(values(), FAKE_SERVE_KNOB="8", FAKE_CLUSTER_KNOB="4"), True, FAKE)
    assert not cluster.serve_only and cluster.why == "cluster-level setting(s) changed: FAKE_CLUSTER_KNOB 3 -> 4"
    # the real declarations do not know the fakes: any change of them is a full restart
    assert not restart_kind(start, with_fakes(values(), FAKE_SERVE_KNOB="8"), True).serve_only


def test_reload_follows_the_declared_level(tmp_path):
    start = with_fakes(values())
    changes = reload_changes(start, with_fakes(values(), FAKE_LIVE_SWITCH="1", FAKE_SERVE_KNOB="8"), FAKE)
    assert [c.line for c in changes.live] == ["FAKE_LIVE_SWITCH 0 -> 1"]
    assert [c.line for c in changes.restart] == ["FAKE_SERVE_KNOB 7 -> 8"]
    message = str(refusal(changes, resolve(env_file=EXAMPLE, environ={}), FAKE))
    assert "need `dspark restart`: FAKE_SERVE_KNOB 7 -> 8" in message
    assert message.endswith("live settings (applied by reload): " + ", ".join(sorted(FAKE.live)))
    assert "FAKE_LIVE_SWITCH" in message.rsplit("applied by reload", 1)[1]
    assert reload_changes(start, with_fakes(values(), FAKE_LIVE_SWITCH="1"), DECLARED).live == ()  # not declared live


def test_reloads_help_names_the_declared_live_settings():
    from dspark_launch.cli.service_cmd import reload as reload_command

    assert reload_command.__doc__ is not None and "\n" not in reload_command.__doc__
    assert f"Apply live settings ({', '.join(contract.LIVE_NAMES)}) to the running" in reload_command.__doc__


def test_the_plans_flags_follow_the_declared_flag(monkeypatch):
    assert FAKE.setting_flags == (*OLD_SETTING_FLAGS, ("FAKE_SERVE_KNOB", "--fake-serve-flag"))
    monkeypatch.setattr(profile_resolve, "SETTING_FLAGS", FAKE.setting_flags)
    settings = resolve(env_file=EXAMPLE, environ={})
    fake = Setting("FAKE_SERVE_KNOB", "8", "environment", "serving", "a fake serve-level knob")
    settings = dataclasses.replace(settings, entries=MappingProxyType({**settings.entries, fake.name: fake}))
    args = list(
        profile_resolve.resolve(NONE, VllmOffer(version="", flags=(), speculative_methods=()), settings).serve_args
    )
    flags = [a for a in args if a.startswith("--")]
    assert flags[:7] == ["--served-model-name", *(f for _, f in OLD_SETTING_FLAGS), "--fake-serve-flag"]
    assert args[args.index("--fake-serve-flag") + 1] == "8"
    assert "--fake-owned" not in args  # the launcher writes an owned flag itself, never from the settings run


def test_extra_args_refuse_a_declared_flag():
    rows = {f.spellings: (f.setting, f.why) for f in launcher_flags(FAKE)}
    assert rows[("--fake-serve-flag",)] == ("FAKE_SERVE_KNOB", "")
    assert rows[("--fake-owned", "-fo")] == ("FAKE_SERVE_TEXT", "")
    assert launcher_flags(FAKE)[-len(UNSET_FLAGS) :] == UNSET_FLAGS  # then the flags no setting gives


def test_the_docs_table_follows_the_declaration():
    block = settings_reference(FAKE, declared_knobs(Extended), text_settings_of(Extended))
    rows = {line.split(" | ")[0]: line for line in block.splitlines() if line.startswith("| `")}
    assert "| cluster | cluster |  | a fake knob declared without a level |" in rows["| `FAKE_CLUSTER_KNOB`"]
    assert "| serving | serve | `--fake-serve-flag` | a fake serve-level knob" in rows["| `FAKE_SERVE_KNOB`"]
    assert "| hotfix | live |  | a fake live switch |" in rows["| `FAKE_LIVE_SWITCH`"]
    assert "| serving | serve | `--fake-owned` | a fake serve-level text setting" in rows["| `FAKE_SERVE_TEXT`"]
    assert rows["| `--fake-owned`, `-fo`"] == "| `--fake-owned`, `-fo` | `FAKE_SERVE_TEXT` |"
    real = {line.split(" | ")[0]: line for line in settings_reference().splitlines() if line.startswith("| `")}
    assert "| live |  |" in real["| `DSPARK_PREFILL_AGING`"]
    assert "| serve | `--max-model-len` |" in real["| `MAX_MODEL_LEN`"]
    assert "| cluster | `--tensor-parallel-size` |" in real["| `GPUS_PER_NODE`"]


def test_a_profile_value_is_typed_as_its_setting_is_declared():
    from dspark_launch.config.profile_resolve import profile_value
    from dspark_launch.errors import ConfigError
    from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
    from dspark_launch.profiles.model import SettingDefault

    typed = {d.setting: profile_value(DEEPSEEK_V4_FLASH, d) for d in DEEPSEEK_V4_FLASH.settings}
    assert typed["MAX_MODEL_LEN"] == "1048576" and typed["GPU_MEMORY_UTILIZATION"] == "0.87"
    for setting, value, declared in (
        ("MAX_MODEL_LEN", "256", "int"),
        ("MAX_NUM_SEQS", 6.0, "int"),
        ("MAX_NUM_SEQS", True, "int"),
        ("GPU_MEMORY_UTILIZATION", 1, "float"),
        ("DSPARK_MODEL", 3, "str"),
        ("NO_SUCH_SETTING", 1, "nowhere"),
        ("ENABLE_PREFIX_CACHING", 1, "bool"),
    ):
        with pytest.raises(ConfigError, match=rf"^profile none: {setting}=.* the setting is declared {declared}; "):
            profile_value(NONE, SettingDefault(setting, value, "a wrong type"))
