"""Which restart a settings change needs: none for live settings (`dspark reload` hands them to the
running scheduler), serve-only keeps Ray (and the node containers) up and restarts only `vllm serve`; full takes
Ray down on every node too.

Each setting's level is in its declaration (`level="serve"` in config/knobs.py and config/text_settings.py;
config/levels.py says what each level means). A setting declared without one, and any setting this launcher
does not know, is cluster-level (fail closed: the cost of a wrong guess is a full restart, never a stale Ray).
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.config.declared import DECLARED
from dspark_launch.config.levels import Levels

#: Serve-level: only `vllm serve` reads them; the live ones are among them (a restart applies them too).
SERVE_LEVEL: frozenset[str] = DECLARED.serve
#: Live: the patched scheduler reads them again from its control file while it runs (`dspark reload`).
LIVE_LEVEL: frozenset[str] = frozenset(DECLARED.live)


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


def reload_changes(running: dict[str, str], now: dict[str, str], levels: Levels = DECLARED) -> ReloadChanges:
    """`running`: the public settings the server runs with (its start values, then what reload changed);
    `now`: the env file's public values; `levels`: the declared settings' levels."""
    live = frozenset(levels.live)
    changed = [
        SettingChange(name, running.get(name), now.get(name))
        for name in sorted(set(running) | set(now))
        if running.get(name) != now.get(name)
    ]
    return ReloadChanges(tuple(c for c in changed if c.name in live), tuple(c for c in changed if c.name not in live))


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


def restart_kind(
    running: dict[str, str] | None, now: dict[str, str], ray_up: bool, levels: Levels = DECLARED
) -> RestartKind:
    """`running`: the public settings the server was started with (None: no server recorded);
    `now`: the env file's public values; `ray_up`: every node's recorded Ray daemons alive;
    `levels`: the declared settings' levels."""
    if running is None:
        return RestartKind(False, "no server recorded")
    if not ray_up:
        return RestartKind(False, "Ray is not up on every node")
    changed = sorted(name for name in set(running) | set(now) if running.get(name) != now.get(name))
    cluster = [name for name in changed if name not in levels.serve]
    if cluster:
        return RestartKind(False, f"cluster-level setting(s) changed: {_changes(cluster, running, now)}")
    if not changed:
        return RestartKind(True, "no setting changed")
    return RestartKind(True, f"serve-level setting(s) changed: {_changes(changed, running, now)}")
