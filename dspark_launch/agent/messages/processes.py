"""The node itself and the processes the launcher starts on it (handlers/processes.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark_launch.agent.protocol import Process, Request, Session


@dataclass(frozen=True)
class Hello(Request["HelloAnswer"]):
    pass


@dataclass(frozen=True)
class HelloAnswer:
    protocol: int
    launcher: str
    hostname: str
    python: str


@dataclass(frozen=True)
class Probe(Request["ProbeAnswer"]):
    """Read-only: interpreter, installed modules, and (with `dashboard`) what Ray's dashboard lacks."""

    dashboard: bool = False


@dataclass(frozen=True)
class ModuleInfo:
    found: bool
    version: str | None = None


@dataclass(frozen=True)
class ProbeAnswer:
    hostname: str
    python: str
    python_version: str
    modules: dict[str, ModuleInfo]
    dashboard_missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryQuery(Request["MemoryAnswer"]):
    procfs_root: str = ""  # tests only (DSPARK_TEST_PROCFS_ROOT forwarded by the launcher): a fake /proc tree


@dataclass(frozen=True)
class MemoryAnswer:
    total_bytes: int | None  # MemTotal
    available_bytes: int | None = None  # MemAvailable: what vLLM's start-up gate reads on a GB10
    nvidia_gpu: bool = False  # an NVIDIA GPU is visible (/dev/nvidia0 ...): vLLM runs its CUDA platform
    pressure_some: float | None = None  # PSI memory "some" avg10 (%): None where the kernel has no PSI
    pressure_full: float | None = None  # PSI memory "full" avg10 (%)


@dataclass(frozen=True)
class Run(Request["RunAnswer"]):
    """Run argv to completion (output to `log`) with exactly `env` plus the owner marker."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    marker: str
    log: str = ""
    timeout: float | None = None
    sessions: tuple[Session, ...] = ()


@dataclass(frozen=True)
class RunAnswer:
    returncode: int | None  # None: still running at the timeout
    session: Session
    processes: tuple[Process, ...]


@dataclass(frozen=True)
class Spawn(Request["SpawnAnswer"]):
    """Start argv detached (own session, output to `log`) with exactly `env` plus the marker."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    marker: str
    log: str
    cwd: str = ""
    rotate_log: bool = False  # keep the previous log as LOG.1


@dataclass(frozen=True)
class SpawnAnswer:
    process: Process
    session: Session


@dataclass(frozen=True)
class ServeGo(Request["ServeGoAnswer"]):
    """A warm server (started with a go file, its log at `pending_log`) told to serve: its log becomes
    `log` (the previous one kept as LOG.1), then `go_file` says go."""

    go_file: str
    pending_log: str
    log: str


@dataclass(frozen=True)
class ServeGoAnswer:
    log: str


@dataclass(frozen=True)
class AliveQuery(Request["AliveAnswer"]):
    processes: tuple[Process, ...]


@dataclass(frozen=True)
class AliveAnswer:
    alive: tuple[bool, ...]


@dataclass(frozen=True)
class DrainEnd:
    """How a draining server says, in its log, that its drain is over: `done` from each of its `engines`,
    written after the SIGTERM with no `busy` line before them, means it had nothing in flight (what is left
    is its own teardown)."""

    log: str
    done: str
    busy: str
    engines: int = 1
    source_file: str = "core.py"  # the EngineCore module that logs both lines (node/engine_log.py)


@dataclass(frozen=True)
class Stop(Request["StopAnswer"]):
    marker: str
    processes: tuple[Process, ...] = ()
    sessions: tuple[Session, ...] = ()
    grace_s: float = 5.0
    drain_s: float = 0.0  # > 0: one SIGTERM, then up to drain_s for the processes to end by themselves
    # With drain_s: an idle drain ends at the log's `done` line (then the usual SIGTERM/SIGKILL, after
    # idle_grace_s); one with requests in flight still waits for the processes' own end.
    drain_end: DrainEnd | None = None
    idle_grace_s: float = 2.0


# StopAnswer.drain: how a drain ended. "idle": the log said done with nothing in flight (the rest cut short);
# "complete": done after finishing what was in flight; "ended": the processes ended without the log saying done;
# "timeout": drain_s passed first; "": no drain (or no drain_end to read).
DRAIN_OUTCOMES = ("", "idle", "complete", "ended", "timeout")


@dataclass(frozen=True)
class StopAnswer:
    stopped: tuple[int, ...]
    left: tuple[int, ...]
    drain: str = ""
