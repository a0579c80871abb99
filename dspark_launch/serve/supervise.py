"""`start --foreground`: watch the server and every node's Ray until one of them is lost.

The supervisor (the systemd unit) acts only on its own run: the server record it
started, named by its marker (the run id in `state.json`). When an operator's `stop` or
`restart` took the deployment over (the record no longer holds that marker), it leaves
everything alone and ends with `TAKEN_OVER`.
"""

from __future__ import annotations

import time
from typing import Callable

from dspark_launch.cluster import lifecycle
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord, load_state, lock_holder
from dspark_launch.serve import logscan
from dspark_launch.serve.logfollow import LogReader
from dspark_launch.serve.running_server import server_alive

NODE_CHECK_S = 10  # how often Ray on every node is checked (the server: every 2 s)
SERVER_CHECK_S = 2
TAKEN_OVER = None  # what `watch` returns when the record no longer holds this run


def nodes_down(spec: ClusterSpec) -> dict[str, str]:
    """Nodes whose recorded Ray daemons are gone: label -> "dead" or "unreachable (why)"."""
    state = load_state(spec.state_dir)
    if state is None:
        return {}
    details: dict[str, str] = {}
    health = lifecycle.node_health(spec, state, details)
    return {spec.node(name).label: (f"unreachable ({details[name]})" if name in details else h)
            for name, h in health.items() if h != "alive"}


def still_ours(spec: ClusterSpec, server: ServerRecord, sleep: Callable[[float], None]) -> bool:
    """Whether the record still holds this run, once no other launcher is changing it (an operator's
    `stop` or `restart` holds the lock while it stops what we watch)."""
    while lock_holder(spec.state_dir) is not None:
        sleep(SERVER_CHECK_S)
    state = load_state(spec.state_dir)
    return state is not None and state.server is not None and state.server.marker == server.marker


def watch(spec: ClusterSpec, server: ServerRecord, sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Why supervision ended: the server exited, or a node's Ray was down twice in a row; TAKEN_OVER
    when an operator's command stopped or replaced this run."""
    down_before: dict[str, str] = {}
    last_check = time.monotonic()
    while True:
        if not server_alive(spec, server):
            if not still_ours(spec, server, sleep):
                return TAKEN_OVER
            text = LogReader(spec.head.agent(), server.log).refresh()
            cause = f"vllm serve (pid {server.pid}) exited: {logscan.failure(text)}"
            down = nodes_down(spec)
            if down:
                cause += "; Ray is down on " + ", ".join(down)
            return cause
        if time.monotonic() - last_check >= NODE_CHECK_S:
            last_check = time.monotonic()
            if not still_ours(spec, server, sleep):
                return TAKEN_OVER
            down = nodes_down(spec)
            lasting = {label: why for label, why in down.items() if label in down_before}
            if lasting:  # twice in a row: not a blip
                return ("Ray " + ", ".join(f"on {label} is {why}" for label, why in lasting.items())
                        + f" under vllm serve (pid {server.pid})")
            down_before = down
        sleep(SERVER_CHECK_S)
