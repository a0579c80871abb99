"""What the supervisor (`start --foreground`, the systemd unit) does when it lost its server.

- The engine stalled (serve/stall.py) or `vllm serve` exited while every node's Ray lives: a serve-only restart
  (the stalled or dead server cut at once: a hung engine cannot drain; Ray and the containers kept).
- A node's Ray lost (or unreachable) twice in a row, or a recovery that failed: a full restart (what is left of this
  run stopped, then the same start).
- Each one named in one line, in the journal (the supervisor's stderr) and at the end of the server's log, before
  it acts; the k-th recovery within the last hour waits DSPARK_RECOVERY_BACKOFF_S x 2^(k-1) s first.
- DSPARK_RECOVERY_LIMIT recoveries within any hour at most (kept in `STATE/recoveries.json`, so a supervisor that
  systemd starts again counts them too): the loss after them stops this run and ends supervision with exit 4
  (EXIT_GAVE_UP), which the unit does not restart (`RestartPreventExitStatus=4`). 0: no recovery at all, exit 1 at
  the first loss (the supervisor before recoveries).
- Never an action on a run an operator's command took over (the record no longer holds this run: TAKEN_OVER),
  checked after the backoff and again under the lock by the restart itself.

A restart uses the settings this supervisor started with (never the env file as edited since: `dspark restart` is the
operator's way to apply edits). The serve-only restart skips the memory pre-flight (`force`): its plan passed it at
start, and the free memory it would measure is held by the very server being replaced.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from dspark_launch.cluster import lifecycle
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord
from dspark_launch.config.settings import Settings
from dspark_launch.errors import DsparkError
from dspark_launch.node.safe_path import UnsafePath, open_log, read_private, write_private
from dspark_launch.report import Reporter
from dspark_launch.serve import stall
from dspark_launch.serve.supervise import SERVER_CHECK_S, TAKEN_OVER, Lost, still_ours, watch

RECOVERIES_FILE = "recoveries.json"
WINDOW_S = 3600.0


@dataclass(frozen=True)
class Recovery:
    """One recovery the supervisor began: when (wall clock), serve-only or full, and why."""

    at: float
    kind: str
    cause: str


def recent_recoveries(state_dir: Path, now: float | None = None) -> list[Recovery]:
    """The recoveries of the last hour, oldest first (none when the file is absent or not one)."""
    now = time.time() if now is None else now
    try:
        rows = json.loads(read_private(state_dir / RECOVERIES_FILE, limit=1 << 20))
        kept = [Recovery(float(r["at"]), str(r["kind"]), str(r["cause"])) for r in rows]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [r for r in kept if now - r.at < WINDOW_S]


def _remember(state_dir: Path, recovery: Recovery) -> None:
    rows = [asdict(r) for r in (*recent_recoveries(state_dir, recovery.at), recovery)]
    write_private(state_dir / RECOVERIES_FILE, json.dumps(rows, indent=1) + "\n")


def note_in_log(server: ServerRecord | None, line: str) -> None:
    """`line` at the end of the server's log (appended: vLLM's own lines go on after it); never an error."""
    if server is None:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        with open_log(Path(server.log)) as log:
            log.write(f"{stamp} dspark supervisor: {line}\n".encode(errors="replace"))
    except (UnsafePath, OSError):
        pass  # the journal has the line


@dataclass(frozen=True)
class Ended:
    """Supervision over, not by an operator's command: why, whether the hourly limit ended it (exit 4) or recovery
    was off (exit 1), and the last server it watched (None: between servers)."""

    cause: str
    gave_up: bool
    server: ServerRecord | None
    stalled: bool = False  # the last loss was a stalled engine: stopped without a drain


def engine_look(settings: Settings, spec: ClusterSpec, server: ServerRecord) -> Callable[[], stall.EngineWatch]:
    """One look at `server`'s engine: its /metrics (after the port check of the key, as status reads it) judged
    against the kept progress point."""
    from dspark_launch.serve.api_holder import keyed
    from dspark_launch.serve.serve_spec import api_key

    check = keyed(spec, server, api_key(settings))

    def look() -> stall.EngineWatch:
        text = stall.metrics_text(server.url, settings.health_timeout_s, check)
        return stall.look(spec.state_dir, server.marker, text, settings.dspark_stall_timeout_s)

    return look


def stop_own(spec: ClusterSpec, reporter: Reporter, marker: str | None, now: bool = False) -> bool:
    """Stop this run: the server with `marker` (drained unless `now`: a stalled engine cannot drain) and Ray, only
    while the record still holds it (None: the run between two servers, the record holding none); False, nothing
    touched, when another command took it over."""
    from dspark_launch.serve.stop import stop_locked, stop_run

    if marker is not None:
        return stop_run(spec, reporter, marker, now)
    with lifecycle.locked_deployment(spec.state_dir) as state:
        if state is not None and state.server is not None:
            return False
        stop_locked(spec, reporter, state, now)
        return True


def _recover(
    lost: Lost, settings: Settings, spec: ClusterSpec, server: ServerRecord | None, force: bool, reporter: Reporter
) -> ServerRecord | None:
    """The restart `lost` calls for; the new server, or TAKEN_OVER when the record no longer held this run."""
    from dspark_launch.serve.restart import restart_serve
    from dspark_launch.serve.start import start

    if lost.kind in ("stalled", "exited") and server is not None:
        if not _cut(spec, server, reporter):
            return TAKEN_OVER
        return restart_serve(settings, spec, reporter, force=True, now=True, marker=server.marker).server
    if not stop_own(spec, reporter, server.marker if server else None, now=True):
        return TAKEN_OVER
    return start(settings, spec, reporter, force=force).server


PORT_RELEASE_S = 15.0  # how long a cut server's listening socket may take to go


def _cut(spec: ClusterSpec, server: ServerRecord, reporter: Reporter) -> bool:
    """The stalled (or dead) server stopped at once, under the lock, before its successor starts: it serves nobody,
    its memory goes back to the node first, and its port is free when the new one binds (a killed multi-threaded
    server's listening socket outlives its main thread by a moment: waited for, up to PORT_RELEASE_S). False when
    the record no longer holds it."""
    from dspark_launch.agent.protocol import PortHolderAnswer
    from dspark_launch.serve.api_holder import api_holder
    from dspark_launch.serve.stop import abort_server

    with lifecycle.locked_deployment(spec.state_dir) as state:
        if state is None or state.server is None or state.server.marker != server.marker:
            return False
        stopped = abort_server(spec, state.server)
    reporter.phase(f"vllm serve (pid {server.pid}): cut, {len(stopped.stopped)} process(es) stopped")
    deadline = time.monotonic() + PORT_RELEASE_S
    while api_holder(spec, server).verdict == PortHolderAnswer.FOREIGN and time.monotonic() < deadline:
        time.sleep(0.2)
    return True


def supervise(
    settings: Settings,
    spec: ClusterSpec,
    server: ServerRecord,
    force: bool,
    reporter: Reporter,
    tell: Callable[[str], None],
    on_server: Callable[[ServerRecord | None], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> Ended | None:
    """Watch `server`; recover from each loss within the hourly limit. TAKEN_OVER (None) when an operator's command
    took the run over; else how it ended. `tell`: a journal line; `on_server`: the server now watched (None while
    a recovery replaces it), for the signal handler that stops this run."""
    from dspark_launch.serve.memory_guard import Guard

    guard = Guard(settings, spec, tell, note_in_log, clock)
    try:
        return _supervise(settings, spec, server, force, reporter, tell, on_server, sleep, clock, guard)
    finally:
        guard.release(_recorded_server(spec))  # nothing left closed after supervision (a recovery's new server: open)


def _recorded_server(spec: ClusterSpec) -> ServerRecord | None:
    from dspark_launch.cluster.state import load_state

    try:
        state = load_state(spec.state_dir)
    except DsparkError:
        return None
    return state.server if state else None


def _supervise(
    settings: Settings,
    spec: ClusterSpec,
    server: ServerRecord,
    force: bool,
    reporter: Reporter,
    tell: Callable[[str], None],
    on_server: Callable[[ServerRecord | None], None],
    sleep: Callable[[float], None],
    clock: Callable[[], float],
    guard,
) -> Ended | None:
    limit, backoff = settings.dspark_recovery_limit, settings.dspark_recovery_backoff_s
    current: ServerRecord | None = server
    lost = watch(spec, server, sleep, engine_look(settings, spec, server), guard.look)
    while True:
        if lost is TAKEN_OVER:
            return TAKEN_OVER
        if limit == 0:
            return Ended(lost.cause, False, current, lost.kind == "stalled")
        done = recent_recoveries(spec.state_dir, clock())
        if len(done) >= limit:
            cause = (
                f"{lost.cause}; {len(done)} recoveries within the last hour already (DSPARK_RECOVERY_LIMIT="
                f"{limit}, the first at {time.strftime('%H:%M:%S', time.localtime(done[0].at))}): giving up"
            )
            note_in_log(current, cause)
            return Ended(cause, True, current, lost.kind == "stalled")
        kind = "serve-only restart" if lost.kind in ("stalled", "exited") and current is not None else "full restart"
        wait = backoff * 2 ** len(done)
        line = f"{lost.cause}; {kind} in {wait} s (recovery {len(done) + 1} of at most {limit} within an hour)"
        tell(line)
        note_in_log(current, line)
        if not _backoff(spec, current, wait, sleep, clock):
            return TAKEN_OVER
        _remember(spec.state_dir, Recovery(clock(), kind.split()[0], lost.cause))
        guard.forget()  # whatever it closed ends with the server being replaced (its successor starts open)
        on_server(None)
        try:
            current = _recover(lost, settings, spec, current, force, reporter)
        except DsparkError as error:
            current = None
            lost = Lost("failed", f"the {kind} failed: {error}")
            continue
        if current is None:
            return TAKEN_OVER
        on_server(current)
        tell(f"recovered: vllm serve (pid {current.pid}) serves at {current.url} after the {kind}")
        lost = watch(spec, current, sleep, engine_look(settings, spec, current), guard.look)


def _backoff(
    spec: ClusterSpec,
    server: ServerRecord | None,
    wait: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> bool:
    """Wait `wait` s; False as soon as another command took the run over (checked each poll and at the end)."""
    marker = server.marker if server else None
    until = clock() + wait
    while clock() < until:
        if not still_ours(spec, marker, sleep):
            return False
        sleep(min(SERVER_CHECK_S, max(0.0, until - clock())))
    return still_ours(spec, marker, sleep)
