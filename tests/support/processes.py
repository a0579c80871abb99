"""Processes the tests start and stop: identity by pid + start time, read through the product's procfs.

Every process is started in its own session (``start_new_session=True``) and stopped by its
recorded pid, checked against its recorded start time so a reused pid is never signalled; never
``ray stop`` (it kills every Ray process on the machine) and never a kill by name. The one
SIGTERM-then-SIGKILL loop is the product's (``agent.terminate``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from dspark_launch.agent import protocol as p
from dspark_launch.agent.handlers.processes import terminate
from dspark_launch.node import procfs

proc_cmdline = procfs.cmdline


def cmdline(pid: int) -> str:
    return " ".join(procfs.cmdline(pid))


start_time = procfs.start_time


def environ_of(pid: int) -> dict[str, str]:
    """The environment `pid` started with (/proc/PID/environ)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def alive(pid: int, start: int | None = None) -> bool:
    """True if pid runs (not a zombie) and, when given, started at `start`."""
    started = procfs.start_time(pid)
    return started is not None and (start is None or started == start)


def survives(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


def describe(pids: Iterable[int]) -> str:
    """One line per pid (state, parent, age, command) for an assertion message: the age tells a process left
    by an earlier command from one that started a moment ago."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    ticks = os.sysconf("SC_CLK_TCK")
    out = []
    for pid in sorted(pids):
        state, started = procfs.state(pid), procfs.start_time(pid)
        if state is None:
            out.append(f"{pid} gone")
        else:
            age = f"{uptime - started / ticks:.1f}s" if started is not None else "?"
            cmd = " ".join(procfs.cmdline(pid))[:150]
            out.append(f"{pid} state={state} ppid={procfs.parent(pid)} age={age} {cmd}")
    return "; ".join(out)


def carrying(entry: str) -> list[int]:
    """Live pids whose environment holds `entry` (`NAME=value`), read from /proc."""
    needle = entry.encode()
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in environ and alive(int(name)):
            found.append(int(name))
    return found


def never_started(marker: str, witness: Path) -> bool:
    """True when no process an agent started for `marker` lives and none left `witness` behind.

    No wait is needed: an agent answers once its child exists, and a child whose first act is
    writing `witness` is then either alive (carrying DSPARK_OWNER=marker) or has written it.
    Looking at the processes first and at the file second leaves no gap between the two.
    """
    return not carrying(f"DSPARK_OWNER={marker}") and not witness.exists()


def wait_until(predicate, timeout: float, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def kill_now(pids: Iterable[int]) -> None:
    """SIGKILL each pid at once (a crash or a reboot as the processes see it); gone ones are skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def terminate_pids(pids: Iterable[int], grace: float = 5.0, kill_wait: float = 5.0) -> set[int]:
    """SIGTERM, SIGKILL what is left after `grace` s, wait up to `kill_wait` s (the product's loop).

    Start times are taken first so a reused pid is never signalled. Returns the pids that were signalled.
    """
    boot = procfs.boot_id()
    targets = {}
    for pid in pids:
        started = procfs.start_time(pid)
        if started is not None:
            targets[pid] = p.Process(pid, started, boot_id=boot)
    terminate(targets, grace, kill_wait)
    return set(targets)


def proc_rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children first), read from /proc."""
    children: dict[int, list[int]] = {}
    for child in procfs.pids():
        ppid = procfs.parent(child)
        if ppid is not None:
            children.setdefault(ppid, []).append(child)
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


@dataclass
class ProcRecord:
    """A process we started: pid plus the start time that proves it is still ours."""

    pid: int
    start_ticks: int | None
    argv: list[str]
    popen: subprocess.Popen | None = field(default=None, repr=False)

    @classmethod
    def of(cls, popen: subprocess.Popen, argv: list[str]) -> "ProcRecord":
        return cls(popen.pid, procfs.start_time(popen.pid), list(argv), popen)

    def is_ours(self) -> bool:
        return self.start_ticks is not None and procfs.start_time(self.pid) == self.start_ticks

    def alive(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            return False
        return self.is_ours() and alive(self.pid)

    def tree(self) -> list[int]:
        """This process and its live descendants (empty if the pid is no longer ours)."""
        if not self.is_ours():
            return []
        return [self.pid, *descendants(self.pid)]

    def tree_rss_bytes(self) -> int:
        return sum(proc_rss_bytes(p) for p in self.tree())


def snapshot(pids: list[int]) -> dict[int, int]:
    """{pid: start time} for the live ones, to check later with ``survivors``."""
    out = {}
    for pid in pids:
        ticks = procfs.start_time(pid)
        if ticks is not None and alive(pid):
            out[pid] = ticks
    return out


def survivors(snap: dict[int, int]) -> list[int]:
    """The pids of ``snap`` still running as the same process (pid reuse excluded)."""
    return [pid for pid, ticks in snap.items() if procfs.start_time(pid) == ticks]


def kill_tree(
    rec: ProcRecord,
    grace: float = 10.0,
    term_timeout: float = 5.0,
    extra_pids: list[int] | None = None,
) -> list[int]:
    """Stop ``rec`` and every process below it; return the pids still alive (should be []).

    1. SIGTERM the root only and wait up to ``grace`` s: ``ray start --block`` and
       vLLM's API server both shut their children down cleanly this way (Ray's
       head is gone in about 2 s; signalling all Ray processes at once instead
       leaves gcs_server/raylet hanging past 15 s).
    2. SIGTERM whatever is left (descendants snapshotted before step 1, so ones
       re-parented to init are not lost), SIGKILL what outlives ``term_timeout`` s
       (the product's ``agent.terminate``).
    Every pid is recorded with its start time and re-checked before each signal,
    so a pid reused by an unrelated process is never hit.
    """
    boot = procfs.boot_id()
    targets: dict[int, p.Process] = {}

    def add(pids: list[int]) -> None:
        for pid in pids:
            started = procfs.start_time(pid)
            if pid not in targets and started is not None:
                targets[pid] = p.Process(pid, started, boot_id=boot)

    def left() -> list[int]:
        return [pid for pid, proc in targets.items() if procfs.start_time(pid) == proc.start_time]

    add(rec.tree())
    add(extra_pids or [])
    if rec.pid in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if rec.popen is not None:
                rec.popen.poll()  # reap our direct child so it does not linger as a zombie
            if rec.pid in left():
                add(descendants(rec.pid))  # children started while shutting down
            if not left():
                break
            time.sleep(0.2)
    survivors_left = terminate({pid: targets[pid] for pid in left()}, term_timeout)
    if rec.popen is not None:
        try:
            rec.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return survivors_left


def start_process(argv: list[str], env: dict[str, str], log_path: Path, cwd: Path | None = None) -> ProcRecord:
    """Start ``argv`` (no shell) in its own session, stdout+stderr to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            argv,
            env=env,
            cwd=str(cwd) if cwd else None,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ProcRecord.of(popen, argv)
