"""`start --foreground`: watch the server and every node's Ray until one of them is lost."""

from __future__ import annotations

import time
from typing import Callable

from dspark_launch.cluster import lifecycle
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord, load_state
from dspark_launch.serve import logscan
from dspark_launch.serve.logfollow import LogReader
from dspark_launch.serve.service import server_alive

NODE_CHECK_S = 10  # how often Ray on every node is checked (the server: every 2 s)
SERVER_CHECK_S = 2


def nodes_down(spec: ClusterSpec) -> dict[str, str]:
    """Nodes whose recorded Ray daemons are gone: label -> "dead" or "unreachable (why)"."""
    state = load_state(spec.state_dir)
    if state is None:
        return {}
    details: dict[str, str] = {}
    health = lifecycle.node_health(spec, state, details)
    return {spec.node(name).label: (f"unreachable ({details[name]})" if name in details else h)
            for name, h in health.items() if h != "alive"}


def watch(spec: ClusterSpec, server: ServerRecord, sleep: Callable[[float], None] = time.sleep) -> str:
    """Returns why supervision ended: the server exited, or a node's Ray was down twice in a row."""
    down_before: dict[str, str] = {}
    last_check = time.monotonic()
    while True:
        if not server_alive(spec, server):
            text = LogReader(spec.head.agent(), server.log).refresh()
            cause = f"vllm serve (pid {server.pid}) exited: {logscan.failure(text)}"
            down = nodes_down(spec)
            if down:
                cause += "; Ray is down on " + ", ".join(down)
            return cause
        if time.monotonic() - last_check >= NODE_CHECK_S:
            last_check = time.monotonic()
            down = nodes_down(spec)
            lasting = {label: why for label, why in down.items() if label in down_before}
            if lasting:  # twice in a row: not a blip
                return ("Ray " + ", ".join(f"on {label} is {why}" for label, why in lasting.items())
                        + f" under vllm serve (pid {server.pid})")
            down_before = down
        sleep(SERVER_CHECK_S)
