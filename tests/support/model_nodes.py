"""Node operations for the model tests: each node's checks through its agent (the head's as a local
child, a worker's over SSH), exactly as `dspark model ...` reaches them; plus mount helpers that
give one testbed node its own view of a path.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.transport import LocalTransport, SSHTransport
from dspark_launch.model.copy import SSHTarget
from dspark_launch.agent.model_files import FileProblem, VerifyReport
from dspark_launch.model.onnodes import AgentModelOps

def report_from(data: dict) -> VerifyReport:
    return VerifyReport(data["folder"], data["full"], data["files_checked"], data["bytes_checked"],
                        tuple(FileProblem(**p) for p in data["problems"]))


def head_ops(python: str) -> AgentModelOps:
    """The head's checks through its agent (a local child), as `dspark model ...` reaches it."""
    return AgentModelOps("head", NodeAgent("head", LocalTransport(python)))


def worker_ops(name: str, target: SSHTarget, python: str) -> AgentModelOps:
    """A worker's checks through its agent over SSH, with the same settings as the copy."""
    transport = SSHTransport(target.host, python, target.port, target.user, target.key, target.host_key_check,
                             target.connect_timeout, target.extra_options)
    return AgentModelOps(name, NodeAgent(name, transport))


def mount_in_node(tb, node, argv_tail: list[str]) -> None:
    """`mount ARGS` inside one node's mount namespace only (the others keep the host's view)."""
    tb.exec(node, ["mount", *argv_tail], check=True)


def bind_in_node(tb, node, source: str, path: str) -> None:
    tb.exec(node, ["mkdir", "-p", path], check=True)
    mount_in_node(tb, node, ["--bind", source, path])


def tmpfs_in_node(tb, node, path: str, size: str) -> None:
    tb.exec(node, ["mkdir", "-p", path], check=True)
    mount_in_node(tb, node, ["-t", "tmpfs", "-o", f"size={size},mode=0755", "dspark-model-test", path])


def umount_in_node(tb, node, path: str) -> None:
    tb.exec(node, ["umount", "-l", path], check=False)


def asjson(value) -> str:
    return json.dumps(asdict(value))
