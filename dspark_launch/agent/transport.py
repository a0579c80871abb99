"""How the launcher reaches a node's agent: a local child (the head) or SSH (workers).

The command line is fixed (`PYTHON -m dspark_launch.agent.node_end`, quoted with shlex
for SSH); the request, secrets included, goes over stdin as one JSON line and the
agent's lines come back on stdout as they are written (progress, then the answer).
The head's agent starts with the same small login-like environment sshd gives a
worker's, never the operator's whole shell: what a node's processes see is what the
launcher declares in each request.
"""

from __future__ import annotations

import atexit
import os
import pwd
import selectors
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from dspark_launch.agent.protocol import MAX_LINE
from dspark_launch.errors import DsparkError

AGENT_MODULE = "dspark_launch.agent.node_end"
# What a login session carries; the head's agent gets these and nothing else from the launcher's shell.
LOGIN_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


class NodeUnreachable(DsparkError):
    """The node could not be reached or its agent did not answer."""


_in_flight: set[subprocess.Popen] = set()  # agent processes being talked to, from any thread
_in_flight_lock = threading.Lock()


def kill_in_flight() -> None:
    """End every agent exchange still running (an interrupt is unwinding, or the launcher exits with a
    question it no longer needs answered): their threads get EOF at once."""
    with _in_flight_lock:
        for proc in _in_flight:
            if proc.poll() is None:
                proc.kill()


atexit.register(kill_in_flight)


class Transport(Protocol):
    description: str
    python: str  # the interpreter that runs the agent (and Ray, vLLM) on that node

    def exchange(self, request_line: str, timeout: float, on_line: Callable[[str], None]) -> None:
        """Send one request line; call `on_line` with each line the agent writes, until it exits."""


def _stream(
    argv: list[str],
    env: dict[str, str] | None,
    request_line: str,
    timeout: float,
    on_line: Callable[[str], None],
    description: str,
    cwd: str | None = None,
) -> tuple[int, str]:
    """Run argv, feed it the request, hand each stdout line on; returns (exit code, last stderr line)."""
    try:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd
        )
    except OSError as exc:
        raise NodeUnreachable(f"{description}: cannot run {argv[0]}: {exc.strerror}") from None
    stderr_tail = b""
    with _in_flight_lock:
        _in_flight.add(proc)
    try:
        try:
            proc.stdin.write(request_line.encode() + b"\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it ended before reading (an SSH that could not connect): its exit code and stderr say why
        deadline = time.monotonic() + timeout
        pending = b""
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            selector.register(proc.stderr, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NodeUnreachable(f"{description}: the agent did not answer within {timeout:.0f} s")
                for key, _ in selector.select(min(left, 1.0)):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    elif key.fileobj is proc.stderr:
                        stderr_tail = (stderr_tail + chunk)[-4096:]
                    else:
                        pending += chunk
                        *lines, pending = pending.split(b"\n")
                        if len(pending) > MAX_LINE or any(len(line) > MAX_LINE for line in lines):
                            raise NodeUnreachable(
                                f"{description}: the agent sent a reply line longer than "
                                f"{MAX_LINE} bytes (1 MiB); not read, the agent was stopped"
                            )
                        for line in lines:
                            on_line(line.decode(errors="replace"))
        if pending:
            on_line(pending.decode(errors="replace"))
        code = proc.wait()
    finally:
        with _in_flight_lock:
            _in_flight.discard(proc)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    last = (stderr_tail.decode(errors="replace").strip().splitlines() or [""])[-1]
    return code, last


@dataclass(frozen=True)
class LocalTransport:
    python: str = sys.executable
    description: str = "local"

    def exchange(self, request_line: str, timeout: float, on_line: Callable[[str], None]) -> None:
        env = {name: os.environ[name] for name in LOGIN_ENV if name in os.environ}
        entry = pwd.getpwuid(os.geteuid())  # as sshd sets them for a worker's agent, whatever `sudo -E` kept
        env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
        # cwd "/": `python -m` puts the working folder first on sys.path, and the launcher's (a checkout,
        # say) must not shadow the head's installed packages.
        code, last = _stream(
            [self.python, "-m", AGENT_MODULE], env, request_line, timeout, on_line, self.description, cwd="/"
        )
        if code != 0:
            raise NodeUnreachable(f"{self.description}: {self.python}: {last or 'no answer'} (exit {code})")


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
        argv = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={self.connect_timeout}",
            "-o",
            f"StrictHostKeyChecking={self.host_key_check}",
            "-o",
            "ForwardAgent=no",
            "-o",
            "ClearAllForwardings=yes",
            "-p",
            str(self.port),
        ]
        if self.key:
            argv += ["-i", self.key, "-o", "IdentitiesOnly=yes"]
        if self.user:
            argv += ["-l", self.user]
        argv += list(self.extra_options)
        # One quoted string for the remote shell; no operator data besides the interpreter path.
        return argv + ["--", self.host, shlex.join([self.python, "-m", AGENT_MODULE])]

    def exchange(self, request_line: str, timeout: float, on_line: Callable[[str], None]) -> None:
        code, last = _stream(self.argv(), None, request_line, timeout + self.connect_timeout, on_line, self.description)
        if code == 255:
            raise NodeUnreachable(f"{self.description}: SSH failed: {last or 'connection failed'}")
        if code != 0:
            raise NodeUnreachable(f"{self.description}: {self.python}: {last or 'no answer'} (exit {code})")
