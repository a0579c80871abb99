"""The state folder (mode 0700): what this launcher started, where, and the lock.

Nothing secret is written to `state.json`; the Ray token has its own 0600 file.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from dspark_launch.cluster.codec import from_data, to_data
from dspark_launch.cluster.protocol import HotfixReport, Process, Session, VersionRow
from dspark_launch.errors import ConfigError, DsparkError

STATE_FILE = "state.json"
LOCK_FILE = "lock"
TOKEN_FILE = "ray-auth-token"
LOGS_DIR = "logs"


class LockHeld(DsparkError):
    """Another launcher holds the state folder's lock."""


@dataclass
class NodeRecord:
    name: str
    ip: str
    ssh_host: str | None
    marker: str  # DSPARK_OWNER value of every process we started on this node
    processes: list[Process] = field(default_factory=list)  # Ray's daemons as found after `ray start`
    sessions: list[Session] = field(default_factory=list)  # each process group we started
    ray_temp_dir: str = ""
    ray_log: str = ""
    # DSPARK_RUNTIME=docker|podman: the node's container, the runtime that made it, the image id it runs.
    container_name: str = ""
    container_runtime: str = ""
    container_image_id: str = ""


@dataclass
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
    sessions: list[Session] = field(default_factory=list)
    kv_cache_tokens: int | None = None
    scheduler_cap: int | None = None  # what the EngineCore's scheduler reported

    @property
    def process(self) -> Process | None:
        if self.pid is None or self.start_time is None:
            return None
        return Process(self.pid, self.start_time, self.pid, self.boot_id)


@dataclass
class Deployment:
    """Everything one `start` (or `cluster up`) left running, as saved in state.json."""
    ray_address: str
    config_digest: str
    started_at: float
    launcher_version: str
    nodes: list[NodeRecord]
    hotfix: dict[str, HotfixReport] = field(default_factory=dict)  # node name -> report
    versions: dict[str, VersionRow] = field(default_factory=dict)  # node name -> version matrix row
    server: ServerRecord | None = None

    def node(self, name: str) -> NodeRecord | None:
        return next((n for n in self.nodes if n.name == name), None)


class StateUnreadable(DsparkError):
    """state.json exists but cannot be read as a deployment record."""


def ensure_state_dir(path: Path) -> Path:
    """Create the folder 0700 and its logs/ folder, or fail with one line before anything starts."""
    for folder in (path, path / LOGS_DIR):
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            if folder == path:
                os.chmod(path, 0o700)
            probe = folder / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            subject = f"DSPARK_STATE_DIR={path}" if folder == path else f"the log folder {folder}"
            raise ConfigError(f"{subject}: not writable ({exc.strerror}); nothing was started; "
                              "allowed: a folder this user can create and write (set DSPARK_STATE_DIR)") from None
    return path


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def save_state(state_dir: Path, state: Deployment) -> None:
    _write_private(state_dir / STATE_FILE, json.dumps(to_data(state), indent=2) + "\n")


def load_state(state_dir: Path) -> Deployment | None:
    """The record, or None when there is none. Fields another launcher version added are ignored;
    a file that is not a record raises StateUnreadable naming it (exit 1)."""
    path = state_dir / STATE_FILE
    try:
        text = path.read_text()
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
        raise StateUnreadable(f"{path}: not a deployment record ({exc}); move it aside if no cluster "
                              "runs from this state folder") from None


def clear_state(state_dir: Path) -> None:
    try:
        (state_dir / STATE_FILE).unlink()
    except FileNotFoundError:
        pass


def ray_token(state_dir: Path, configured: str) -> str:
    """The configured token, else the one generated at first start (kept 0600)."""
    if configured:
        return configured
    path = state_dir / TOKEN_FILE
    if path.is_file():
        return path.read_text().strip()
    token = secrets.token_hex(32)
    _write_private(path, token + "\n")
    return token


@contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """flock on the state folder; a second launcher fails naming the holder's pid."""
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise LockHeld(f"another dspark (pid {holder}) holds {path}; wait for it or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def lock_holder(state_dir: Path) -> str | None:
    """The pid holding the lock, or None when free; never takes it for long or rewrites it."""
    path = state_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)
    return None
