"""`dspark reload`: live settings handed to the running scheduler, no restart.

The env file is read again (the same loader as `start`) and compared with the values the server runs
with (`ServerRecord.running_settings`). When only live settings changed (those declared `level="live"`: the
in-flight prefill cap, the gate mode, mode 3's aging, the per-step diagnostics), the head's agent replaces the patched
scheduler's control file (the scheduler runs in the head's EngineCore) and the launcher reads the server
log until the scheduler says the new values are in force; any other change is refused (exit 2), nothing
written. An idle engine never calls `schedule()`, so a one-token request wakes it when the values are not
in force a check period after the write. With data parallel every EngineCore (all on the head, reading the
same control file) must say so: each rank's own line is awaited, and each idle rank is woken by a request
routed to it (vLLM's `X-data-parallel-rank` header).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dspark_launch.agent.protocol import ReadLog, SchedulerControl
from dspark_launch.cluster import lifecycle
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord, save_state
from dspark_launch.config.declared import DECLARED
from dspark_launch.config.levels import Levels
from dspark_launch.config.secret_digest import compared_values
from dspark_launch.config.settings import Settings, recorded_value
from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.hotfix import contract
from dspark_launch.node.engine_log import engine_lines
from dspark_launch.report import Reporter
from dspark_launch.serve.engines import engine_count
from dspark_launch.serve.restart_kind import ReloadChanges, reload_changes

if TYPE_CHECKING:
    from dspark_launch.serve import http

RELOAD_TIMEOUT_S = 30.0
POLL_S = 0.1
# A check period after the write with nothing in the log: the engine may be idle (no `schedule()` call).
NUDGE_AFTER_S = contract.LIVE_CHECK_PERIOD_S + 0.25


@dataclass(frozen=True)
class InForce:
    """The scheduler's live values by LiveSetting key (`cap`, `gate_mode`, ...: also read as attributes),
    as the patched scheduler parses them (its own parser, from the injected code)."""

    values: dict[str, int | float | bool]

    @classmethod
    def of(cls, values: dict[str, str]) -> "InForce":
        from dspark_launch.hotfix.live_values import scheduler_value

        return cls(
            {setting.key: scheduler_value(setting, values.get(setting.name)) for setting in contract.LIVE_SETTINGS}
        )

    def __getattr__(self, key: str) -> int | float | bool:
        values = self.__dict__.get("values", {})
        if key in values:
            return values[key]
        raise AttributeError(key)

    def shown_by(self, line: contract.LiveLine) -> bool:
        # the log shows a decimal with %g (6 significant digits): compared the same way
        return all(
            contract.shown(s, self.values[s.key]) == contract.shown(s, line.values[s.key])
            for s in contract.LIVE_SETTINGS
        )


@dataclass(frozen=True)
class ReloadResult:
    changes: ReloadChanges
    seconds: float = 0.0  # from writing the control file to the log line that showed the values in force
    engine_line: str = ""  # what the scheduler logged: "cap 1 -> 2" (rank 0's, with data parallel)
    engines: int = 1  # EngineCores that showed the values in force (data parallel: every rank)
    woken: tuple[int, ...] = ()  # the ranks an idle engine was woken on by a one-token request

    @property
    def lines(self) -> list[str]:
        if not self.changes.live:
            return ["reload: no live setting changed; nothing to do"]
        changed = ", ".join(c.line for c in self.changes.live)
        if self.engines == 1:
            woke = " (the idle engine woken by a one-token request)" if self.woken else ""
            where = "the running scheduler"
        else:
            ranks = ", ".join(str(rank) for rank in self.woken)
            woke = f" (idle rank(s) {ranks} woken by a one-token request each)" if self.woken else ""
            where = f"all {self.engines} engines (data-parallel ranks 0-{self.engines - 1})"
        return [
            f"reload: {changed}: in force on {where} after {self.seconds:.2f} s{woke}",
            f"  engine: {self.engine_line} (live)",
        ]


class ReloadRefused(ConfigError):
    """Settings changed that only a restart applies (exit 2); nothing was written."""


def refusal(changes: ReloadChanges, settings: Settings, levels: Levels = DECLARED) -> ReloadRefused:
    def source(name: str) -> str:
        entry = settings.named(name)  # a changed setting's recorded name
        return f" ({entry.source})" if entry is not None else ""

    need = ", ".join(f"{c.line}{source(c.name)}" for c in changes.restart)
    live = (
        f"; the live change(s) ({', '.join(c.line for c in changes.live)}) were not applied either"
        if changes.live
        else ""
    )
    return ReloadRefused(
        f"reload: these settings need `dspark restart`: {need}{live}; nothing was changed; "
        f"live settings (applied by reload): {', '.join(sorted(levels.live))}"
    )


def reload(
    settings: Settings, spec: ClusterSpec, reporter: Reporter, timeout_s: float = RELOAD_TIMEOUT_S
) -> ReloadResult:
    """Under the state lock: compare, then (live changes only) write the control file on the head and wait
    for the scheduler's log line; the record gets the values in force and since when."""
    from dspark_launch.serve.api_holder import keyed, require_ours
    from dspark_launch.serve.logfollow import END, LogReader
    from dspark_launch.serve.memory_guard import held_values as guard_held
    from dspark_launch.serve.serve_spec import api_key

    with lifecycle.locked_deployment(spec.state_dir) as state:
        server = state.server if state else None
        if server is None:
            raise DsparkError("reload: no server started from this state folder; `dspark start` serves")
        now = compared_values(settings, server.secrets)  # a rotated key is a change that needs `restart`
        changes = reload_changes(server.running_settings, now)
        if changes.restart:
            raise refusal(changes, settings)
        if not changes.live:
            return ReloadResult(changes)
        if recorded_value(server.settings, "dspark_hotfix") == "off":
            raise DsparkError(
                "reload: the server runs vLLM's own scheduler (started with DSPARK_HOTFIX=off), which "
                "reads no live settings; nothing was changed; DSPARK_HOTFIX=required and "
                "`dspark restart` serve the hotfix"
            )
        if not server.control_file:
            raise DsparkError(
                "reload: the server was started without a scheduler control file (an older "
                "launcher); `dspark restart` applies the change"
            )
        holder = require_ours(spec, server)  # the nudge below carries the key: only to the server's own port
        if not holder.recorded_alive:
            raise DsparkError(f"reload: vllm serve (pid {server.pid}) is not running; `dspark restart` starts it")
        if not holder.ours:
            raise DsparkError(
                f"reload: vllm serve (pid {server.pid}) does not listen on {server.url} yet; "
                "`dspark reload` again once `dspark status` says up"
            )
        values = {name: now[name] for name in contract.LIVE_NAMES if name in now}
        written = {**values, **guard_held(spec.state_dir, server.marker)}  # the memory guard's closed admission stays
        wanted = InForce.of(written)
        head = spec.head.agent(reporter)
        log = LogReader(head, server.log)
        log.offset = head.call(ReadLog(server.log, END)).offset
        reporter.phase(
            f"writing the scheduler's control file {server.control_file} on {spec.head.label}: "
            + ", ".join(c.line for c in changes.live)
        )
        began = time.monotonic()
        head.call(SchedulerControl(server.control_file, contract.control_text(written)))
        engines = engine_count(recorded_value(server.settings, "vllm_extra_args"))
        lines, woken = _wait_in_force(
            log,
            wanted,
            engines,
            server,
            settings,
            began,
            timeout_s,
            reporter,
            key=keyed(spec, server, api_key(settings), holder),
        )
        took = time.monotonic() - began
        server.live = {name: value for name, value in values.items() if server.settings.get(name) != value}
        server.live_since = time.time() if server.live else None
        server.scheduler_cap = int(lines[0].cap)
        save_state(spec.state_dir, state)
        return ReloadResult(changes, took, lines[0].changes, engines, woken)


