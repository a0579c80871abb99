"""The agent's platform operation: the node's kernel, driver, fabric firmware and limits (node/platform.py)."""

from __future__ import annotations

from dspark_launch.agent import protocol as p
from dspark_launch.node.platform import PlatformRoots, read_platform
from dspark_launch.node.values import PlatformFacts
from dspark_launch.node.versions import memlock_limit


def platform_query(req: p.PlatformQuery, report: p.Report | None = None) -> PlatformFacts:
    return read_platform(PlatformRoots.given(req.procfs_root, req.sysfs_root, req.modules_root), memlock_limit())
