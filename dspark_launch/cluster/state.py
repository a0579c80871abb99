"""The state folder: what this launcher started, where, and the lock.

The folder must be this user's and not writable by group or others (created 0700 when
absent, never chmod-ed when it exists: `DSPARK_STATE_DIR=/tmp` keeps /tmp's sticky bit);
its records are read only from such a folder, files are opened without following links
and written through unique temporary names. Nothing secret is written to `state.json`;
the Ray token has its own 0600 file, generated under the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, TypeVar

from dspark_launch.agent.codec import from_data, to_data
from dspark_launch.agent.protocol import Process, Session
from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.node.safe_path import (
    UnsafePath,
    check_ancestors,
    check_dir,
    make_dir,
    make_log_dir,
    read_private,
    write_private,
    write_temp,
)

STATE_FILE = "state.json"
LOCK_FILE = "lock"
TOKEN_FILE = "ray-auth-token"
LOGS_DIR = "logs"
LOCK_PROBE_GRACE_S = 0.25


class LockHeld(DsparkError):
    """Another launcher holds the state folder's lock."""


# The record's own types: state.json changes only when these do, never with the agent's wire types (which
# carry the same fields today; `recorded` and `on_wire` convert field by field, at the seam).
R = TypeVar("R")


def recorded(kind: type[R], value: Any) -> R:
    """A value the agent answered (a wire type) as the record's `kind`, or a record back as a wire type."""
    return from_data(kind, to_data(value))


on_wire = recorded


@dataclass(frozen=True)
class SessionRecord:
    """A process group we started (its leader's pid = sid), in the boot it was started in."""

    sid: int
    start_time: int
    boot_id: str = ""


@dataclass(frozen=True)
class ProcessRecord:
    """A process by identity: pid plus start time (and boot), so a reused pid never matches."""

    pid: int
    start_time: int
    sid: int | None = None
    boot_id: str = ""
    cmd: str = ""


@dataclass(frozen=True, kw_only=True)
class VersionsRecord:
    """One node's row of the version matrix at start (node.values.VersionRow)."""

    python: str | None = None
    vllm: str | None = None
    ray: str | None = None
    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None
    compute_capability: str | None = None
    nccl: str | None = None
    dspark_launch: str | None = None
    scheduler_sha256: str | None = None
    hostname: str | None = None
    image: str | None = None


@dataclass(frozen=True)
class HotfixResultRecord:
    action: str
    code: int
    state: str
    message: str
    vllm_version: str = ""
    patch_version: int | None = None
    changed: bool = False  # the action wrote the file


@dataclass(frozen=True)
class HotfixRecord:
    """The hotfix applied and verified on one node at start (agent.protocol.HotfixApplyAnswer); with DSPARK_HOTFIX=off
    `apply` is the revert (action "revert") and `status` the file afterwards."""

    hostname: str
    apply: HotfixResultRecord
    status: HotfixResultRecord


@dataclass(frozen=True)
class RayRegistrationRecord:
    """How Ray registered a node when the start's checks passed (agent.protocol.RayNode): `status` answers the
    node's registered IP and GPUs from it while the node's recorded Ray daemons are the same processes."""

    node_id: str
    ip: str
    gpus: float


def wire_sessions(sessions: list[SessionRecord]) -> tuple[Session, ...]:
    return tuple(on_wire(Session, session) for session in sessions)


def wire_processes(processes: list[ProcessRecord]) -> tuple[Process, ...]:
    return tuple(on_wire(Process, process) for process in processes)


@dataclass(kw_only=True)
class NodeRecord:
    name: str
    ip: str
    ssh_host: str | None
    marker: str  # DSPARK_OWNER value of every process we started on this node
    processes: list[ProcessRecord] = field(default_factory=list)  # Ray's daemons as found after `ray start`
    sessions: list[SessionRecord] = field(default_factory=list)  # each process group we started
    ray_temp_dir: str = ""
    ray_log: str = ""
    fabric_warnings: list[str] = field(default_factory=list)  # e.g. NCCL falls back to TCP (shown by status)
    # DSPARK_RUNTIME=docker|podman: the node's container, the runtime that made it, the image id it runs.
    container_name: str = ""
    container_runtime: str = ""
    container_image_id: str = ""
    ray: RayRegistrationRecord | None = None  # Ray's registration at the start's checks (None: not recorded)


@dataclass(kw_only=True)
class ServerRecord:
    """`vllm serve` on the head: who it is, where it answers, what it was started with."""

    marker: str
    log: str
    url: str
    served_name: str
    model: str
    started_at: float
    settings: dict[str, str]  # public values it was started with (drift compares against these)
    digest: str
    cap: int
    pid: int | None = None
    start_time: int | None = None
    boot_id: str = ""
    sessions: list[SessionRecord] = field(default_factory=list)
    kv_cache_tokens: int | None = None
    scheduler_cap: int | None = None  # what the EngineCore's scheduler reported
    profile: str = ""  # DSPARK_PROFILE it was started with
    decisions: list[str] = field(default_factory=list)  # the profile's decision lines (shown by status)
    chat: bool = False  # readiness and smoke use /v1/chat/completions
    drain_s: int = 0  # the --shutdown-timeout it was started with: `stop` lets it drain that long (0: aborts)
    control_file: str = ""  # the scheduler's control file (`dspark reload`; "": started without one)
    live: dict[str, str] = field(default_factory=dict)  # live settings `dspark reload` put in force, by name
    live_since: float | None = None  # when the engine log showed them in force
    secrets: dict[str, str] = field(default_factory=dict)  # salted digest per secret set (config/secret_digest.py)

    @property
    def running_settings(self) -> dict[str, str]:
        """The public values in force: those it was started with, then what `dspark reload` changed."""
        return {**self.settings, **self.live}

    @property
    def process(self) -> Process | None:
        if self.pid is None or self.start_time is None:
            return None
        return Process(self.pid, self.start_time, self.pid, self.boot_id)