def _wait_in_force(
    log,
    wanted: InForce,
    engines: int,
    server: ServerRecord,
    settings: Settings,
    began: float,
    timeout_s: float,
    reporter: Reporter,
    key: http.Keyed,
) -> tuple[list[contract.LiveLine], tuple[int, ...]]:
    """For each of the `engines` ranks, the first `(live)` line after the write that shows `wanted`, and the
    ranks woken (with `key`, its port checked before each nudge); a refusal of the file by any engine's
    scheduler, a nudge refused for a port another process holds, or `timeout_s` without every rank's line, is a
    failure (the file stays: the schedulers may still take it)."""
    shown: dict[int, contract.LiveLine] = {}
    woken: list[int] = []
    nudges_refused: list[DsparkError] = []  # a nudge's port check: another process holds the port, nothing was sent
    text = ""
    while True:
        text += log.new_text()  # a read may end inside a line: only the lines ended by "\n" so far are read
        # The schedulers' own lines only (vLLM's EngineCore prefix at the line's start), never a client's prompt
        # or an access-log line; split at "\n" only (a request id may hold U+2028 or U+0085 unescaped).
        for said in engine_lines(text[: text.rfind("\n") + 1], "scheduler.py"):
            refused = contract.LIVE_WARNING_RE.search(said.message)
            if refused:
                engine = f" of data-parallel rank {said.rank}" if engines > 1 else ""
                raise DsparkError(
                    f"reload: the scheduler{engine} refused its control file: {refused.group(1)}; "
                    "it keeps its values; log " + server.log
                )
            if said.rank < engines and said.rank not in shown:
                found = next((line for line in contract.parse_live_lines(said.message) if wanted.shown_by(line)), None)
                if found is not None:
                    shown[said.rank] = found
        if len(shown) == engines:
            return [shown[rank] for rank in range(engines)], tuple(woken)
        if nudges_refused:
            raise nudges_refused[0]
        elapsed = time.monotonic() - began
        missing = [rank for rank in range(engines) if rank not in shown]
        if elapsed > timeout_s:
            which = f" for data-parallel rank(s) {', '.join(map(str, missing))}" if engines > 1 else ""
            raise DsparkError(
                f"reload: the control file {server.control_file} was written, but the server log "
                f"did not show cap={wanted.cap}, gate mode {wanted.gate_mode} in force{which} within "
                f"{timeout_s:.0f} s; log {server.log}"
            )
        if not woken and elapsed > NUDGE_AFTER_S:
            woken = missing
            for rank in missing:
                threading.Thread(
                    target=_one_token, args=(server, key, rank if engines > 1 else None, nudges_refused), daemon=True
                ).start()
        reporter.waiting("waiting for the scheduler to take the new values", elapsed, timeout_s)
        time.sleep(POLL_S)


def _one_token(server: ServerRecord, key: http.Keyed, rank: int | None, refused: list[DsparkError]) -> None:
    """A one-token request: an idle EngineCore waits on its input queue and never calls `schedule()`;
    with data parallel, routed to engine `rank` by vLLM's `X-data-parallel-rank` header. The key's port check
    is made as it is sent (>= NUDGE_AFTER_S after reload's own); another process there lands in `refused`."""
    from dspark_launch.serve import http

    ask = http.chat if server.chat else http.complete
    headers = {} if rank is None else {"X-data-parallel-rank": str(rank)}
    try:
        ask(server.url, key, server.served_name, "Hello", 1, RELOAD_TIMEOUT_S, headers)
    except DsparkError as exc:
        refused.append(exc)
