"""The node agent's protocol: one typed request and one typed answer per operation (stdlib only).

Wire (one agent process per call, JSON lines):
  launcher -> agent, one line:  {"protocol": N, "launcher": "x.y.z", "op": NAME, "request": {...}}
  agent -> launcher, any number of progress lines {"progress": {...}}, then exactly one
  {"answer": {...}} or {"failure": {...}}.
The four envelope keys never change meaning. Every request carries both versions and the
agent refuses a mismatch with a failure whose step is "version": a head and a worker from
different launcher releases never start anything. Decoding ignores fields a type does not
declare, so a field added to an answer is read by older launchers as if absent; a new
field in a request needs a default. Bump PROTOCOL_VERSION when a meaning changes.

Adding an operation: a request and an answer dataclass here, one line in OPERATIONS, a
handler in `agent.HANDLERS` (stdlib) or `agent.LAZY_HANDLERS` (heavy imports), and a method
on `client.NodeAgent`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from dspark_launch.model.manifest import Manifest  # stdlib only, as the node checks
from dspark_launch.model.node_check import DiskSpace, VerifyReport
from dspark_launch.cluster.fabric import FabricEnv, FabricRequest  # stdlib-only values
from dspark_launch.profiles.offer import VllmOffer  # stdlib-only values

PROTOCOL_VERSION = 6  # 2: ray_checks no longer runs the version rows and the hotfix (node_versions, apply_hotfix)
# 3: the version row carries the GPU's compute capability and NCCL; the vLLM offer judges KV dtypes per capability
# 3: FabricRequest.hca_list carries NCCL_IB_HCA as written (NCCL's ^ / = / dev:port forms), not split names
# 4: model_verify hashes `only` the files a copy sent, with progress lines
# 5: Stop.drain_s > 0 sends one SIGTERM and waits up to drain_s for the server to drain and end by itself
# 6: scheduler_control writes (or removes) the patched scheduler's control file (issue 24, `dspark reload`)
# The longest line either side reads (the launcher refuses a longer agent reply line: one clear error, the
# agent killed); a log is read in chunks whose JSON (at most 6 bytes a character, `\u001b`) stays below it.
MAX_LINE = 1 << 20
READ_CHUNK = MAX_LINE // 8


# --- values shared by several operations ---------------------------------------------------------

@dataclass(frozen=True)
class Session:
    """A process group we started (its leader's pid = sid), in the boot it was started in."""
    sid: int
    start_time: int
    boot_id: str = ""


@dataclass(frozen=True)
class Process:
    """A process by identity: pid plus start time (and boot), so a reused pid never matches."""
    pid: int
    start_time: int
    sid: int | None = None
    boot_id: str = ""
    cmd: str = ""


@dataclass(frozen=True)
class Progress:
    """A line the CLI's reporter shows while an operation runs on a node."""
    kind: str  # phase | waiting | warn
    message: str
    elapsed: float = 0.0
    timeout: float = 0.0


@dataclass(frozen=True)
class Failure:
    """Why an operation failed; `node` names another node when the head reports on it."""
    step: str
    detail: str
    node: str = ""
    extra: tuple[str, ...] = ()
    config_error: bool = False  # bad configuration (exit 2), e.g. a refused serve argument


Report = Callable[[Progress], None]  # what a handler calls to send a progress line


class OperationFailed(Exception):
    """Raised by a handler for a failure the launcher shows as it is (typed, not a traceback).

    Defined here, not in `agent`, which runs as `__main__`: a handler module importing the agent
    would get a second copy of the class, and the agent would not recognise its raise."""

    def __init__(self, failure: Failure):
        super().__init__(failure.detail)
        self.failure = failure


# --- node operations (stdlib only on the node) ---------------------------------------------------

@dataclass(frozen=True)
class Hello:
    pass


@dataclass(frozen=True)
class HelloAnswer:
    protocol: int
    launcher: str
    hostname: str
    python: str


@dataclass(frozen=True)
class Probe:
    log_dir: str = ""
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
    log_dir_error: str | None = None


@dataclass(frozen=True)
class InterfaceQuery:
    ifname: str
    ip: str


@dataclass(frozen=True)
class InterfaceAnswer:
    exists: bool
    addresses: tuple[str, ...]
    has_ip: bool


@dataclass(frozen=True)
class PortQuery:
    ip: str
    port: int


@dataclass(frozen=True)
class PortAnswer:
    free: bool
    reason: str = ""


@dataclass(frozen=True)
class MemoryQuery:
    pass


@dataclass(frozen=True)
class MemoryAnswer:
    total_bytes: int | None  # MemTotal
    available_bytes: int | None = None  # MemAvailable: what vLLM's start-up gate reads on a GB10
    nvidia_gpu: bool = False  # an NVIDIA GPU is visible (/dev/nvidia0 ...): vLLM runs its CUDA platform


@dataclass(frozen=True)
class Run:
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
class Spawn:
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
class AliveQuery:
    processes: tuple[Process, ...]


@dataclass(frozen=True)
class AliveAnswer:
    alive: tuple[bool, ...]


@dataclass(frozen=True)
class Stop:
    marker: str
    processes: tuple[Process, ...] = ()
    sessions: tuple[Session, ...] = ()
    grace_s: float = 5.0
    drain_s: float = 0.0  # > 0: one SIGTERM, then up to drain_s for the processes to end by themselves


@dataclass(frozen=True)
class StopAnswer:
    stopped: tuple[int, ...]
    left: tuple[int, ...]


@dataclass(frozen=True)
class Tail:
    paths: tuple[str, ...]
    lines: int = 40


@dataclass(frozen=True)
class TailAnswer:
    lines: tuple[str, ...]


@dataclass(frozen=True)
class ReadLog:
    path: str
    offset: int = 0


@dataclass(frozen=True)
class ReadAnswer:
    text: str
    offset: int
    missing: str = ""


@dataclass(frozen=True)
class Glob:
    root: str
    pattern: str


@dataclass(frozen=True)
class GlobAnswer:
    paths: tuple[str, ...]


# --- head operations (the head's agent imports Ray or vLLM for these) -----------------------------

@dataclass(frozen=True)
class ExpectedNode:
    name: str
    ip: str


@dataclass(frozen=True)
class RayNode:
    node_id: str
    ip: str
    alive: bool
    gpus: float = 0.0


@dataclass(frozen=True)
class RayNodesQuery:
    """Ray's own list of nodes (from the GCS; no driver is started)."""
    address: str
    env: dict[str, str] = field(repr=False)


@dataclass(frozen=True)
class RayNodesAnswer:
    nodes: tuple[RayNode, ...]


@dataclass(frozen=True)
class VersionRow:
    """One node's row of the version matrix; every field must be equal on all nodes."""
    python: str | None = None
    vllm: str | None = None
    ray: str | None = None
    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None
    compute_capability: str | None = None  # the GPU's, "12.1" on a GB10 (nvidia-smi); None without a GPU
    nccl: str | None = None  # the NCCL vLLM loads there (VLLM_NCCL_SO_PATH, torch's nvidia-nccl wheel, the system's)
    dspark_launch: str | None = None
    scheduler_sha256: str | None = None
    hostname: str | None = None  # shown, not compared
    image: str | None = None  # the node container's image id (DSPARK_RUNTIME=docker|podman); None on a host


@dataclass(frozen=True)
class HotfixResult:
    """The part of the hotfix tool's result the launcher reads (hotfix.Result has more)."""
    action: str
    code: int
    state: str
    message: str
    vllm_version: str = ""
    patch_version: int | None = None


@dataclass(frozen=True)
class HotfixReport:
    hostname: str
    apply: HotfixResult
    status: HotfixResult

    @property
    def failed(self) -> HotfixResult | None:
        return self.apply if self.apply.code != 0 else (self.status if self.status.code != 0 else None)


@dataclass(frozen=True)
class RayChecks:
    """On the head, from the GCS's node table (no driver): wait until every node joined Ray once,
    then check each one's registered IP and GPUs. Streams progress."""
    address: str
    env: dict[str, str] = field(repr=False)
    nodes: tuple[ExpectedNode, ...]
    gpus_per_node: int
    join_timeout_s: float
    ignore_node_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class RayChecksAnswer:
    nodes: tuple[RayNode, ...]  # as Ray registered them, in the order of the request's nodes


@dataclass(frozen=True)
class ServeArgsCheck:
    """The `vllm serve` arguments (model first) through the installed vLLM's own parser."""
    serve_args: tuple[str, ...]


@dataclass(frozen=True)
class ServeArgsAnswer:
    refused: str | None  # vLLM's reason, or None when accepted


# --- model weights (issue 12): node_check run on the node ----------------------------------------

@dataclass(frozen=True)
class ModelVerify:
    """Every file of `manifest` in `folder`: sizes, and with `full` each sha256 (`only`: of those files alone)."""
    folder: str
    manifest: Manifest
    full: bool
    only: tuple[str, ...] | None = None
    caches: tuple[str, ...] = ()  # cache folders checked like the model folder (model.folder_check)


@dataclass(frozen=True)
class ModelFastCheck:
    """The start pre-flight: the folder and caches safe (model.folder_check), this node's manifest has
    `stamp`, every file its size, every file but the tensor shards its sha256."""
    folder: str
    stamp: str
    caches: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelDiskQuery:
    path: str


# --- Ray's private temp folders (security review, issue 14) --------------------------------------

@dataclass(frozen=True)
class RayTempDir:
    """Prepare Ray's temp folder `name` in this user's private folder (and forget `ray start`'s last
    address there)."""
    name: str


@dataclass(frozen=True)
class RayTempDirAnswer:
    path: str


# --- model profile and fabric (issue 11) ------------------------------------------------------------

@dataclass(frozen=True)
class DescribeVllm:
    """The installed vLLM's serve parser as data (head: imports vLLM, seconds; a repeat for the same
    install is answered from the node's private folder, see offer_cache)."""
    keep: bool = True  # False in a container: recreated on every start, nothing kept there would be read


@dataclass(frozen=True)
class DescribeVllmAnswer:
    offer: VllmOffer


@dataclass(frozen=True)
class FabricQuery:
    """One node's fabric environment from its sysfs."""
    request: FabricRequest
    sysfs_root: str = ""  # tests only (DSPARK_TEST_SYSFS_ROOT forwarded by the launcher): a fake sysfs tree


@dataclass(frozen=True)
class FabricAnswer:
    fabric: FabricEnv


@dataclass(frozen=True)
class NonCarryOver:
    """Head: write vLLM's list of variables it must not copy from the driver to its Ray workers."""
    config_root: str


@dataclass(frozen=True)
class NonCarryOverAnswer:
    path: str


# --- each node's version row and hotfix, on its own agent (launch time) --------------------------

@dataclass(frozen=True)
class VersionQuery:
    """This node's row of the version matrix (files and metadata only: nothing imported)."""


@dataclass(frozen=True)
class HotfixApply:
    """Apply the scheduler hotfix to the vLLM this node's interpreter (Ray's) imports, then verify it."""


# --- the scheduler's live values (issue 24, `dspark reload`) -------------------------------------

@dataclass(frozen=True)
class SchedulerControl:
    """Replace the patched scheduler's control file at `path` by `text` (a new 0600 file of the serving
    user renamed over it, in a folder only that user can write), or remove it (`remove`)."""
    path: str
    text: str = ""
    remove: bool = False


@dataclass(frozen=True)
class SchedulerControlAnswer:
    path: str
    existed: bool  # a file was there before


OPERATIONS: dict[str, tuple[type, type]] = {
    "hello": (Hello, HelloAnswer),
    "probe": (Probe, ProbeAnswer),
    "interface": (InterfaceQuery, InterfaceAnswer),
    "port_free": (PortQuery, PortAnswer),
    "meminfo": (MemoryQuery, MemoryAnswer),
    "run": (Run, RunAnswer),
    "spawn": (Spawn, SpawnAnswer),
    "alive": (AliveQuery, AliveAnswer),
    "stop": (Stop, StopAnswer),
    "tail": (Tail, TailAnswer),
    "read": (ReadLog, ReadAnswer),
    "glob": (Glob, GlobAnswer),
    "ray_nodes": (RayNodesQuery, RayNodesAnswer),
    "ray_checks": (RayChecks, RayChecksAnswer),
    "check_serve_args": (ServeArgsCheck, ServeArgsAnswer),
    # model weights (issue 12)
    "model_verify": (ModelVerify, VerifyReport),
    "model_fast_check": (ModelFastCheck, VerifyReport),
    "model_free_space": (ModelDiskQuery, DiskSpace),
    # --- Ray's private temp folders (security review, issue 14)
    "ray_temp_dir": (RayTempDir, RayTempDirAnswer),
    # model profile and fabric (issue 11)
    "describe_vllm": (DescribeVllm, DescribeVllmAnswer),
    "fabric_env": (FabricQuery, FabricAnswer),
    "non_carry_over": (NonCarryOver, NonCarryOverAnswer),
    # each node's version row and hotfix, on its own agent (launch time)
    "node_versions": (VersionQuery, VersionRow),
    "apply_hotfix": (HotfixApply, HotfixReport),
    # the scheduler's live values (issue 24)
    "scheduler_control": (SchedulerControl, SchedulerControlAnswer),
}

OP_OF_REQUEST: dict[type, str] = {request: name for name, (request, _) in OPERATIONS.items()}