@dataclass(kw_only=True)
class Deployment:
    """Everything one `start` (or `cluster up`) left running, as saved in state.json."""

    ray_address: str
    config_digest: str
    started_at: float
    launcher_version: str
    nodes: list[NodeRecord]
    hotfix: dict[str, HotfixRecord] = field(default_factory=dict)  # node name -> report
    versions: dict[str, VersionsRecord] = field(default_factory=dict)  # node name -> version matrix row
    server: ServerRecord | None = None
    # node name -> the platform facts at start (node/platform.compared: kernel, CmaTotal, driver, firmware, ...)
    platform: dict[str, dict[str, str]] = field(default_factory=dict)

    def node(self, name: str) -> NodeRecord | None:
        return next((n for n in self.nodes if n.name == name), None)


class StateUnreadable(DsparkError):
    """state.json exists but cannot be read as a deployment record."""


SAFE_FOLDER = "allowed: a folder of this user that group and others cannot write (set DSPARK_STATE_DIR)"


def _unsafe(path: Path, exc: UnsafePath) -> ConfigError:
    return ConfigError(f"DSPARK_STATE_DIR={path}: {exc}; nothing was started or read; {SAFE_FOLDER}")


def ensure_state_dir(path: Path) -> Path:
    """Create the folder 0700 and its logs/ folder, or check them; one line before anything starts."""
    for folder, make in ((path, make_dir), (path / LOGS_DIR, make_log_dir)):
        try:
            make(folder)
            probe = folder / f".write-test-{os.getpid()}"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            probe.unlink()
        except UnsafePath as exc:
            raise _unsafe(path, exc) from None
        except OSError as exc:
            subject = f"DSPARK_STATE_DIR={path}" if folder == path else f"the log folder {folder}"
            raise ConfigError(f"{subject}: not writable ({exc.strerror}); nothing was started; {SAFE_FOLDER}") from None
    return path


def check_state_dir(path: Path) -> bool:
    """Whether the state folder exists; raises ConfigError when it is one whose records cannot be trusted."""
    if not os.path.lexists(path):
        return False
    try:
        check_ancestors(path)
        check_dir(path)
    except UnsafePath as exc:
        raise _unsafe(path, exc) from None
    return True


def _read_private(path: Path) -> str:
    return read_private(path).decode("utf-8")


def save_state(state_dir: Path, state: Deployment) -> None:
    write_private(state_dir / STATE_FILE, json.dumps(to_data(state), indent=2) + "\n")


def load_state(state_dir: Path) -> Deployment | None:
    """The record, or None when there is none. Fields another launcher version added are ignored;
    a file that is not a record raises StateUnreadable naming it (exit 1)."""
    path = state_dir / STATE_FILE
    if not check_state_dir(state_dir):
        return None
    try:
        text = _read_private(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateUnreadable(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        data = json.loads(text)
        if isinstance(data, dict) and not data.get("server"):
            data["server"] = None  # launchers before 0.2 wrote {} for "no server"
        return from_data(Deployment, data)
    except (ValueError, TypeError) as exc:
        raise StateUnreadable(
            f"{path}: not a deployment record ({exc}); move it aside if no cluster runs from this state folder"
        ) from None


def clear_state(state_dir: Path) -> None:
    try:
        (state_dir / STATE_FILE).unlink()
    except FileNotFoundError:
        pass


def ray_token(state_dir: Path, configured: str, create: bool = False) -> str:
    """The configured token, else the one generated at first start (0600); "" when there is none yet.

    `create` only under the state lock: the first start's token is the one its cluster uses. The file
    appears with its content at once (a link to a complete temporary file), so even two creators agree.
    """
    if configured:
        return configured
    path = state_dir / TOKEN_FILE
    try:
        return _read_private(path).strip()
    except FileNotFoundError:
        if not create:
            return ""
    except OSError as exc:
        raise StateUnreadable(f"{path}: cannot read it ({exc.strerror})") from None
    tmp = write_temp(path, secrets.token_hex(32) + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another launcher made it first: use theirs
    finally:
        os.unlink(tmp)
    return _read_private(path).strip()


def rotate_ray_token(state_dir: Path) -> bool:
    """A fresh token in place of the one on file (renamed over it: a reader sees the old or the new one),
    after someone else was found on the GCS's port; False when there was none on file."""
    path = state_dir / TOKEN_FILE
    if not path.exists():
        return False
    write_private(path, secrets.token_hex(32) + "\n")
    return True


@contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """flock on the state folder; a second launcher fails naming the holder's pid."""
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        if not _take_exclusive(fd):
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise LockHeld(f"another dspark (pid {holder}) holds {path}; wait for it or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _take_exclusive(fd: int) -> bool:
    """The lock, unless another launcher holds it. A `lock_holder` probe (`status`, a supervisor) holds it
    shared for microseconds: tried again for a moment, so a probe is never taken for a holder."""
    deadline = time.monotonic() + LOCK_PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def lock_holder(state_dir: Path) -> str | None:
    """The pid holding the lock, or None when free; never takes it for long or rewrites it."""
    path = state_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)
    return None
