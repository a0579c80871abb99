"""The agent inside a node's container, reached through the node's host (`host_shell`).

`ContainerTransport` is a `Transport`: the agent runs inside the node's container
(`docker|podman exec -i NAME PYTHON -m dspark_launch.agent.node_end`), the request on
stdin as always. The agent package is mounted read-only into the container from the
host's install (see runtime.AGENT_MOUNT), so the image needs nothing of ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dspark_launch.agent.host_shell import HostShell, SSHHost
from dspark_launch.agent.transport import AGENT_MODULE, NodeUnreachable, _stream

# Where the launcher's package is mounted inside every node container (on PYTHONPATH there).
AGENT_MOUNT = "/opt/dspark-launch"


@dataclass(frozen=True)
class ContainerTransport:
    host: HostShell
    runtime: str  # "docker" or "podman": the command on the node's host
    container: str
    python: str = "python3"  # the image's interpreter (vLLM and Ray are installed for it)

    @property
    def description(self) -> str:
        return f"{self.host.description} container {self.container}"

    def exec_argv(self, *command: str) -> list[str]:
        """`RUNTIME exec -i` of `command` in the container, the launcher's package importable."""
        return [self.runtime, "exec", "-i", "--env", f"PYTHONPATH={AGENT_MOUNT}", self.container, *command]

    def exchange(self, request_line: str, timeout: float, on_line: Callable[[str], None]) -> None:
        command = self.host.command(self.exec_argv(self.python, "-m", AGENT_MODULE))
        code, last = _stream(command, None, request_line, timeout, on_line, self.description)
        if code == 255 and isinstance(self.host, SSHHost):
            raise NodeUnreachable(f"{self.description}: SSH failed: {last or 'connection failed'}")
        if code != 0:
            raise NodeUnreachable(f"{self.description}: {self.python}: {last or 'no answer'} (exit {code})")


@dataclass(frozen=True)
class OneShotContainerTransport:
    """The agent in a short-lived container (`RUNTIME run --rm -i`) from the node's checked image: the
    node-side model checks with no node container up, in the image's Python like the node container's agent."""

    host: HostShell
    runtime: str
    image: str  # the image id checked on every node
    run_args: tuple[str, ...]  # between `run --rm -i` and the image: mounts, env, label, network
    python: str = "python3"

    @property
    def description(self) -> str:
        return f"{self.host.description} {self.runtime} run --rm"

    def run_argv(self) -> list[str]:
        return [
            self.runtime,
            "run",
            "--rm",
            "-i",
            *self.run_args,
            "--entrypoint",
            self.python,
            self.image,
            "-m",
            AGENT_MODULE,
        ]

    def exchange(self, request_line: str, timeout: float, on_line: Callable[[str], None]) -> None:
        code, last = _stream(self.host.command(self.run_argv()), None, request_line, timeout, on_line, self.description)
        if code == 255 and isinstance(self.host, SSHHost):
            raise NodeUnreachable(f"{self.description}: SSH failed: {last or 'connection failed'}")
        if code != 0:
            raise NodeUnreachable(f"{self.description}: {self.python}: {last or 'no answer'} (exit {code})")
