"""The head agent's Ray operations: it is the Ray driver, so the launcher's process never imports Ray.

`ray_checks` waits for every node to join, checks each node's registered IP and GPUs,
collects the version matrix and applies then verifies the hotfix on every node, each
with a task pinned to that node (NodeAffinitySchedulingStrategy, soft=False), in one
driver session. Failures come back typed, naming the node.
"""

from __future__ import annotations

import os
import time

from dspark_launch.cluster import node_tasks
from dspark_launch.cluster import protocol as p
from dspark_launch.cluster.protocol import OperationFailed, Report
from dspark_launch.cluster.codec import from_data
from dspark_launch.cluster.versions import differing_rows, matrix_lines

PINNED_TASK_TIMEOUT_S = 120


def _label(node: p.ExpectedNode) -> str:
    return f"{node.name} ({node.ip})"


def _fail(node: str, step: str, detail: str, extra: list[str] | None = None) -> OperationFailed:
    return OperationFailed(p.Failure(step, detail, node, tuple(extra or ())))


def _driver(address: str, env: dict[str, str]):
    os.environ.update(env)
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=True,
             include_dashboard=False)
    return ray


def _nodes(table: list[dict]) -> tuple[p.RayNode, ...]:
    return tuple(p.RayNode(n["NodeID"], n["NodeManagerAddress"], bool(n.get("Alive")),
                           float(n.get("Resources", {}).get("GPU", 0))) for n in table)


def _view(ray) -> tuple[p.RayNode, ...]:
    return _nodes(ray.nodes())


def ray_nodes(req: p.RayNodesQuery, report: Report) -> p.RayNodesAnswer:
    """Read from the GCS's node table directly: no driver, no worker process (status stays fast)."""
    os.environ.update(req.env)
    from ray._private.internal_api import get_state_from_address

    return p.RayNodesAnswer(_nodes(get_state_from_address(req.address).node_table()))


def _wait_for_nodes(ray, req: p.RayChecks, report: Report) -> dict[str, p.RayNode]:
    """Until every node is registered exactly once (a killed raylet's entry may linger beside its
    successor); `ignore_node_ids` are registrations made before a repair."""
    expected = {n.ip for n in req.nodes}
    start = time.monotonic()
    while True:
        alive = [n for n in _view(ray) if n.alive and n.node_id not in req.ignore_node_ids]
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


def _run_pinned(ray, node_ids: list[str], fn) -> list:
    """`fn` on each node at once, one task pinned to each; results in the same order."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=0)(fn)
    refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote()
            for node_id in node_ids]
    return ray.get(refs, timeout=PINNED_TASK_TIMEOUT_S)


def ray_checks(req: p.RayChecks, report: Report) -> p.RayChecksAnswer:
    ray = _driver(req.address, req.env)
    try:
        alive = _wait_for_nodes(ray, req, report)
        unexpected = sorted(set(alive) - {n.ip for n in req.nodes})
        if unexpected:
            raise _fail(", ".join(unexpected), "registered IP",
                        "a node joined Ray with an IP that is not configured (another NIC's?)")
        for node in req.nodes:
            gpus = alive[node.ip].gpus
            if gpus != req.gpus_per_node:
                raise _fail(_label(node), "GPUs", f"Ray sees {gpus:g} GPU(s), expected {req.gpus_per_node}")
        node_ids = [alive[node.ip].node_id for node in req.nodes]
        report(p.Progress("phase", "checking versions on " + ", ".join(_label(n) for n in req.nodes)))
        versions = {node.name: from_data(p.VersionRow, row)
                    for node, row in zip(req.nodes, _run_pinned(ray, node_ids, node_tasks.node_report))}
        differing = differing_rows(versions)
        if differing:
            raise _fail(", ".join(versions), "version matrix", f"nodes differ in {', '.join(differing)}",
                        matrix_lines(versions))
        report(p.Progress("phase", "applying the scheduler hotfix on " + ", ".join(_label(n) for n in req.nodes)))
        reports = {node.name: from_data(p.HotfixReport, answer)
                   for node, answer in zip(req.nodes, _run_pinned(ray, node_ids, node_tasks.apply_hotfix))}
        failures = [(node, reports[node.name].failed.message) for node in req.nodes
                    if reports[node.name].failed is not None]
        if failures:
            node, message = failures[0]
            raise _fail(_label(node), "hotfix", message, [f"{_label(n)}: {m}" for n, m in failures[1:]])
        return p.RayChecksAnswer(versions, reports)
    finally:
        ray.shutdown()
