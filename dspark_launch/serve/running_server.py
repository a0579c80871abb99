"""The running `vllm serve` as every verb sees it: alive, healthy, its log tails for a failure report."""

from __future__ import annotations

from dspark_launch.agent.protocol import AliveQuery, Tail
from dspark_launch.cluster import ray_cluster as rc
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import Deployment, ServerRecord, load_state
from dspark_launch.errors import ClusterFailure, DsparkError
from dspark_launch.serve.api_holder import api_holder, healthy, keyed

SERVER_LOG = "vllm-serve.log"


class ServeFailure(DsparkError):
    """vllm serve did not come up; `extra` holds the log tails to print."""

    def __init__(self, message: str, extra: list[str] | None = None):
        super().__init__(message)
        self.extra = extra or []


def server_alive(spec: ClusterSpec, server: ServerRecord) -> bool:
    process = server.process
    return process is not None and all(spec.head.agent().call(AliveQuery((process,)), "server status").alive)


def serving(spec: ClusterSpec, server: ServerRecord, client_key: str, timeout: float) -> bool:
    """The recorded server alive, holding its port (the key goes nowhere else), and answering."""
    holder = api_holder(spec, server)
    return holder.recorded_alive and healthy(
        holder, server.url, keyed(spec, server, client_key, holder), server.served_name, timeout
    )


def tails(spec: ClusterSpec, server: ServerRecord | None, state: Deployment | None, lines: int = 30) -> list[str]:
    """The end of the server log and of each node's Ray logs, for a failure report."""
    out: list[str] = []
    if server:
        out += spec.head.agent().call(Tail((server.log,), lines)).lines
    state = state or load_state(spec.state_dir)
    for node in spec.nodes:
        record = state.node(node.name) if state else None
        if record is None:
            continue
        try:
            out += node.agent().call(Tail(tuple(rc.ray_log_paths(node, record)), 10)).lines
        except ClusterFailure as exc:
            out.append(f"({exc})")
    return out
