"""`start --foreground`: watch the server, its engine and every node's Ray until one of them is lost.

The supervisor (the systemd unit) acts only on its own run: the server record it
started, named by its marker (the run id in `state.json`). When an operator's `stop` or
`restart` took the deployment over (the record no longer holds that marker), it leaves
everything alone and ends with `TAKEN_OVER`. What it does about a loss is serve/recovery.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal

from dspark_launch.cluster import lifecycle
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord, load_state, lock_holder
from dspark_launch.serve import logscan
from dspark_launch.serve.logfollow import LogReader
from dspark_launch.serve.running_server import server_alive
from dspark_launch.serve.stall import EngineWatch

NODE_CHECK_S = 10  # how often Ray on every node is checked (the server and its engine: every 2 s)
SERVER_CHECK_S = 2
TAKEN_OVER = None  # what `watch` returns when the record no longer holds this run

LostKind = Literal["exited", "stalled", "ray", "failed"]


@dataclass(frozen=True)
class Lost:
    """Why watching a server ended: its process exited, its engine stalled, a node's Ray was lost (twice in a
    row), or (the recovery's own) a recovery failed; `cause` is the one line the journal and the log get."""

    kind: LostKind
    cause: str


def nodes_down(spec: ClusterSpec) -> dict[str, str]:
    """Nodes whose recorded Ray daemons are gone: label -> "dead" or "unreachable (why)"."""
    state = load_state(spec.state_dir)
    if state is None:
        return {}
    details: dict[str, str] = {}
    health = lifecycle.node_health(spec, state, details)
    return {
        spec.node(name).label: (f"unreachable ({details[name]})" if name in details else h)
        for name, h in health.items()
        if h != "alive"
    }


def still_ours(spec: ClusterSpec, marker: str | None, sleep: Callable[[float], None]) -> bool:
    """Whether the record still holds this run (the server with `marker`; None: the run is between servers, no server
    recorded), once no other launcher is changing it (an operator's `stop` or `restart` holds the lock while it
    stops what we watch)."""
    while lock_holder(spec.state_dir) is not None:
        sleep(SERVER_CHECK_S)
    state = load_state(spec.state_dir)
    if marker is None:
        return state is None or state.server is None
    return state is not None and state.server is not None and state.server.marker == marker


def watch(
    spec: ClusterSpec,
    server: ServerRecord,
    sleep: Callable[[float], None] = time.sleep,
    engine: Callable[[], EngineWatch | None] | None = None,
    nodes: Callable[[ServerRecord], None] | None = None,
) -> Lost | None:
    """Why supervision of `server` ended: it exited, its engine stalled (`engine`: one look at it, every poll), or a
    node's Ray was down twice in a row; TAKEN_OVER when an operator's command stopped or replaced this run. `nodes`:
    called every poll with the server (the memory watch, which keeps its own pace)."""
    down_before: dict[str, str] = {}
    last_check = time.monotonic()
    while True:
        if not server_alive(spec, server):
            if not still_ours(spec, server.marker, sleep):
                return TAKEN_OVER
            text = LogReader(spec.head.agent(), server.log).refresh()
            cause = f"vllm serve (pid {server.pid}) exited: {logscan.failure(text)}"
            down = nodes_down(spec)
            if down:
                return Lost("ray", cause + "; Ray is down on " + ", ".join(down))
            return Lost("exited", cause)
        if nodes is not None:
            nodes(server)
        looked = engine() if engine is not None else None
        if looked is not None and looked.stalled:
            if not still_ours(spec, server.marker, sleep):
                return TAKEN_OVER
            return Lost("stalled", f"vllm serve (pid {server.pid}) answers but its {looked.line}")
        if time.monotonic() - last_check >= NODE_CHECK_S:
            last_check = time.monotonic()
            if not still_ours(spec, server.marker, sleep):
                return TAKEN_OVER
            down = nodes_down(spec)
            lasting = {label: why for label, why in down.items() if label in down_before}
            if lasting:  # twice in a row: not a blip
                return Lost(
                    "ray",
                    "Ray "
                    + ", ".join(f"on {label} is {why}" for label, why in lasting.items())
                    + f" under vllm serve (pid {server.pid})",
                )
            down_before = down
        sleep(SERVER_CHECK_S)
