"""The platform pre-flight on every node (node/platform.py read by each node's agent), for `plan`, `start` and
`status`: the facts with a public failure report refused (exit 2, nothing started), what differs between the nodes
a warning, and what changed on a node since start (`status`)."""

from __future__ import annotations

from dspark_launch.agent import protocol as p
from dspark_launch.cluster.parallel import on_each
from dspark_launch.cluster.spec import ClusterSpec, Node
from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.node.fabric import SYSFS_ROOT_VAR
from dspark_launch.node.platform import MODULES_ROOT_VAR, PROCFS_ROOT_VAR, PlatformVerdict, compared, drift, judge
from dspark_launch.node.values import PlatformFacts
from dspark_launch.report import Reporter


class PlatformRefused(ConfigError):
    """A node's platform has a fact start refuses (exit 2); nothing was started."""

    def __init__(self, refusals: tuple[str, ...]):
        super().__init__(f"{refusals[0]}; start refuses this (exit 2), nothing was started")
        self.extra = [f"dspark: error: {line}" for line in refusals[1:]]


def platform_query(spec: ClusterSpec) -> p.PlatformQuery:
    """The question, with the tests' fake trees where the launcher's environment names them (DSPARK_TEST_*)."""
    forwarded = dict(spec.forwarded)
    return p.PlatformQuery(
        forwarded.get(PROCFS_ROOT_VAR, ""), forwarded.get(SYSFS_ROOT_VAR, ""), forwarded.get(MODULES_ROOT_VAR, "")
    )


def memory_query(spec: ClusterSpec) -> p.MemoryQuery:
    return p.MemoryQuery(dict(spec.forwarded).get(PROCFS_ROOT_VAR, ""))


def node_platform(spec: ClusterSpec, node: Node) -> PlatformFacts:
    return node.agent().call(platform_query(spec))


def node_platforms(spec: ClusterSpec) -> dict[str, PlatformFacts]:
    """Every node's facts by node name, asked at once."""
    return on_each(spec.nodes, lambda node: node_platform(spec, node))


def labelled(spec: ClusterSpec, facts: dict[str, PlatformFacts]) -> dict[str, PlatformFacts]:
    return {spec.node(name).label: found for name, found in facts.items()}


def preflight(spec: ClusterSpec, facts: dict[str, PlatformFacts], reporter: Reporter) -> PlatformVerdict:
    """Judged across the nodes: PlatformRefused for any refusal; each difference a warning."""
    verdict = judge(labelled(spec, facts))
    if verdict.refusals:
        raise PlatformRefused(verdict.refusals)
    for line in verdict.warnings:
        reporter.warn(line)
    reporter.phase(
        "platform pre-flight: "
        + "; ".join(f"{spec.node(name).label} kernel {found.kernel or 'unknown'}" for name, found in facts.items())
    )
    return verdict


def recorded(facts: dict[str, PlatformFacts]) -> dict[str, dict[str, str]]:
    """What the record keeps of each node's facts at start (by node name): what `status` compares."""
    return {name: compared(found) for name, found in facts.items()}


def drift_lines(spec: ClusterSpec, at_start: dict[str, dict[str, str]]) -> list[str]:
    """Per node, each fact that changed since start, and a refusal the node's facts now give; a node that cannot
    be asked is left to the other status lines."""

    def ask(node: Node) -> PlatformFacts | None:
        try:
            return node_platform(spec, node)
        except DsparkError:
            return None

    now = on_each([n for n in spec.nodes if n.name in at_start], ask)
    lines = []
    for name, found in now.items():
        if found is None:
            continue
        label = spec.node(name).label
        changed = drift(at_start[name], found)
        if changed:
            lines.append(f"platform: {label} changed since start: " + "; ".join(changed))
        lines += [f"{line} (now; start would refuse it)" for line in judge({label: found}).refusals]
    return lines
