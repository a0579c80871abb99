"""The agent's fabric operations: the fabric interface's addresses, each node's own fabric environment from
its sysfs, and (head) the file that keeps vLLM from copying the head's fabric values to its workers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from dspark_launch.agent import protocol as p
from dspark_launch.agent.protocol import Report
from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.node.fabric import fabric_env as node_fabric_env
from dspark_launch.node.fabric import sysfs_root, write_non_carry_over


def interface_query(req: p.InterfaceQuery, report: Report) -> p.InterfaceAnswer:
    """Whether interface `ifname` exists here and carries address `ip`."""
    exists = os.path.exists(f"/sys/class/net/{req.ifname}")
    addresses: list[str] = []
    if exists:
        out = subprocess.run(["ip", "-j", "addr", "show", "dev", req.ifname], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            for link in json.loads(out.stdout):
                addresses += [a["local"] for a in link.get("addr_info", [])]
    return p.InterfaceAnswer(exists, tuple(addresses), req.ip in addresses)


def fabric_query(req: p.FabricQuery, report: p.Report) -> p.FabricAnswer:
    root = Path(req.sysfs_root) if req.sysfs_root else sysfs_root()
    try:
        return p.FabricAnswer(node_fabric_env(req.request, root))
    except ConfigError as exc:
        raise p.OperationFailed(p.Failure("fabric", str(exc), config_error=True)) from None
    except DsparkError as exc:
        raise p.OperationFailed(p.Failure("fabric", str(exc))) from None


def non_carry_over(req: p.NonCarryOver, report: p.Report) -> p.NonCarryOverAnswer:
    return p.NonCarryOverAnswer(str(write_non_carry_over(Path(req.config_root))))
