"""The node agent's protocol: every value either end sends, frozen and typed, and the one registry of operations.

Stdlib only (and the node's values, `node/values.py`, which it carries as they are). The messages themselves live
in `messages/`, a module per handler subject, and are read here as `protocol.Name`: a module is imported on first
use, so an agent process defines the few dataclasses of its own operation, not all of them (each frozen dataclass
costs about a millisecond to define; the agent runs once per call, thousands of times a test run).

Wire (one agent process per call, JSON lines):
  launcher -> agent, one line:  {"protocol": N, "launcher": "x.y.z", "op": NAME, "request": {...}}
  agent -> launcher, any number of progress lines {"progress": {...}}, then exactly one
  {"answer": {...}} or {"failure": {...}}.
The four envelope keys never change meaning. Every request carries both versions and the
agent refuses a mismatch with a failure whose step is "version": a head and a worker from
different launcher releases never start anything. Decoding ignores fields a type does not
declare, so a field added to an answer is read by older launchers as if absent; a new
field in a request needs a default. Bump PROTOCOL_VERSION when a meaning changes.

Adding an operation touches three places: in `messages/<subject>.py` an answer dataclass and a request dataclass
deriving `Request["ItsAnswer"]` (so `NodeAgent.call` returns that type to the type checker); here one `Operation`
line in `_OPERATIONS` (the operation's name is the request's class name in snake case) and both names in the
type checker's imports below; and the handler `def name(req, report) -> Answer` in the `handlers/` module of its
subject.
Callers send it with `NodeAgent.call(Request(...))`.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Final, Generic, Literal, TypeVar

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


# --- the one registry ------------------------------------------------------------------------------

AGENT_TIMEOUT_S = 60
HOTFIX_TIMEOUT_S = 120
MODEL_VERIFY_TIMEOUT_S = 3 * 3600  # a full sha256 of 160 GB reads every byte (minutes at disk speed)


@dataclass(frozen=True)
class Operation:
    """One agent operation: its request and answer types, its handler and how the launcher waits for it."""

    request_name: str  # its request's class, declared in messages/<subject>.py
    answer_name: str  # its answer's class, there too (or a node value that module imports)
    subject: str  # its modules in dspark_launch.agent.messages and .handlers, imported by the agent only when called;
    # the handler is that module's function named as the operation (`memory_query` -> handlers/processes.memory_query)
    step: str  # names the step in the launcher's error line
    timeout: float | Callable[[Any], float] = AGENT_TIMEOUT_S  # seconds, or a function of the request
    # Read-only, stdlib, independent of the environment: answered in the launcher's own process when the node's
    # agent would be this machine's and this interpreter (client.NodeAgent), no agent process started.
    in_process: bool = False

    @property
    def name(self) -> str:
        return op_name(self.request_name)

    @property
    def request(self) -> type:
        found: type = _message(self.subject, self.request_name)
        return found

    @property
    def answer(self) -> type:
        found: type = _message(self.subject, self.answer_name)
        return found

    def timeout_for(self, request: Any) -> float:
        return self.timeout(request) if callable(self.timeout) else self.timeout


def op_name(request_type: type | str) -> str:
    """The operation's name on the wire: its request's class name in snake case (ReadLog -> read_log)."""
    name = request_type if isinstance(request_type, str) else request_type.__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def operation_of(request: object) -> Operation:
    """The registered operation whose request `request` is."""
    return OPERATIONS[op_name(type(request))]


def _message(subject: str, name: str) -> Any:
    return getattr(importlib.import_module(f"dspark_launch.agent.messages.{subject}"), name)


_OPERATIONS = (
    # processes and the node itself (handlers/processes.py)
    Operation("Hello", "HelloAnswer", "processes", "agent", 30),
    Operation("Probe", "ProbeAnswer", "processes", "agent"),
    Operation("MemoryQuery", "MemoryAnswer", "processes", "memory"),
    Operation("PlatformQuery", "PlatformFacts", "platform", "platform", in_process=True),
    Operation("Run", "RunAnswer", "processes", "run"),
    Operation("Spawn", "SpawnAnswer", "processes", "spawn"),
    Operation("ServeGo", "ServeGoAnswer", "processes", "serve go"),
    Operation("AliveQuery", "AliveAnswer", "processes", "status", 30, in_process=True),
    Operation("Stop", "StopAnswer", "processes", "stop", lambda req: 90 + req.drain_s),
    # files and logs (handlers/files.py)
    Operation("PrepareLogDir", "PrepareLogDirAnswer", "files", "log folder"),
    Operation("Tail", "TailAnswer", "files", "logs", in_process=True),
    Operation("ReadLog", "ReadLogAnswer", "files", "logs", in_process=True),
    Operation("Glob", "GlobAnswer", "files", "logs"),
    # Ray (handlers/ray.py; the head's node table imports Ray when called)
    Operation("PortQuery", "PortAnswer", "ray", "ray port"),
    Operation("PortHolderQuery", "PortHolderAnswer", "ray", "port holder", in_process=True),
    Operation("RayTempDir", "RayTempDirAnswer", "ray", "ray temp folder"),
    Operation("RayNodesQuery", "RayNodesAnswer", "ray", "ray nodes", 20),
    Operation("RayChecks", "RayChecksAnswer", "ray", "ray checks"),
    # vLLM (handlers/vllm.py; imports vLLM when called)
    Operation("DescribeVllm", "DescribeVllmAnswer", "vllm", "installed vLLM", 300),
    # fabric (handlers/fabric.py)
    Operation("InterfaceQuery", "InterfaceAnswer", "fabric", "fabric interface"),
    Operation("FabricQuery", "FabricAnswer", "fabric", "fabric"),
    Operation("NonCarryOver", "NonCarryOverAnswer", "fabric", "vLLM config folder"),
    # model weights (handlers/model.py)
    Operation(
        "ModelVerify", "VerifyReport", "model", "model verify", lambda req: MODEL_VERIFY_TIMEOUT_S if req.full else 120
    ),
    Operation("ModelFastCheck", "VerifyReport", "model", "model check", 120),
    Operation("ModelPlacementQuery", "NodePlacement", "model", "model disk", 120),
    # version row and scheduler hotfix (handlers/hotfix.py)
    Operation("VersionQuery", "VersionRow", "hotfix", "versions"),
    Operation("HotfixApply", "HotfixApplyAnswer", "hotfix", "hotfix", HOTFIX_TIMEOUT_S),
    Operation("HotfixCheck", "HotfixCheckAnswer", "hotfix", "hotfix check", HOTFIX_TIMEOUT_S),
    Operation("HotfixRevert", "HotfixRevertAnswer", "hotfix", "hotfix", HOTFIX_TIMEOUT_S),
    # the scheduler's live values (handlers/control.py)
    Operation("SchedulerControl", "SchedulerControlAnswer", "control", "scheduler control file"),
)
OPERATIONS: dict[str, Operation] = {operation.name: operation for operation in _OPERATIONS}

#: The messages no operation names as its request or answer, and the module each is declared in.
_PARTS: dict[str, str] = {
    "ModuleInfo": "processes",
    "DrainEnd": "processes",
    "DRAIN_OUTCOMES": "processes",
    "PortListener": "ray",
    "ExpectedNode": "ray",
    "RayNode": "ray",
    "HotfixResult": "hotfix",
}
#: Where `protocol.Name` is declared: each operation's request and answer in its subject's messages module.
DECLARED_IN: dict[str, str] = {
    **{name: op.subject for op in _OPERATIONS for name in (op.request_name, op.answer_name)},
    **_PARTS,
}


def __getattr__(name: str) -> Any:
    """`protocol.Name` for a message: its module imported now (once; the name then stays here)."""
    subject = DECLARED_IN.get(name)
    if subject is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = _message(subject, name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # the same names for the type checker (tests/test_agent_protocol.py: as DECLARED_IN says)
    from dspark_launch.agent.messages.control import SchedulerControl as SchedulerControl
    from dspark_launch.agent.messages.control import SchedulerControlAnswer as SchedulerControlAnswer
    from dspark_launch.agent.messages.fabric import (
        FabricAnswer as FabricAnswer,
    )
    from dspark_launch.agent.messages.fabric import (
        FabricQuery as FabricQuery,
    )
    from dspark_launch.agent.messages.fabric import (
        InterfaceAnswer as InterfaceAnswer,
    )
    from dspark_launch.agent.messages.fabric import (
        InterfaceQuery as InterfaceQuery,
    )
    from dspark_launch.agent.messages.fabric import (
        NonCarryOver as NonCarryOver,
    )
    from dspark_launch.agent.messages.fabric import (
        NonCarryOverAnswer as NonCarryOverAnswer,
    )
    from dspark_launch.agent.messages.files import (
        Glob as Glob,
    )
    from dspark_launch.agent.messages.files import (
        GlobAnswer as GlobAnswer,
    )
    from dspark_launch.agent.messages.files import (
        PrepareLogDir as PrepareLogDir,
    )
    from dspark_launch.agent.messages.files import (
        PrepareLogDirAnswer as PrepareLogDirAnswer,
    )
    from dspark_launch.agent.messages.files import (
        ReadLog as ReadLog,
    )
    from dspark_launch.agent.messages.files import (
        ReadLogAnswer as ReadLogAnswer,
    )
    from dspark_launch.agent.messages.files import (
        Tail as Tail,
    )
    from dspark_launch.agent.messages.files import (
        TailAnswer as TailAnswer,
    )
    from dspark_launch.agent.messages.hotfix import (
        HotfixApply as HotfixApply,
    )
    from dspark_launch.agent.messages.hotfix import (
        HotfixApplyAnswer as HotfixApplyAnswer,
    )
    from dspark_launch.agent.messages.hotfix import (
        HotfixCheck as HotfixCheck,
    )
    from dspark_launch.agent.messages.hotfix import (
        HotfixCheckAnswer as HotfixCheckAnswer,
    )
    from dspark_launch.agent.messages.hotfix import (
        HotfixResult as HotfixResult,
    )
    from dspark_launch.agent.messages.hotfix import (
        HotfixRevert as HotfixRevert,
    )
    from dspark_launch.agent.messages.hotfix import (
        HotfixRevertAnswer as HotfixRevertAnswer,
    )
    from dspark_launch.agent.messages.hotfix import (
        VersionQuery as VersionQuery,
    )
    from dspark_launch.agent.messages.hotfix import (
        VersionRow as VersionRow,
    )
    from dspark_launch.agent.messages.model import (
        ModelFastCheck as ModelFastCheck,
    )
    from dspark_launch.agent.messages.model import (
        ModelPlacementQuery as ModelPlacementQuery,
    )
    from dspark_launch.agent.messages.model import (
        ModelVerify as ModelVerify,
    )
    from dspark_launch.agent.messages.model import (
        NodePlacement as NodePlacement,
    )
    from dspark_launch.agent.messages.model import (
        VerifyReport as VerifyReport,
    )
    from dspark_launch.agent.messages.platform import PlatformFacts as PlatformFacts
    from dspark_launch.agent.messages.platform import PlatformQuery as PlatformQuery
    from dspark_launch.agent.messages.processes import (
        DRAIN_OUTCOMES as DRAIN_OUTCOMES,
    )
    from dspark_launch.agent.messages.processes import (
        AliveAnswer as AliveAnswer,
    )
    from dspark_launch.agent.messages.processes import (
        AliveQuery as AliveQuery,
    )
    from dspark_launch.agent.messages.processes import (
        DrainEnd as DrainEnd,
    )
    from dspark_launch.agent.messages.processes import (
        Hello as Hello,
    )
    from dspark_launch.agent.messages.processes import (
        HelloAnswer as HelloAnswer,
    )
    from dspark_launch.agent.messages.processes import (
        MemoryAnswer as MemoryAnswer,
    )
    from dspark_launch.agent.messages.processes import (
        MemoryQuery as MemoryQuery,
    )
    from dspark_launch.agent.messages.processes import (
        ModuleInfo as ModuleInfo,
    )
    from dspark_launch.agent.messages.processes import (
        Probe as Probe,
    )
    from dspark_launch.agent.messages.processes import (
        ProbeAnswer as ProbeAnswer,
    )
    from dspark_launch.agent.messages.processes import (
        Run as Run,
    )
    from dspark_launch.agent.messages.processes import (
        RunAnswer as RunAnswer,
    )
    from dspark_launch.agent.messages.processes import (
        ServeGo as ServeGo,
    )
    from dspark_launch.agent.messages.processes import (
        ServeGoAnswer as ServeGoAnswer,
    )
    from dspark_launch.agent.messages.processes import (
        Spawn as Spawn,
    )
    from dspark_launch.agent.messages.processes import (
        SpawnAnswer as SpawnAnswer,
    )
    from dspark_launch.agent.messages.processes import (
        Stop as Stop,
    )
    from dspark_launch.agent.messages.processes import (
        StopAnswer as StopAnswer,
    )
    from dspark_launch.agent.messages.ray import (
        ExpectedNode as ExpectedNode,
    )
    from dspark_launch.agent.messages.ray import (
        PortAnswer as PortAnswer,
    )
    from dspark_launch.agent.messages.ray import (
        PortHolderAnswer as PortHolderAnswer,
    )
    from dspark_launch.agent.messages.ray import (
        PortHolderQuery as PortHolderQuery,
    )
    from dspark_launch.agent.messages.ray import (
        PortListener as PortListener,
    )
    from dspark_launch.agent.messages.ray import (
        PortQuery as PortQuery,
    )
    from dspark_launch.agent.messages.ray import (
        RayChecks as RayChecks,
    )
    from dspark_launch.agent.messages.ray import (
        RayChecksAnswer as RayChecksAnswer,
    )
    from dspark_launch.agent.messages.ray import (
        RayNode as RayNode,
    )
    from dspark_launch.agent.messages.ray import (
        RayNodesAnswer as RayNodesAnswer,
    )
    from dspark_launch.agent.messages.ray import (
        RayNodesQuery as RayNodesQuery,
    )
    from dspark_launch.agent.messages.ray import (
        RayTempDir as RayTempDir,
    )
    from dspark_launch.agent.messages.ray import (
        RayTempDirAnswer as RayTempDirAnswer,
    )
    from dspark_launch.agent.messages.vllm import DescribeVllm as DescribeVllm
    from dspark_launch.agent.messages.vllm import DescribeVllmAnswer as DescribeVllmAnswer
