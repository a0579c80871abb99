"""The node agent's protocol: every value either end sends, frozen and typed, and the one registry of operations.

Stdlib only (and the node's values, `node/values.py`, which it carries as they are).

Wire (one agent process per call, JSON lines):
  launcher -> agent, one line:  {"protocol": N, "launcher": "x.y.z", "op": NAME, "request": {...}}
  agent -> launcher, any number of progress lines {"progress": {...}}, then exactly one
  {"answer": {...}} or {"failure": {...}}.
The four envelope keys never change meaning. Every request carries both versions and the
agent refuses a mismatch with a failure whose step is "version": a head and a worker from
different launcher releases never start anything. Decoding ignores fields a type does not
declare, so a field added to an answer is read by older launchers as if absent; a new
field in a request needs a default. Bump PROTOCOL_VERSION when a meaning changes.

Adding an operation touches two places: here, an answer dataclass, a request dataclass deriving
`Request["ItsAnswer"]` (so `NodeAgent.call` returns that type to the type checker) and one
`Operation` line in `_OPERATIONS` (the operation's name is the request's class name in snake case);
and the handler `def name(req, report) -> Answer` in the `handlers/` module of its subject.
Callers send it with `NodeAgent.call(Request(...))`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Final, Generic, Literal, TypeVar

from dspark_launch.node.values import (
    FabricEnv,
    FabricRequest,
    Manifest,
    NodePlacement,
    PlatformFacts,
    VerifyReport,
    VersionRow,
    VllmOffer,
)

PROTOCOL_VERSION = 11  # 2: ray_checks no longer runs the version rows and the hotfix (node_versions, apply_hotfix)
# 3: the version row carries the GPU's compute capability and NCCL; the vLLM offer judges KV dtypes per capability
# 3: FabricRequest.hca_list carries NCCL_IB_HCA as written (NCCL's ^ / = / dev:port forms), not split names
# 4: model_verify hashes `only` the files a copy sent, with progress lines
# 5: Stop.drain_s > 0 sends one SIGTERM and waits up to drain_s for the server to drain and end by itself
# 6: every operation named after its request (read -> read_log, meminfo -> memory_query, ...); probe is read-only,
#    prepare_log_dir makes the log folder
# 7: model_placement_query (sizes, free space and the verified stamp in one call) replaces model_disk_query;
#    scheduler_control writes (or removes) the patched scheduler's control file (`dspark reload`)
# 8: Stop.drain_end: a drain is over when the server's log says so (an idle one at once); StopAnswer.drain says how
# 9: port_holder_query (who holds a port, before a secret goes to it); Ray queries carry the recorded Ray processes
# 10: hotfix_check (read-only: would start's apply go ahead; `dspark plan`), hotfix_revert (DSPARK_HOTFIX=off)
# 11: platform_query (kernel, CmaTotal, NVIDIA driver and modules, ConnectX firmware and ports, memlock: the platform
#     pre-flight); memory_query reads a given procfs root and answers the memory pressure (PSI)
# The longest line either side reads (the launcher refuses a longer agent reply line: one clear error, the
# agent killed); a log is read in chunks whose JSON (at most 6 bytes a character, `\u001b`) stays below it.
MAX_LINE = 1 << 20
READ_CHUNK = MAX_LINE // 8

AnswerT = TypeVar("AnswerT")


class Request(Generic[AnswerT]):
    """Every request's base: `class Probe(Request["ProbeAnswer"])` types what `NodeAgent.call` returns for it.
    The registry below pairs the same two (`tests/test_protocol_types.py` checks that they agree)."""

    __slots__ = ()


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


ProgressKind = Literal["phase", "waiting", "warn"]
#: `Failure.step` names the step for the operator (free text); this one value means "another launcher
#: or protocol version": the launcher raises VersionMismatch for it.
VERSION_STEP: Final = "version"


@dataclass(frozen=True)
class Progress:
    """A line the CLI's reporter shows while an operation runs on a node."""

    kind: ProgressKind
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
class PrepareLogDir(Request["PrepareLogDirAnswer"]):
    """Make (or find) the private log folder `path` and write to it once."""

    path: str


@dataclass(frozen=True)
class PrepareLogDirAnswer:
    error: str | None  # why it is not a private folder this user writes to, naming it; None when it is


@dataclass(frozen=True)
class InterfaceQuery(Request["InterfaceAnswer"]):
    ifname: str
    ip: str


@dataclass(frozen=True)
class InterfaceAnswer:
    exists: bool
    addresses: tuple[str, ...]
    has_ip: bool


