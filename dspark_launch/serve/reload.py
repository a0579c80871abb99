"""`dspark reload`: live settings handed to the running scheduler, no restart.

The env file is read again (the same loader as `start`) and compared with the values the server runs
with (`ServerRecord.running_settings`). When only live settings changed (those declared `level="live"`: the
in-flight prefill cap, the gate mode, mode 3's aging, the per-step diagnostics), the head's agent replaces the patched
scheduler's control file (the scheduler runs in the head's EngineCore) and the launcher reads the server
log until the scheduler says the new values are in force; any other change is refused (exit 2), nothing
written. An idle engine never calls `schedule()`, so a one-token request wakes it when the values are not
in force a check period after the write.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from dspark_launch.cluster import lifecycle
from dspark_launch.report import Reporter
from dspark_launch.agent.protocol import ReadLog, SchedulerControl
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord, save_state
from dspark_launch.config.declared import DECLARED
from dspark_launch.config.levels import Levels
from dspark_launch.config.secret_digest import compared_values
from dspark_launch.config.settings import Settings
from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.hotfix import contract
from dspark_launch.node.engine_log import engine_text
from dspark_launch.serve.restart_kind import ReloadChanges, reload_changes

RELOAD_TIMEOUT_S = 30.0
POLL_S = 0.1
# A check period after the write with nothing in the log: the engine may be idle (no `schedule()` call).
NUDGE_AFTER_S = contract.LIVE_CHECK_PERIOD_S + 0.25


@dataclass(frozen=True)
class InForce:
    """The scheduler's live values, as the patched scheduler parses them."""
    cap: int
    gate_mode: int
    aging: float
    diagnostics: bool

    @classmethod
    def of(cls, values: dict[str, str]) -> "InForce":
        from dspark_launch.hotfix.injected import (_dspark_i27_parse_aging, _dspark_i27_parse_cap,
                                                   _dspark_i27_parse_diag, _dspark_i27_parse_mode)

        return cls(_dspark_i27_parse_cap(values.get(contract.ENV_CAP), 1)[0],
                   _dspark_i27_parse_mode(values.get(contract.ENV_GATE_MODE))[0],
                   _dspark_i27_parse_aging(values.get(contract.ENV_AGING))[0],
                   _dspark_i27_parse_diag(values.get(contract.ENV_DIAG)))

    def shown_by(self, line: contract.LiveLine) -> bool:
        # the log shows aging with %g (6 significant digits): compared the same way
        return ((line.cap, line.gate_mode, line.diagnostics) == (self.cap, self.gate_mode, self.diagnostics)
                and float(f"{self.aging:g}") == line.aging)


@dataclass(frozen=True)
class ReloadResult:
    changes: ReloadChanges
    seconds: float = 0.0  # from writing the control file to the log line that showed the values in force
    engine_line: str = ""  # what the scheduler logged: "cap 1 -> 2"
    woke_idle_engine: bool = False  # a one-token request was sent to make an idle engine schedule

    @property
    def lines(self) -> list[str]:
        if not self.changes.live:
            return ["reload: no live setting changed; nothing to do"]
        changed = ", ".join(c.line for c in self.changes.live)
        woke = " (the idle engine woken by a one-token request)" if self.woke_idle_engine else ""
        return [f"reload: {changed}: in force on the running scheduler after {self.seconds:.2f} s{woke}",
                f"  engine: {self.engine_line} (live)"]


class ReloadRefused(ConfigError):
    """Settings changed that only a restart applies (exit 2); nothing was written."""


def refusal(changes: ReloadChanges, settings: Settings, levels: Levels = DECLARED) -> ReloadRefused:
    def source(name: str) -> str:
        entry = settings.entries.get(name)
        return f" ({entry.source})" if entry is not None else ""

    need = ", ".join(f"{c.line}{source(c.name)}" for c in changes.restart)
    live = f"; the live change(s) ({', '.join(c.line for c in changes.live)}) were not applied either" \
        if changes.live else ""
    return ReloadRefused(f"reload: these settings need `dspark restart`: {need}{live}; nothing was changed; "
                         f"live settings (applied by reload): {', '.join(sorted(levels.live))}")


