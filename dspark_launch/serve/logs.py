"""`dspark logs`: which node's agent reads which log files (the server's, or one node's Ray logs)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.agent.client import NodeAgent
from dspark_launch.cluster import ray_cluster as rc
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import load_state
from dspark_launch.errors import DsparkError
from dspark_launch.serve.running_server import SERVER_LOG


@dataclass(frozen=True)
class LogFiles:
    agent: NodeAgent  # the agent of the node that holds them
    paths: tuple[str, ...]


def log_files(spec: ClusterSpec, node: str | None) -> LogFiles:
    """The server log on the head (`node` None), else the recorded Ray logs of `node` (head, worker1, ...);
    DsparkError when nothing was started there from this state folder."""
    state = load_state(spec.state_dir)
    if node is None:
        target, paths = spec.head, [str(spec.state_dir / "logs" / SERVER_LOG)]
    else:
        target = spec.node(node)
        record = state.node(node) if state else None
        paths = rc.ray_log_paths(target, record) if record else []
    if not paths:
        raise DsparkError(f"no logs for {target.label}: nothing started there from this state folder")
    return LogFiles(target.agent(), tuple(paths))
