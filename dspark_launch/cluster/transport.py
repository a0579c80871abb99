"""One interface for "run this agent request on that node": local and SSH behind it.

The remote command line is fixed (`PYTHON -m dspark_launch.cluster.agent`, quoted
with shlex); the request, secrets included, goes over stdin as JSON.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Protocol

from dspark_launch.errors import DsparkError

AGENT_MODULE = "dspark_launch.cluster.agent"


class NodeUnreachable(DsparkError):
    """The node could not be reached or its agent did not answer."""


class Transport(Protocol):
    description: str
    python: str  # the interpreter that runs the agent (and Ray) on that node

    def call(self, request: dict, timeout: float) -> dict: ...


def _parse_answer(description: str, proc: subprocess.CompletedProcess) -> dict:
    lines = proc.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        detail = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
        raise NodeUnreachable(f"{description}: {detail} (exit {proc.returncode})")
    return answer


@dataclass(frozen=True)
class LocalTransport:
    python: str = sys.executable
    description: str = "local"

    def call(self, request: dict, timeout: float) -> dict:
        try:
            proc = subprocess.run([self.python, "-m", AGENT_MODULE], input=json.dumps(request) + "\n",
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise NodeUnreachable(f"{self.description}: the agent did not answer within {timeout:.0f} s") from None
        except OSError as exc:
            raise NodeUnreachable(f"{self.description}: cannot run {self.python}: {exc.strerror}") from None
        return _parse_answer(self.description, proc)


@dataclass(frozen=True)
class SSHTransport:
    host: str
    python: str
    port: int = 22
    user: str = ""
    key: str = ""
    host_key_check: str = "yes"
    connect_timeout: int = 10
    extra_options: tuple[str, ...] = ()

    @property
    def description(self) -> str:
        return f"ssh {self.host}"

    def argv(self) -> list[str]:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}",
                "-o", f"StrictHostKeyChecking={self.host_key_check}", "-o", "ForwardAgent=no",
                "-o", "ClearAllForwardings=yes", "-p", str(self.port)]
        if self.key:
            argv += ["-i", self.key, "-o", "IdentitiesOnly=yes"]
        if self.user:
            argv += ["-l", self.user]
        argv += list(self.extra_options)
        # One quoted string for the remote shell; no operator data besides the interpreter path.
        return argv + ["--", self.host, shlex.join([self.python, "-m", AGENT_MODULE])]

    def call(self, request: dict, timeout: float) -> dict:
        try:
            proc = subprocess.run(self.argv(), input=json.dumps(request) + "\n", capture_output=True, text=True,
                                  timeout=timeout + self.connect_timeout)
        except subprocess.TimeoutExpired:
            raise NodeUnreachable(f"{self.description}: no answer within {timeout + self.connect_timeout:.0f} s") from None
        if proc.returncode == 255:
            detail = (proc.stderr.strip().splitlines() or ["connection failed"])[-1]
            raise NodeUnreachable(f"{self.description}: SSH failed: {detail}")
        return _parse_answer(self.description, proc)
