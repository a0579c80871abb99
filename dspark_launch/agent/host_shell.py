"""Commands on a node's host: this machine (`LocalHost`) or a worker over SSH (`SSHHost`).

`HostShell` runs an argv on the machine that holds a node's container runtime: this
machine (`LocalHost`) or a worker reached with the same SSH settings as its agent
(`SSHHost`, the argv quoted with shlex into the one string ssh sends). The container
runtime module uses it to create, inspect and remove containers; `container_transport`
runs the agent in a node's container through it.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from typing import Protocol, Sequence

from dspark_launch.agent.transport import NodeUnreachable, SSHTransport


class HostShell(Protocol):
    description: str

    def run(self, argv: Sequence[str], *, timeout: float, input: str | None = None) -> subprocess.CompletedProcess:
        """Run argv to completion on the node's host, text output captured; NodeUnreachable when it cannot."""

    def command(self, argv: Sequence[str]) -> list[str]:
        """The local command line that runs argv on the node's host."""


@dataclass(frozen=True)
class LocalHost:
    description: str = "local"

    def command(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def run(self, argv: Sequence[str], *, timeout: float, input: str | None = None) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise NodeUnreachable(f"{self.description}: {argv[0]} did not finish within {timeout:.0f} s") from None
        except OSError as exc:
            raise NodeUnreachable(f"{self.description}: cannot run {argv[0]}: {exc.strerror}") from None


@dataclass(frozen=True)
class SSHHost:
    ssh: SSHTransport  # the node's agent transport: same host, user, key, options

    @property
    def description(self) -> str:
        return self.ssh.description

    def command(self, argv: Sequence[str]) -> list[str]:
        # ssh.argv() ends with the agent's command line: swap it for ours, quoted the same way.
        return self.ssh.argv()[:-1] + [shlex.join(argv)]

    def run(self, argv: Sequence[str], *, timeout: float, input: str | None = None) -> subprocess.CompletedProcess:
        command = self.command(argv)
        limit = timeout + self.ssh.connect_timeout
        try:
            proc = subprocess.run(command, input=input, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise NodeUnreachable(f"{self.description}: {argv[0]} did not finish within {limit:.0f} s") from None
        if proc.returncode == 255:
            detail = (proc.stderr.strip().splitlines() or ["connection failed"])[-1]
            raise NodeUnreachable(f"{self.description}: SSH failed: {detail}")
        return proc
