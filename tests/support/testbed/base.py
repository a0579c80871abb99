"""What every part of the testbed shares: its constants, its error, a node."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import List

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_STATE_DIR = "/tmp/dspark-testbed"
DEFAULT_PREFIX = "dspark"
DEFAULT_SUBNET = "10.213.0"
FABRIC_IF = "fab0"
BRIDGE_IF = "br0"
SSH_PORT = 22
STATE_FILE = "testbed.json"
MARKER_FILE = ".dspark-testbed"
SSHD = "/usr/sbin/sshd"
TOOLS = ("unshare", "nsenter", "ip", "mount", "umount", "sleep", "ssh", "ssh-keygen")
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")  # no , : = or blanks (overlay options)
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,10}$")


class TestbedError(RuntimeError):
    """The testbed could not be built, entered or torn down."""

    __test__ = False  # not a pytest test class


def default_venv() -> str:
    """The venv to overlay: $DSPARK_TESTBED_VENV, the running venv, else <repo>/.venv."""
    env = os.environ.get("DSPARK_TESTBED_VENV")
    if env:
        return env
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return sys.prefix
    return str(REPO_ROOT / ".venv")


def node_names(count: int) -> List[str]:
    if not 1 <= count <= 200:
        raise TestbedError(f"--nodes must be between 1 and 200, got {count}")
    return ["head"] + [f"worker{i}" for i in range(1, count)]


@dataclasses.dataclass(frozen=True)
class Node:
    name: str  # "head", "worker1", ...
    ip: str  # fabric address, 10.213.0.N
    hostname: str  # "dspark-head", ...
    netns: str  # name under /run/netns (ip netns exec NETNS ...)
    holder_pid: int  # the process holding the namespaces (nsenter -t)
    is_head: bool

    @property
    def ifname(self) -> str:
        return FABRIC_IF
