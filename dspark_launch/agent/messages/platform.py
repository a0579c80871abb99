"""The node's platform facts for the pre-flight (handlers/platform.py)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.agent.protocol import Request
from dspark_launch.node.values import PlatformFacts as PlatformFacts


@dataclass(frozen=True)
class PlatformQuery(Request["PlatformFacts"]):
    """The node's kernel, CmaTotal, NVIDIA driver and modules, RDMA devices' firmware and ports, memlock
    (node/platform.py); the roots: tests only (DSPARK_TEST_* forwarded by the launcher), fake trees."""

    procfs_root: str = ""
    sysfs_root: str = ""
    modules_root: str = ""
