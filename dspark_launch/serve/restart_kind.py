"""Which restart a settings change needs: none for live settings (`dspark reload` hands them to the
running scheduler), serve-only keeps Ray (and the node containers) up and restarts only `vllm serve`; full takes
Ray down on every node too.

A setting is serve-level when only `vllm serve` reads it (its flags, its environment, the launcher's
own waits): the list below. Every other setting, and any setting this launcher does not know, is
cluster-level (fail closed: the cost of a wrong guess is a full restart, never a stale Ray).
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.hotfix.contract import LIVE_NAMES
from dspark_launch.config.profile_resolve import SETTING_FLAGS

SERVE_LEVEL: frozenset[str] = frozenset({
    *(name for name, _ in SETTING_FLAGS),  # --max-num-seqs, --max-model-len, ...
    "ENABLE_PREFIX_CACHING", "VLLM_EXTRA_ARGS",
    "DSPARK_MODEL", "DSPARK_MODEL_REVISION", "DSPARK_SERVED_MODEL_NAME", "DSPARK_PROFILE", "DSPARK_PROFILE_ENV",
    "VLLM_HOST", "VLLM_PORT", "VLLM_API_KEY", "DSPARK_API_KEYS", "DSPARK_TRUSTED_NETWORK", "HF_TOKEN",
    "DSPARK_MAX_INFLIGHT_PREFILLS", "DSPARK_PREFILL_GATE_MODE", "DSPARK_PREFILL_AGING", "DSPARK_ISSUE43_SCHED_DIAG",
    "START_TIMEOUT_S", "HEALTH_TIMEOUT_S", "DSPARK_DRAIN_TIMEOUT_S", "DSPARK_MODEL_COPY_STREAMS",
})


#: Live: the patched scheduler reads them again from its control file while it runs (`dspark reload`).
LIVE_LEVEL: frozenset[str] = frozenset(LIVE_NAMES)
assert LIVE_LEVEL <= SERVE_LEVEL  # a restart applies them too


@dataclass(frozen=True)
class SettingChange:
    name: str
    running: str | None
    now: str | None

    @property
    def line(self) -> str:
        return f"{self.name} {self.running} -> {self.now}"


@dataclass(frozen=True)
class ReloadChanges:
    """`dspark reload`: what changed since the running server's values (its live ones included)."""
    live: tuple[SettingChange, ...]  # the running scheduler takes them
    restart: tuple[SettingChange, ...]  # any other: only `dspark restart` applies them


def reload_changes(running: dict[str, str], now: dict[str, str]) -> ReloadChanges:
    """`running`: the public settings the server runs with (its start values, then what reload changed);
    `now`: the env file's public values."""
    changed = [SettingChange(name, running.get(name), now.get(name))
               for name in sorted(set(running) | set(now)) if running.get(name) != now.get(name)]
    return ReloadChanges(tuple(c for c in changed if c.name in LIVE_LEVEL),
                         tuple(c for c in changed if c.name not in LIVE_LEVEL))


@dataclass(frozen=True)
class RestartKind:
    serve_only: bool
    why: str  # one line: what changed, or why Ray must go down too

    @property
    def line(self) -> str:
        kind = "serve-only (Ray and the nodes kept up; only vllm serve restarts)" if self.serve_only else "full"
        return f"restart: {kind}: {self.why}"


def _changes(names: list[str], running: dict[str, str], now: dict[str, str]) -> str:
    return ", ".join(f"{name} {running.get(name)} -> {now.get(name)}" for name in names)


def restart_kind(running: dict[str, str] | None, now: dict[str, str], ray_up: bool) -> RestartKind:
    """`running`: the public settings the server was started with (None: no server recorded);
    `now`: the env file's public values; `ray_up`: every node's recorded Ray daemons alive."""
    if running is None:
        return RestartKind(False, "no server recorded")
    if not ray_up:
        return RestartKind(False, "Ray is not up on every node")
    changed = sorted(name for name in set(running) | set(now) if running.get(name) != now.get(name))
    cluster = [name for name in changed if name not in SERVE_LEVEL]
    if cluster:
        return RestartKind(False, f"cluster-level setting(s) changed: {_changes(cluster, running, now)}")
    if not changed:
        return RestartKind(True, "no setting changed")
    return RestartKind(True, f"serve-level setting(s) changed: {_changes(changed, running, now)}")