def reload(settings: Settings, spec: ClusterSpec, reporter: Reporter, timeout_s: float = RELOAD_TIMEOUT_S) -> ReloadResult:
    """Under the state lock: compare, then (live changes only) write the control file on the head and wait
    for the scheduler's log line; the record gets the values in force and since when."""
    from dspark_launch.serve.logfollow import END, LogReader
    from dspark_launch.serve.api_holder import require_ours

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
        if not server.control_file:
            raise DsparkError("reload: the server was started without a scheduler control file (an older "
                              "launcher); `dspark restart` applies the change")
        holder = require_ours(spec, server)  # the nudge below carries the key: only to the server's own port
        if not holder.recorded_alive:
            raise DsparkError(f"reload: vllm serve (pid {server.pid}) is not running; `dspark restart` starts it")
        if not holder.ours:
            raise DsparkError(f"reload: vllm serve (pid {server.pid}) does not listen on {server.url} yet; "
                              "`dspark reload` again once `dspark status` says up")
        values = {name: now[name] for name in contract.LIVE_NAMES if name in now}
        wanted = InForce.of(values)
        head = spec.head.agent(reporter)
        log = LogReader(head, server.log)
        log.offset = head.call(ReadLog(server.log, END)).offset
        reporter.phase(f"writing the scheduler's control file {server.control_file} on {spec.head.label}: "
                       + ", ".join(c.line for c in changes.live))
        began = time.monotonic()
        head.call(SchedulerControl(server.control_file, contract.control_text(values)))
        line, woke = _wait_in_force(log, wanted, server, settings, began, timeout_s, reporter)
        took = time.monotonic() - began
        server.live = {name: value for name, value in values.items() if server.settings.get(name) != value}
        server.live_since = time.time() if server.live else None
        server.scheduler_cap = line.cap
        save_state(spec.state_dir, state)
        return ReloadResult(changes, took, line.changes, woke)


def _wait_in_force(log, wanted: InForce, server: ServerRecord, settings: Settings, began: float, timeout_s: float,
                   reporter: Reporter) -> tuple[contract.LiveLine, bool]:
    """The first `(live)` line after the write that shows `wanted`; a refusal of the file by the scheduler,
    or `timeout_s` without the line, is a failure (the file stays: the scheduler may still take it)."""
    nudge: threading.Thread | None = None
    text = ""
    while True:
        text += log.new_text()  # whole lines: a read may end inside one
        said = engine_text(text, "scheduler.py")  # the scheduler's own lines only, never a client's prompt
        refused = contract.LIVE_WARNING_RE.search(said)
        if refused:
            raise DsparkError(f"reload: the scheduler refused its control file: {refused.group(1)}; "
                              "it keeps its values; log " + server.log)
        found = next((line for line in contract.parse_live_lines(said) if wanted.shown_by(line)), None)
        if found is not None:
            return found, nudge is not None
        elapsed = time.monotonic() - began
        if elapsed > timeout_s:
            raise DsparkError(f"reload: the control file {server.control_file} was written, but the server log "
                              f"did not show cap={wanted.cap}, gate mode {wanted.gate_mode} in force within "
                              f"{timeout_s:.0f} s; log {server.log}")
        if nudge is None and elapsed > NUDGE_AFTER_S:
            nudge = threading.Thread(target=_one_token, args=(server, settings), daemon=True)
            nudge.start()
        reporter.waiting("waiting for the scheduler to take the new values", elapsed, timeout_s)
        time.sleep(POLL_S)


def _one_token(server: ServerRecord, settings: Settings) -> None:
    """A one-token request: an idle EngineCore waits on its input queue and never calls `schedule()`."""
    from dspark_launch.serve import http
    from dspark_launch.serve.serve_spec import api_key

    ask = http.chat if server.chat else http.complete
    ask(server.url, api_key(settings), server.served_name, "Hello", 1, RELOAD_TIMEOUT_S)
