"""Node operations for the model tests: each node's checks through its agent (the head's as a local
child, a worker's over SSH), exactly as `dspark model ...` reaches them; plus mount helpers that
give one testbed node its own view of a path.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field

from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.transport import LocalTransport, SSHTransport
from dspark_launch.model.copy import SSHTarget
from dspark_launch.model.onnodes import AgentModelOps
from dspark_launch.node.model_files import FileProblem, VerifyReport


@dataclass
class CountedTransport:
    """A node's agent transport that records the operation of every exchange (one agent round trip
    each), for tests and benches that count what a command asks the nodes."""

    inner: object  # the real transport
    ops: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def description(self) -> str:
        return self.inner.description

    @property
    def python(self) -> str:
        return self.inner.python

    def exchange(self, request_line: str, timeout: float, on_line) -> None:
        with self._lock:
            self.ops.append(json.loads(request_line)["op"])
        self.inner.exchange(request_line, timeout, on_line)


def agent_calls(ops: AgentModelOps) -> list[str]:
    """The operations sent to `ops`'s agent so far (in order), when built with counted=True."""
    return list(ops.agent.transport.ops)


def report_from(data: dict) -> VerifyReport:
    return VerifyReport(
        data["folder"],
        data["full"],
        data["files_checked"],
        data["bytes_checked"],
        tuple(FileProblem(**p) for p in data["problems"]),
    )


def head_ops(python: str, counted: bool = False) -> AgentModelOps:
    """The head's checks through its agent (a local child), as `dspark model ...` reaches it."""
    transport = LocalTransport(python)
    return AgentModelOps("head", NodeAgent("head", CountedTransport(transport) if counted else transport))


def worker_ops(name: str, target: SSHTarget, python: str, counted: bool = False) -> AgentModelOps:
    """A worker's checks through its agent over SSH, with the same settings as the copy."""
    transport = SSHTransport(
        target.host,
        python,
        target.port,
        target.user,
        target.key,
        target.host_key_check,
        target.connect_timeout,
        target.extra_options,
    )
    return AgentModelOps(name, NodeAgent(name, CountedTransport(transport) if counted else transport))


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
