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
    """"12.1" as a Capability; None for None, "" or anything else."""
    found = _CAPABILITY.match(text or "")
    return Capability(int(found.group(1)), int(found.group(2))) if found else None


@dataclass(frozen=True)
class GpuTarget:
    """What resolution judges for: a capability every reporting node shares, or None (unknown), and why."""

    capability: Capability | None
    basis: str  # "compute capability 12.1 on head, worker1" / why it is unknown

    @property
    def known(self) -> bool:
        return self.capability is not None


UNKNOWN = GpuTarget(None, "no node reported a GPU compute capability")


def gpu_target(reported: Mapping[str, str | None]) -> GpuTarget:
    """From each node's reported capability (node name -> "12.1" or None); nodes that were not asked are
    simply absent. Differing capabilities are not judged (the version matrix refuses them at start)."""
    found = {node: parse_capability(text) for node, text in reported.items()}
    known = {node: cap for node, cap in found.items() if cap is not None}
    if not known:
        asked = ", ".join(reported) or "none"
        return GpuTarget(None, f"no node reported a GPU compute capability (asked: {asked}; CPU-only or no "
                               f"nvidia-smi)")
    distinct = sorted({str(cap) for cap in known.values()})
    if len(distinct) > 1:
        listing = ", ".join(f"{node} {cap}" for node, cap in known.items())
        return GpuTarget(None, f"nodes differ in compute capability ({listing}): not judged; the version matrix "
                               f"refuses this at start")
    silent = [node for node, cap in found.items() if cap is None]
    basis = f"compute capability {distinct[0]} on {', '.join(known)}"
    if silent:
        basis += f" ({', '.join(silent)} reported none)"
    return GpuTarget(next(iter(known.values())), basis)
