"""The GPU a profile's flags are judged for: the compute capability every node reported.

Each node's agent reports its GPU's compute capability in its version row
(`nvidia-smi --query-gpu=compute_cap`, agent/handlers/hotfix.py); CPU-only nodes (the
testbed) report none. Resolution judges the KV cache dtype and the GPU-specific
settings for that capability, and says so in each decision line. Pure: the rows'
values come in as text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

_CAPABILITY = re.compile(r"^\s*(\d{1,2})\.(\d{1,2})\s*$")


@dataclass(frozen=True)
class Capability:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    def matches(self, pattern: str) -> bool:
        """`"12"` matches every 12.x, `"12.1"` only 12.1."""
        return pattern == str(self.major) or pattern == str(self)


def parse_capability(text: str | None) -> Capability | None:
    """ "12.1" as a Capability; None for None, "" or anything else."""
    found = _CAPABILITY.match(text or "")
    return Capability(int(found.group(1)), int(found.group(2))) if found else None


@dataclass(frozen=True)
class GpuTarget:
    """What resolution judges for: a capability every reporting node shares, or None (unknown), and why;
    the optional kernel packages every node has."""

    capability: Capability | None
    basis: str  # "compute capability 12.1 on head, worker1" / why it is unknown
    refusal: str = ""  # why nothing may be judged (a node with an NVIDIA driver reports no capability)
    packages: tuple[str, ...] | None = None  # optional modules installed on every asked node; None: not asked
    lacking: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (module, nodes without it) where some have it

    @property
    def known(self) -> bool:
        return self.capability is not None

    def nodes_without(self, module: str) -> tuple[str, ...]:
        return dict(self.lacking).get(module, ())


UNKNOWN = GpuTarget(None, "no node reported a GPU compute capability")


def given_target(text: str) -> GpuTarget:
    """`dspark plan --gpu 12.1`: every node as if it reported this capability (ValueError when it is not one)."""
    capability = parse_capability(text)
    if capability is None:
        raise ValueError(text)
    return GpuTarget(capability, f"compute capability {capability} given by --gpu (as if every node reported it)")


def _cluster_packages(packages: Mapping[str, tuple[str, ...] | None]) -> tuple[tuple[str, ...] | None, tuple]:
    known = {node: set(found) for node, found in packages.items() if found is not None}
    if not known:
        return None, ()
    common = set.intersection(*known.values())
    lacking = tuple(
        (module, tuple(node for node, found in known.items() if module not in found))
        for module in sorted(set.union(*known.values()) - common)
    )
    return tuple(sorted(common)), lacking


def gpu_target(
    reported: Mapping[str, str | None],
    drivers: Mapping[str, str | None] | None = None,
    packages: Mapping[str, tuple[str, ...] | None] | None = None,
) -> GpuTarget:
    """From each node's reported capability (node name -> "12.1" or None); nodes that were not asked are
    simply absent. Differing capabilities are not judged (the version matrix refuses them at start).
    `drivers`: each node's NVIDIA driver version (None: no driver): a node with a driver but no capability
    (nvidia-smi missing or failing where the agent runs) is a refusal naming it, never a guess.
    `packages`: each node's installed optional modules (its version row), intersected for the cluster."""
    common, lacking = _cluster_packages(packages or {})
    target = _capability_target(reported, drivers or {})
    return GpuTarget(target.capability, target.basis, target.refusal, common, lacking)


def _capability_target(reported: Mapping[str, str | None], drivers: Mapping[str, str | None]) -> GpuTarget:
    found = {node: parse_capability(text) for node, text in reported.items()}
    blind = [node for node, cap in found.items() if cap is None and drivers.get(node)]
    if blind:
        listing = ", ".join(f"{node} (driver {drivers[node]})" for node in blind)
        return GpuTarget(
            None,
            f"no compute capability from {', '.join(blind)}",
            refusal=(
                f"{listing}: an NVIDIA driver but no GPU compute capability reported (nvidia-smi missing or failing "
                f"in the agent's PATH or the node container): the GPU-specific flags cannot be judged; allowed: "
                f"nvidia-smi working on every node, or `dspark plan --gpu CAP` to prepare without the nodes"
            ),
        )
    known = {node: cap for node, cap in found.items() if cap is not None}
    if not known:
        asked = ", ".join(reported) or "none"
        return GpuTarget(None, f"no node reported a GPU compute capability (asked: {asked}; CPU-only or no nvidia-smi)")
    distinct = sorted({str(cap) for cap in known.values()})
    if len(distinct) > 1:
        listing = ", ".join(f"{node} {cap}" for node, cap in known.items())
        return GpuTarget(
            None,
            f"nodes differ in compute capability ({listing}): not judged; the version matrix refuses this at start",
        )
    silent = [node for node, cap in found.items() if cap is None]
    basis = f"compute capability {distinct[0]} on {', '.join(known)}"
    if silent:
        basis += f" ({', '.join(silent)} reported none)"
    return GpuTarget(next(iter(known.values())), basis)