@dataclass(frozen=True)
class PortQuery(Request["PortAnswer"]):
    ip: str
    port: int


@dataclass(frozen=True)
class PortAnswer:
    free: bool
    reason: str = ""


@dataclass(frozen=True)
class PortHolderQuery(Request["PortHolderAnswer"]):
    """Who holds the listening sockets a connection to ip:port lands on (agent/port_holder.py): asked
    before anything that carries the Ray token or an API key is sent there."""

    ip: str
    port: int
    processes: tuple[Process, ...]  # the recorded holders; their descendants count as theirs


@dataclass(frozen=True)
class PortListener:
    address: str  # ip:port as the socket is bound
    pid: int | None  # None: a process this agent cannot see (another user's, another PID namespace)
    uid: int
    user: str

    @property
    def line(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "a process this node's agent cannot see"
        return f"{who} (user {self.user}) listening on {self.address}"


@dataclass(frozen=True)
class PortHolderAnswer:
    OURS, NONE, GONE, FOREIGN = "ours", "none", "gone", "foreign"
    verdict: str
    recorded_alive: bool
    listeners: tuple[PortListener, ...] = ()  # the foreign ones
    sockets: tuple[int, ...] = ()  # OURS: the inodes of the listening sockets a connection lands on

    @property
    def ours(self) -> bool:
        return self.verdict == self.OURS

    @property
    def foreign(self) -> str:
        """One phrase naming the foreign listeners; "" when there is none."""
        return "; ".join(listener.line for listener in self.listeners)


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
class PlatformQuery(Request["PlatformFacts"]):
    """The node's kernel, CmaTotal, NVIDIA driver and modules, RDMA devices' firmware and ports, memlock
    (node/platform.py); the roots: tests only (DSPARK_TEST_* forwarded by the launcher), fake trees."""

    procfs_root: str = ""
    sysfs_root: str = ""
    modules_root: str = ""


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


@dataclass(frozen=True)
class Tail(Request["TailAnswer"]):
    paths: tuple[str, ...]
    lines: int = 40


@dataclass(frozen=True)
class TailAnswer:
    lines: tuple[str, ...]


@dataclass(frozen=True)
class ReadLog(Request["ReadLogAnswer"]):
    path: str
    offset: int = 0


@dataclass(frozen=True)
class ReadLogAnswer:
    text: str
    offset: int
    missing: str = ""


@dataclass(frozen=True)
class Glob(Request["GlobAnswer"]):
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
class RayNodesQuery(Request["RayNodesAnswer"]):
    """Ray's own list of nodes (from the GCS; no driver is started), asked only when the GCS port is held by
    one of `holders` (the head's recorded Ray processes): the token goes to no one else."""

    address: str
    env: dict[str, str] = field(repr=False)
    holders: tuple[Process, ...] = ()


@dataclass(frozen=True)
class RayNodesAnswer:
    nodes: tuple[RayNode, ...]
    port: PortHolderAnswer | None = None  # who held the GCS port; `nodes` is empty unless it was ours


@dataclass(frozen=True)
class HotfixResult:
    """The part of the hotfix tool's result the launcher reads (hotfix.Result has more)."""

    action: str
    code: int
    state: str
    message: str
    vllm_version: str = ""
    patch_version: int | None = None
    applied_patch_version: int | None = None  # the patch version a marker in the file names (ours left there)
    changed: bool = False  # the action wrote the file


@dataclass(frozen=True)
class HotfixApplyAnswer:
    hostname: str
    apply: HotfixResult
    status: HotfixResult

    @property
    def failed(self) -> HotfixResult | None:
        return self.apply if self.apply.code != 0 else (self.status if self.status.code != 0 else None)


@dataclass(frozen=True)
class HotfixCheckAnswer:
    hostname: str
    check: HotfixResult  # code 0 (state not-applied, applied or outdated): start's apply would go ahead


@dataclass(frozen=True)
class HotfixRevertAnswer:
    hostname: str
    revert: HotfixResult  # code 0: reverted, or nothing of ours to revert
    status: HotfixResult  # the file afterwards


@dataclass(frozen=True)
class RayChecks(Request["RayChecksAnswer"]):
    """On the head, from the GCS's node table (no driver): wait until every node joined Ray once,
    then check each one's registered IP and GPUs. Streams progress."""

    address: str
    env: dict[str, str] = field(repr=False)
    nodes: tuple[ExpectedNode, ...]
    gpus_per_node: int
    join_timeout_s: float
    ignore_node_ids: tuple[str, ...] = ()
    holders: tuple[Process, ...] = ()  # the head's recorded Ray processes: the GCS's port must be theirs


@dataclass(frozen=True)
class RayChecksAnswer:
    nodes: tuple[RayNode, ...]  # as Ray registered them, in the order of the request's nodes


# --- model weights: agent.model_files run on the node ----------------------------------------


@dataclass(frozen=True)
class ModelVerify(Request["VerifyReport"]):
    """Every file of `manifest` in `folder`: sizes, and with `full` each sha256 (`only`: of those files alone)."""

    folder: str
    manifest: Manifest
    full: bool
    only: tuple[str, ...] | None = None
    caches: tuple[str, ...] = ()  # cache folders checked like the model folder (agent.model_folder)


@dataclass(frozen=True)
class ModelFastCheck(Request["VerifyReport"]):
    """The start pre-flight: the folder and caches safe (agent.model_folder), this node's manifest has
    `stamp`, every file its size, every file but the tensor shards its sha256."""

    folder: str
    stamp: str
    caches: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelPlacementQuery(Request["NodePlacement"]):
    """Before a copy, in one round trip: the folder and caches safe (agent.model_folder), every file of
    `manifest` in `folder` its size, the free space under `root`, the stamp this node last verified."""

    folder: str
    root: str
    manifest: Manifest
    caches: tuple[str, ...] = ()


# --- Ray's private temp folders (security review) --------------------------------------


@dataclass(frozen=True)
class RayTempDir(Request["RayTempDirAnswer"]):
    """Prepare Ray's temp folder `name` in this user's private folder (and forget `ray start`'s last
    address there)."""

    name: str


@dataclass(frozen=True)
class RayTempDirAnswer:
    path: str


# --- model profile and fabric ------------------------------------------------------------


@dataclass(frozen=True)
class DescribeVllm(Request["DescribeVllmAnswer"]):
    """The installed vLLM's serve parser as data (head: imports vLLM, seconds; a repeat for the same
    install is answered from the node's private folder, see offer_cache)."""

    keep: bool = True  # False in a container: recreated on every start, nothing kept there would be read
    config_path: str = ""  # the placed model's config.json for the dry boot; "" the profile's shipped copy


@dataclass(frozen=True)
class DescribeVllmAnswer:
    offer: VllmOffer


@dataclass(frozen=True)
class FabricQuery(Request["FabricAnswer"]):
    """One node's fabric environment from its sysfs."""

    request: FabricRequest
    sysfs_root: str = ""  # tests only (DSPARK_TEST_SYSFS_ROOT forwarded by the launcher): a fake sysfs tree


@dataclass(frozen=True)
class FabricAnswer:
    fabric: FabricEnv


@dataclass(frozen=True)
class NonCarryOver(Request["NonCarryOverAnswer"]):
    """Head: write vLLM's list of variables it must not copy from the driver to its Ray workers."""

    config_root: str


@dataclass(frozen=True)
class NonCarryOverAnswer:
    path: str


# --- each node's version row and hotfix, on its own agent (launch time) --------------------------


@dataclass(frozen=True)
class VersionQuery(Request["VersionRow"]):
    """This node's row of the version matrix (files and metadata only: nothing imported)."""


@dataclass(frozen=True)
class HotfixApply(Request["HotfixApplyAnswer"]):
    """Apply the scheduler hotfix to the vLLM this node's interpreter (Ray's) imports, then verify it."""


@dataclass(frozen=True)
class HotfixCheck(Request["HotfixCheckAnswer"]):
    """Read-only: the hotfix tool's `check` on the scheduler this node's interpreter (Ray's) imports, the verdict
    start's apply would reach (`dspark plan`)."""


@dataclass(frozen=True)
class HotfixRevert(Request["HotfixRevertAnswer"]):
    """DSPARK_HOTFIX=off: our patch, where an earlier start left it, reverted from the original its marker keeps
    (nothing else written), then the file's status: the node serves vLLM's own scheduler."""


# --- the one registry ------------------------------------------------------------------------------

AGENT_TIMEOUT_S = 60
HOTFIX_TIMEOUT_S = 120
MODEL_VERIFY_TIMEOUT_S = 3 * 3600  # a full sha256 of 160 GB reads every byte (minutes at disk speed)


@dataclass(frozen=True)
class Operation:
    """One agent operation: its request and answer types, its handler and how the launcher waits for it."""

    request: type
    answer: type
    subject: str  # its module in dspark_launch.agent.handlers, imported by the agent only when called; the
    # handler is that module's function named as the operation (`memory_query` -> handlers/processes.memory_query)
    step: str  # names the step in the launcher's error line
    timeout: float | Callable[[Any], float] = AGENT_TIMEOUT_S  # seconds, or a function of the request
    # Read-only, stdlib, independent of the environment: answered in the launcher's own process when the node's
    # agent would be this machine's and this interpreter (client.NodeAgent), no agent process started.
    in_process: bool = False

    @property
    def name(self) -> str:
        return op_name(self.request)

    def timeout_for(self, request: Any) -> float:
        return self.timeout(request) if callable(self.timeout) else self.timeout


def op_name(request_type: type) -> str:
    """The operation's name on the wire: its request's class name in snake case (ReadLog -> read_log)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", request_type.__name__).lower()


# --- the scheduler's live values (`dspark reload`) ------------------------------------------------


@dataclass(frozen=True)
class SchedulerControl(Request["SchedulerControlAnswer"]):
    """Replace the patched scheduler's control file at `path` by `text` (a new 0600 file of the serving
    user renamed over it, in a folder only that user can write), or remove it (`remove`)."""

    path: str
    text: str = ""
    remove: bool = False


@dataclass(frozen=True)
class SchedulerControlAnswer:
    path: str
    existed: bool  # a file was there before


_OPERATIONS = (
    # processes and the node itself (handlers/processes.py)
    Operation(Hello, HelloAnswer, "processes", "agent", 30),
    Operation(Probe, ProbeAnswer, "processes", "agent"),
    Operation(MemoryQuery, MemoryAnswer, "processes", "memory"),
    Operation(PlatformQuery, PlatformFacts, "platform", "platform", in_process=True),
    Operation(Run, RunAnswer, "processes", "run"),
    Operation(Spawn, SpawnAnswer, "processes", "spawn"),
    Operation(ServeGo, ServeGoAnswer, "processes", "serve go"),
    Operation(AliveQuery, AliveAnswer, "processes", "status", 30, in_process=True),
    Operation(Stop, StopAnswer, "processes", "stop", lambda req: 90 + req.drain_s),
    # files and logs (handlers/files.py)
    Operation(PrepareLogDir, PrepareLogDirAnswer, "files", "log folder"),
    Operation(Tail, TailAnswer, "files", "logs", in_process=True),
    Operation(ReadLog, ReadLogAnswer, "files", "logs", in_process=True),
    Operation(Glob, GlobAnswer, "files", "logs"),
    # Ray (handlers/ray.py; the head's node table imports Ray when called)
    Operation(PortQuery, PortAnswer, "ray", "ray port"),
    Operation(PortHolderQuery, PortHolderAnswer, "ray", "port holder", in_process=True),
    Operation(RayTempDir, RayTempDirAnswer, "ray", "ray temp folder"),
    Operation(RayNodesQuery, RayNodesAnswer, "ray", "ray nodes", 20),
    Operation(RayChecks, RayChecksAnswer, "ray", "ray checks"),
    # vLLM (handlers/vllm.py; imports vLLM when called)
    Operation(DescribeVllm, DescribeVllmAnswer, "vllm", "installed vLLM", 300),
    # fabric (handlers/fabric.py)
    Operation(InterfaceQuery, InterfaceAnswer, "fabric", "fabric interface"),
    Operation(FabricQuery, FabricAnswer, "fabric", "fabric"),
    Operation(NonCarryOver, NonCarryOverAnswer, "fabric", "vLLM config folder"),
    # model weights (handlers/model.py)
    Operation(
        ModelVerify, VerifyReport, "model", "model verify", lambda req: MODEL_VERIFY_TIMEOUT_S if req.full else 120
    ),
    Operation(ModelFastCheck, VerifyReport, "model", "model check", 120),
    Operation(ModelPlacementQuery, NodePlacement, "model", "model disk", 120),
    # version row and scheduler hotfix (handlers/hotfix.py)
    Operation(VersionQuery, VersionRow, "hotfix", "versions"),
    Operation(HotfixApply, HotfixApplyAnswer, "hotfix", "hotfix", HOTFIX_TIMEOUT_S),
    Operation(HotfixCheck, HotfixCheckAnswer, "hotfix", "hotfix check", HOTFIX_TIMEOUT_S),
    Operation(HotfixRevert, HotfixRevertAnswer, "hotfix", "hotfix", HOTFIX_TIMEOUT_S),
    # the scheduler's live values (handlers/control.py)
    Operation(SchedulerControl, SchedulerControlAnswer, "control", "scheduler control file"),
)
OPERATIONS: dict[str, Operation] = {operation.name: operation for operation in _OPERATIONS}
OPERATION_OF_REQUEST: dict[type, Operation] = {operation.request: operation for operation in _OPERATIONS}
