"""Ray's ports, temp folders and node table (handlers/ray.py; the head's node table imports Ray when asked)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark_launch.agent.protocol import Process, Request


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


@dataclass(frozen=True)
class RayTempDir(Request["RayTempDirAnswer"]):
    """Prepare Ray's temp folder `name` in this user's private folder (and forget `ray start`'s last
    address there)."""

    name: str


@dataclass(frozen=True)
class RayTempDirAnswer:
    path: str
