"""What `dspark start` would run on each node, as data: `dspark plan` renders it, `--json` prints `to_json()`.

Nothing here starts or contacts anything. A node whose address is a placeholder from
the example file (or that could not be reached) is in the plan as "not probed": its
fabric and memory are unknown, and the plan says so instead of guessing. Secrets are
shown as set/unset, never their value.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterable

from dspark_launch.config.profile_resolve import Decision, ResolvedProfile
from dspark_launch.config.settings import is_secret
from dspark_launch.profiles.memory_model import MemoryEstimate, MemoryFinding

PLAN_SCHEMA = "dspark-plan/1"
NOT_PROBED_EXAMPLE = "not probed: its address is a placeholder from the example file"


@dataclass(frozen=True)
class EnvEntry:
    name: str
    value: str  # "set" / "unset" for a secret
    secret: bool
    origin: str  # "settings", "profile", "fabric (sysfs)", "launcher"


@dataclass(frozen=True, kw_only=True)
class NodePlan:
    node: str  # "head", "worker1"
    address: str  # fabric IP as configured
    probed: bool
    status: str  # "probed", or why not ("not probed: ...")
    commands: tuple[tuple[str, ...], ...]  # argv of each process started there, in order
    env: tuple[EnvEntry, ...]
    fabric_notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    memory: MemoryFinding | None = None
    refusals: tuple[str, ...] = ()  # what `start` would refuse on this node (its fabric, its memory)


@dataclass(frozen=True, kw_only=True)
class Plan:
    profile: str
    vllm_version: str  # the head's, or "not probed"
    env_file: str
    from_example: bool
    decisions: tuple[Decision, ...]
    nodes: tuple[NodePlan, ...]
    memory: MemoryEstimate | None
    warnings: tuple[str, ...] = ()  # every line to read, the refusals among them
    refusals: tuple[str, ...] = ()  # what `start` would refuse (placeholders, nodes not probed, each node's own)

    @property
    def start_would_refuse(self) -> bool:
        """`dspark plan`'s exit code 1: `start` with these settings would refuse or fail before serving."""
        return bool(self.refusals)

    @property
    def platform_refused(self) -> bool:
        """`dspark plan`'s exit code 2: a node's platform has a fact start refuses (node/platform.py)."""
        return any(line.startswith("platform: ") for line in self.refusals)

    judged_for: str = ""  # the GPU the profile was judged for ("compute capability 12.1 given by --gpu ...")
    cuda_graph_mode: str = ""  # the CUDA-graph mode vLLM will really run (the dry boot); "" when not judged
    hotfix: tuple[str, ...] = ()  # DSPARK_HOTFIX and what start does with it, then each probed node's check
    vllm_policy: str = ""  # the tested releases and the recommended pin (node/vllm_releases.py)

    def to_json(self) -> str:
        body = asdict(self)
        body["decisions"] = [
            {"subject": d.subject, "value": d.value, "reason": d.reason, "line": d.line} for d in self.decisions
        ]
        if self.memory is not None:
            body["memory"]["fits"] = self.memory.fits
        return json.dumps({"schema": PLAN_SCHEMA, **body}, indent=2)


def env_entries(pairs: Iterable[tuple[str, str]], origin: str) -> tuple[EnvEntry, ...]:
    """Environment pairs as a plan shows them: secrets (declared, or names like *KEY*/*TOKEN*) as set/unset."""
    entries = []
    for name, value in pairs:
        secret = is_secret(name)
        entries.append(EnvEntry(name, ("set" if value else "unset") if secret else value, secret, origin))
    return tuple(entries)


def profile_decisions(resolved: ResolvedProfile) -> tuple[Decision, ...]:
    """The head's vLLM version first, then each decision the profile's resolution made."""
    return (
        Decision("vllm", resolved.vllm_version, f"installed on the head; profile {resolved.profile}"),
        *resolved.decisions,
    )


def not_probed(node: str, address: str, reason: str = NOT_PROBED_EXAMPLE) -> NodePlan:
    """A node the plan could not ask (placeholder, unreachable): what would run there is unknown in detail."""
    return NodePlan(node=node, address=address, probed=False, status=reason, commands=(), env=())
