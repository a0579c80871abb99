"""The version matrix, then the scheduler hotfix applied and verified, on every node's own agent.

Bring-up runs this beside Ray's start (each node at once): it reads and patches files only,
so it needs no Ray. The hotfix is applied only when every node's row agrees; any failure
raises, and the caller stops everything it started: nothing is served from a node whose
hotfix is not applied and verified. With DSPARK_HOTFIX=off (`spec.hotfix`) nothing is applied:
a patch of ours an earlier start left is reverted, and every node serves vLLM's own scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.agent.protocol import HotfixApply, HotfixApplyAnswer, HotfixResult, HotfixRevert, VersionQuery
from dspark_launch.cluster.parallel import on_each
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.errors import ClusterFailure
from dspark_launch.node.values import VersionRow
from dspark_launch.node.versions import differing_rows, gpu_node_problems, matrix_lines, modules_of
from dspark_launch.node.vllm_releases import PIP_PIN, TESTED, untested_note
from dspark_launch.profiles.gpu import GpuTarget, gpu_target
from dspark_launch.report import Reporter

#: The states of a scheduler.py that still carries this hotfix's code (its marker, or its gate without one).
OURS = ("applied", "outdated", "modified", "damaged")
OFF_LINE = (
    "DSPARK_HOTFIX=off: the scheduler hotfix is NOT applied; every node serves the installed vLLM's own "
    "scheduler, without the in-flight prefill cap (long prompts can starve running streams: "
    "docs/hotfix.md)"
)


def what_to_do(result: HotfixResult) -> str:
    """What the operator does about a node whose scheduler the hotfix refuses (start's and plan's refusal)."""
    version = result.vllm_version or "unknown"
    if result.state == "missing":
        return "install vLLM for the Python that node runs (DSPARK_HEAD_PYTHON, DSPARK_WORKER_PYTHON)"
    if result.state in ("foreign", "damaged", "modified"):
        return (
            f"reinstall vLLM {version} on that node (pip install --force-reinstall --no-deps) so its "
            "scheduler.py is vLLM's own"
        )
    if result.state == "error":
        return "let the serving user read and write that node's scheduler.py"
    return (
        f"install a release the hotfix supports on every node (pip install {PIP_PIN}; tested: "
        f"{', '.join(TESTED)}), or set DSPARK_HOTFIX=off to serve vLLM {version} without the hotfix"
    )


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
        raise ClusterFailure(
            ", ".join(versions), "version matrix", f"nodes differ in {', '.join(differing)}", matrix_lines(versions)
        )
    problems = gpu_node_problems(versions, spec.containers is None)
    if problems:
        raise ClusterFailure(", ".join(versions), "GPU pre-flight", problems[0], problems[1:])
    note = untested_note(labels, versions[spec.head.name].vllm or "")
    if note:
        reporter.warn(note)
    if spec.hotfix == "off":
        return NodeChecks(versions, hotfix_off(spec, reporter))
    reporter.phase(f"applying the scheduler hotfix on {labels}")
    reports = on_each(spec.nodes, lambda node: node.agent(reporter).call(HotfixApply()))
    failures = [
        (node, f"{failed.message}; {what_to_do(failed)}")
        for node in spec.nodes
        if (failed := reports[node.name].failed)
    ]
    if failures:
        node, message = failures[0]
        raise ClusterFailure(node.label, "hotfix", message, [f"{n.label}: {m}" for n, m in failures[1:]])
    reporter.phase(f"hotfix applied and verified on {labels}")
    return NodeChecks(versions, reports)


def hotfix_off(spec: ClusterSpec, reporter: Reporter) -> dict[str, HotfixApplyAnswer]:
    """DSPARK_HOTFIX=off: said loudly; on every node a patch of ours an earlier start left reverted (its stored
    original), any other file left as it is. ClusterFailure for a node whose file keeps our code (nothing to
    revert it from): it would serve neither the hotfix verified nor vLLM's own scheduler. Recorded as the apply
    answer (its `apply` the revert, action "revert": status shows such a node's hotfix as off)."""
    reporter.warn(OFF_LINE)
    answers = on_each(spec.nodes, lambda node: node.agent(reporter).call(HotfixRevert()))
    kept = [(node, answers[node.name]) for node in spec.nodes if answers[node.name].status.state in OURS]
    if kept:
        lines = [
            f"{node.label}: DSPARK_HOTFIX=off, but its scheduler keeps this hotfix's code "
            f"({answer.revert.message}); {what_to_do(answer.status)}"
            for node, answer in kept
        ]
        raise ClusterFailure(kept[0][0].label, "hotfix", lines[0].split(": ", 1)[1], lines[1:])
    for node in spec.nodes:
        answer = answers[node.name]
        if answer.revert.changed:
            reporter.warn(
                f"{node.label}: reverted the hotfix an earlier start left (patch "
                f"v{answer.revert.applied_patch_version}): vLLM's own scheduler again"
            )
        elif answer.status.state == "foreign":
            reporter.warn(
                f"{node.label}: its scheduler carries another patch, served as it is: {answer.status.message}"
            )
    return {name: HotfixApplyAnswer(answer.hostname, answer.revert, answer.status) for name, answer in answers.items()}


def node_gpus(spec: ClusterSpec, reporter: Reporter) -> GpuTarget:
    """The compute capability every node's version row reports (read-only: nvidia-smi and metadata), for
    resolution to judge the profile's GPU-specific flags; asked before anything starts."""
    rows = on_each(spec.nodes, lambda node: node.agent(reporter).call(VersionQuery()))
    return gpu_target(
        {name: row.compute_capability for name, row in rows.items()},
        {name: row.driver for name, row in rows.items()},
        {name: modules_of(row.packages) for name, row in rows.items()},
    )
