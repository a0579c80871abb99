"""The agent's Ray operations: the Ray port free, Ray's private temp folder, and (head) Ray's node table;
the launcher's process never imports Ray.

`ray_checks` reads the GCS's node table (no driver, no Ray worker): it waits for every
node to join and checks each node's registered IP and GPUs. Each node's version row and
hotfix are its own agent's (`handlers/hotfix.py`), asked while Ray starts. Failures come back
typed, naming the node.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Callable

from dspark_launch.agent import protocol as p
from dspark_launch.agent.port_holder import port_holder_query  # the operation, and the GCS's check
from dspark_launch.agent.protocol import OperationFailed, Report
from dspark_launch.node.ray_dirs import NAME, SOCKET_PATH_MAX, SOCKET_TAIL, make_private_root
from dspark_launch.node.safe_path import UnsafePath, make_dir


def _label(node: p.ExpectedNode) -> str:
    return f"{node.name} ({node.ip})"


def _fail(node: str, step: str, detail: str, extra: list[str] | None = None) -> OperationFailed:
    return OperationFailed(p.Failure(step, detail, node, tuple(extra or ())))


def _node_table(address: str, env: dict[str, str]) -> Callable[[], tuple[p.RayNode, ...]]:
    """Ray's node table as a function to call again (one GCS connection)."""
    os.environ.update(env)
    from ray._private.internal_api import get_state_from_address

    state = get_state_from_address(address)
    return lambda: _nodes(state.node_table())


def _nodes(table: list[dict]) -> tuple[p.RayNode, ...]:
    return tuple(
        p.RayNode(
            n["NodeID"], n["NodeManagerAddress"], bool(n.get("Alive")), float(n.get("Resources", {}).get("GPU", 0))
        )
        for n in table
    )


def gcs_holder(address: str, holders: tuple[p.Process, ...]) -> p.PortHolderAnswer:
    """Who holds the GCS's port: Ray's client sends the token to whoever listens there."""
    host, _, port = address.rpartition(":")
    return port_holder_query(p.PortHolderQuery(host.strip("[]"), int(port), holders))


def ray_nodes_query(req: p.RayNodesQuery, report: Report) -> p.RayNodesAnswer:
    """Read from the GCS's node table directly: no driver, no worker process (status stays fast); only
    when the GCS's port is held by one of the recorded Ray processes, else nothing is sent."""
    holder = gcs_holder(req.address, req.holders)
    if not holder.ours:
        return p.RayNodesAnswer((), holder)
    return p.RayNodesAnswer(_node_table(req.address, req.env)(), holder)


def _wait_for_nodes(
    view: Callable[[], tuple[p.RayNode, ...]], req: p.RayChecks, report: Report
) -> dict[str, p.RayNode]:
    """Until every node is registered exactly once (a killed raylet's entry may linger beside its
    successor); `ignore_node_ids` are registrations made before a repair."""
    expected = {n.ip for n in req.nodes}
    start = time.monotonic()
    while True:
        alive = [n for n in view() if n.alive and n.node_id not in req.ignore_node_ids]
        counts = {ip: sum(1 for n in alive if n.ip == ip) for ip in {n.ip for n in alive}}
        if all(counts.get(ip) == 1 for ip in expected):
            return {n.ip: n for n in alive}
        elapsed = time.monotonic() - start
        missing = ", ".join(_label(n) for n in req.nodes if counts.get(n.ip) != 1)
        if elapsed > req.join_timeout_s:
            extra = sorted(set(counts) - expected)
            detail = f"not joined after {req.join_timeout_s:g} s"
            if extra:
                detail += f"; Ray sees unexpected node IP(s) {', '.join(extra)}: a node registered another NIC's IP"
            raise _fail(missing, "join", detail)
        report(p.Progress("waiting", f"waiting for {missing} to join Ray", elapsed, req.join_timeout_s))
        time.sleep(0.5)


def ray_checks(req: p.RayChecks, report: Report) -> p.RayChecksAnswer:
    holder = gcs_holder(req.address, req.holders)
    if not holder.ours:
        raise _fail(
            "head",
            "ray port",
            f"{req.address} is not held by the Ray started here "
            f"({holder.foreign or holder.verdict}); the Ray token was not sent there",
        )
    alive = _wait_for_nodes(_node_table(req.address, req.env), req, report)
    unexpected = sorted(set(alive) - {n.ip for n in req.nodes})
    if unexpected:
        raise _fail(
            ", ".join(unexpected),
            "registered IP",
            "a node joined Ray with an IP that is not configured (another NIC's?)",
        )
    for node in req.nodes:
        gpus = alive[node.ip].gpus
        if gpus != req.gpus_per_node:
            raise _fail(_label(node), "GPUs", f"Ray sees {gpus:g} GPU(s), expected {req.gpus_per_node}")
    return p.RayChecksAnswer(tuple(alive[node.ip] for node in req.nodes))


def port_query(req: p.PortQuery, report: Report) -> p.PortAnswer:
    family = socket.AF_INET6 if ":" in req.ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As servers do: a port with only TIME_WAIT leftovers of a stopped Ray is free to listen on.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((req.ip, req.port))
        except OSError as exc:
            held = port_holder_query(p.PortHolderQuery(req.ip, req.port, ()))
            return p.PortAnswer(
                False, "; ".join(filter(None, (os.strerror(exc.errno or errno.EADDRINUSE), held.foreign)))
            )
    return p.PortAnswer(True)


def ray_temp_dir(req: p.RayTempDir, report: p.Report) -> p.RayTempDirAnswer:
    if not NAME.fullmatch(req.name):
        raise p.OperationFailed(p.Failure("ray temp folder", f"refusing folder name {req.name!r}"))
    try:
        folder = make_private_root() / req.name
        if len(str(folder)) + SOCKET_TAIL > SOCKET_PATH_MAX:
            raise p.OperationFailed(p.Failure("ray temp folder", f"{folder} is too long for Ray's socket paths"))
        make_dir(folder, forbidden=0)  # inside a private folder: only this user can have set its mode
    except UnsafePath as exc:
        raise p.OperationFailed(
            p.Failure(
                "ray temp folder", f"{exc}; refusing to start Ray there (remove it if nobody should have put it there)"
            )
        ) from None
    except OSError as exc:
        where = exc.filename or req.name
        raise p.OperationFailed(p.Failure("ray temp folder", f"{where}: cannot create it ({exc.strerror})")) from None
    try:  # `ray start --head` refuses to start when a stale record there names its address
        (folder / "ray_current_cluster").unlink()
    except FileNotFoundError:
        pass
    return p.RayTempDirAnswer(str(folder))
