"""The version matrix, then the scheduler hotfix applied and verified, on every node's own agent.

Bring-up runs this beside Ray's start (each node at once): it reads and patches files only,
so it needs no Ray. The hotfix is applied only when every node's row agrees; any failure
raises, and the caller stops everything it started: nothing is served from a node whose
hotfix is not applied and verified.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.errors import ClusterFailure

from dspark_launch.report import Reporter
from dspark_launch.cluster.parallel import on_each
from dspark_launch.agent.protocol import HotfixApply, HotfixApplyAnswer, VersionQuery
from dspark_launch.node.values import VersionRow
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.node.versions import differing_rows, gpu_node_problems, matrix_lines, modules_of
from dspark_launch.profiles.gpu import GpuTarget, gpu_target


@dataclass(frozen=True)
class NodeChecks:
    versions: dict[str, VersionRow]  # by node name, in the spec's order
    hotfix: dict[str, HotfixApplyAnswer]


def versions_and_hotfix(spec: ClusterSpec, reporter: Reporter) -> NodeChecks:
    """Every node's version row (equal on all, or ClusterFailure with the matrix), then the hotfix on each."""
    labels = ", ".join(node.label for node in spec.nodes)
    reporter.phase(f"asking every node for its version row: {labels}")
    versions = on_each(spec.nodes, lambda node: node.agent(reporter).call(VersionQuery()))
    differing = differing_rows(versions)
    if differing:
        raise ClusterFailure(", ".join(versions), "version matrix", f"nodes differ in {', '.join(differing)}",
                             matrix_lines(versions))
    problems = gpu_node_problems(versions, spec.containers is None)
    if problems:
        raise ClusterFailure(", ".join(versions), "GPU pre-flight", problems[0], problems[1:])
    reporter.phase(f"applying the scheduler hotfix on {labels}")
    reports = on_each(spec.nodes, lambda node: node.agent(reporter).call(HotfixApply()))
    failures = [(node, reports[node.name].failed.message) for node in spec.nodes if reports[node.name].failed]
    if failures:
        node, message = failures[0]
        raise ClusterFailure(node.label, "hotfix", message, [f"{n.label}: {m}" for n, m in failures[1:]])
    reporter.phase(f"hotfix applied and verified on {labels}")
    return NodeChecks(versions, reports)


def node_gpus(spec: ClusterSpec, reporter: Reporter) -> GpuTarget:
    """The compute capability every node's version row reports (read-only: nvidia-smi and metadata), for
    resolution to judge the profile's GPU-specific flags; asked before anything starts."""
    rows = on_each(spec.nodes, lambda node: node.agent(reporter).call(VersionQuery()))
    return gpu_target({name: row.compute_capability for name, row in rows.items()},
                      {name: row.driver for name, row in rows.items()},
                      {name: modules_of(row.packages) for name, row in rows.items()})
