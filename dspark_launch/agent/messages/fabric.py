"""The fabric interface and its environment (handlers/fabric.py)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.agent.protocol import Request
from dspark_launch.node.values import FabricEnv, FabricRequest


@dataclass(frozen=True)
class InterfaceQuery(Request["InterfaceAnswer"]):
    ifname: str
    ip: str


@dataclass(frozen=True)
class InterfaceAnswer:
    exists: bool
    addresses: tuple[str, ...]
    has_ip: bool


@dataclass(frozen=True)
class FabricQuery(Request["FabricAnswer"]):
    """One node's fabric environment from its sysfs."""

    request: FabricRequest
    sysfs_root: str = ""  # tests only (DSPARK_TEST_SYSFS_ROOT forwarded by the launcher): a fake sysfs tree


@dataclass(frozen=True)
class FabricAnswer:
    fabric: FabricEnv


@dataclass(frozen=True)
class NonCarryOver(Request["NonCarryOverAnswer"]):
    """Head: write vLLM's list of variables it must not copy from the driver to its Ray workers."""

    config_root: str


@dataclass(frozen=True)
class NonCarryOverAnswer:
    path: str
