"""A healthy node's answers to what a bring-up sends, for the fake node agents of the decision tests
(tests/test_bringup_decisions.py, tests/test_status_decisions.py): each fake answers the requests its
table varies itself and takes the rest from here."""

from __future__ import annotations

import dataclasses

from dspark_launch.agent import protocol as p
from dspark_launch.cluster.spec import Node
from dspark_launch.node.fabric import FabricEnv
from dspark_launch.node.values import PlatformFacts

ROW = p.VersionRow(
    python="3.11.7", vllm="0.32.0", ray="2.60.0", torch="2.13.0", dspark_launch="0.1", scheduler_sha256="a" * 64
)
PLATFORM = PlatformFacts(
    kernel="6.11.0-1016-nvidia",
    cma_total_kb=65536,
    nvidia_driver="580.95.05",
    nvidia_loaded=True,
    nvidia_module_kernels=("6.11.0-1016-nvidia",),
    ports=(),
    memlock="unlimited",
)
APPLIED = p.HotfixResult("apply", 0, "applied", "applied")
VERIFIED = p.HotfixResult("status", 0, "applied", "verified")


def healthy_answer(node: Node, request: object) -> object | None:
    """What a healthy node answers to a bring-up request that needs no per-test state; None for the others."""
    if isinstance(request, p.Probe):
        modules = {name: p.ModuleInfo(True, "1") for name in ("dspark_launch", "ray", "vllm")}
        return p.ProbeAnswer(node.name, "/venv/bin/python", "3.11.7", modules)
    if isinstance(request, p.PlatformQuery):
        return PLATFORM
    if isinstance(request, p.PrepareLogDir):
        return p.PrepareLogDirAnswer(None)
    if isinstance(request, p.InterfaceQuery):
        return p.InterfaceAnswer(True, (node.ip,), True)
    if isinstance(request, p.PortQuery):
        return p.PortAnswer(True)
    if isinstance(request, p.FabricQuery):
        return p.FabricAnswer(FabricEnv(node.name, (), ("mlx5_0",), "3", True, (), ()))
    if isinstance(request, p.VersionQuery):
        return dataclasses.replace(ROW, hostname=node.name)
    if isinstance(request, p.HotfixApply):
        return p.HotfixApplyAnswer(node.name, APPLIED, VERIFIED)
    if isinstance(request, p.RayTempDir):
        return p.RayTempDirAnswer(f"/run/dspark/{request.name}")
    if isinstance(request, p.RayChecks):
        return p.RayChecksAnswer(tuple(p.RayNode(f"id-{n.name}", n.ip, True, 1.0) for n in request.nodes))
    return None
