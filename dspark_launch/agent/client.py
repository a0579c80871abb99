"""The launcher end of the agent protocol: one `NodeAgent` per node; `call(request)` for every operation.

`call` sends a typed request over the node's transport and returns the typed answer its
operation declares (protocol.OPERATIONS, which also names the step and the timeout);
progress lines the agent writes on the way go to the reporter. A failure on
the node (or a node that cannot be reached) raises ClusterFailure naming the node and
the step; a node whose launcher version differs raises VersionMismatch before anything
was started there (the first contact of every command is a read-only operation).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TypeVar

from dspark_launch import __version__
from dspark_launch.agent import protocol as p
from dspark_launch.agent.codec import DecodeError, from_data, to_data
from dspark_launch.agent.container_transport import ContainerTransport
from dspark_launch.agent.transport import AGENT_MODULE, LocalTransport, NodeUnreachable, Transport
from dspark_launch.errors import ClusterFailure, ConfigError, VersionMismatch
from dspark_launch.node.vllm_offer import VllmOffer
from dspark_launch.report import Reporter, SilentReporter

A = TypeVar("A")
# What the interpreter says when the node's dspark-launch predates dspark_launch.agent (protocol 6), or its
# node end's module name (`agent/server.py` before): `python -m` finds no such module.
OLDER_AGENTS = ("No module named 'dspark_launch.agent'", f"No module named {AGENT_MODULE}")


def _show(reporter: Reporter, progress: p.Progress) -> None:
    if progress.kind == "waiting":
        reporter.waiting(progress.message, progress.elapsed, progress.timeout)
    elif progress.kind == "warn":
        reporter.warn(progress.message)
    else:
        reporter.phase(progress.message)


class NodeAgent:
    """Talks to one node's agent; `label` names the node in every error."""

    def __init__(self, label: str, transport: Transport, reporter: Reporter | None = None):
        self.label = label
        self.transport = transport
        self.reporter = reporter or SilentReporter()

    def call(self, request: p.Request[A], step: str = "", timeout: float | None = None) -> A:
        """Send `request` (a protocol dataclass); returns the answer type it declares (`Request[Answer]`,
        the same as its operation's in protocol.OPERATIONS). `step` and `timeout` default to the operation's."""
        operation = p.operation_of(request)
        op, answer_type = operation.name, operation.answer
        step = step or operation.step
        if operation.in_process and self.runs_here:
            answer: A = self._call_here(operation, request, step)
            return answer
        timeout = operation.timeout_for(request) if timeout is None else timeout
        line = json.dumps(
            {"protocol": p.PROTOCOL_VERSION, "launcher": __version__, "op": op, "request": to_data(request)}
        )
        final: list[dict[str, Any]] = []

        def on_line(text: str) -> None:
            try:
                message = json.loads(text)
            except json.JSONDecodeError:
                return
            if not isinstance(message, dict):
                return
            if "progress" in message:
                try:
                    _show(self.reporter, from_data(p.Progress, message["progress"]))
                except DecodeError:
                    pass
            elif "answer" in message or "failure" in message:
                final.append(message)

        try:
            self.transport.exchange(line, timeout, on_line)
        except NodeUnreachable as exc:
            if any(older in str(exc) for older in OLDER_AGENTS):  # an older dspark-launch: no such agent module
                raise VersionMismatch(
                    self.label,
                    "version",
                    f"{exc}: its dspark-launch is older than {__version__} "
                    f"(protocol {p.PROTOCOL_VERSION}); install the same dspark-launch on every "
                    f"node ({self.transport.python})",
                ) from None
            raise ClusterFailure(self.label, step, str(exc)) from None
        if not final:
            raise ClusterFailure(self.label, step, f"{self.transport.description}: the agent gave no answer")
        return self._result(final[-1], answer_type, step)  # the operation's answer: the request's `A`

    @property
    def runs_here(self) -> bool:
        """Whether this node's agent would be this interpreter on this machine (the same code, hence the same
        launcher and protocol version): its read-only operations are then answered without an agent process."""
        # Paths compared as written, links not followed: a venv's python is a link to the base interpreter,
        # which another venv (another dspark-launch) shares.
        return (
            isinstance(self.transport, LocalTransport)
            and bool(sys.executable)
            and os.path.abspath(self.transport.python) == os.path.abspath(sys.executable)
        )

    def _call_here(self, operation: p.Operation, request: Any, step: str) -> Any:
        from dspark_launch.agent.node_end import handler

        try:
            return handler(operation.name)(request, lambda progress: _show(self.reporter, progress))
        except p.OperationFailed as exc:
            return self._result({"failure": to_data(exc.failure)}, operation.answer, step)
        except Exception as exc:  # as the agent reports it
            raise ClusterFailure(self.label, step, f"{type(exc).__name__}: {exc}") from None

    def _result(self, message: dict[str, Any], answer_type: type[A], step: str) -> A:
        try:
            if "answer" in message:
                return from_data(answer_type, message["answer"])
            failure = from_data(p.Failure, message["failure"])
        except DecodeError as exc:
            raise ClusterFailure(self.label, step, f"unreadable answer ({exc})") from None
        if failure.step == p.VERSION_STEP:
            raise VersionMismatch(
                self.label,
                "version",
                f"{failure.detail}; install the same dspark-launch on every node ({self.transport.python})",
            )
        if failure.config_error:
            raise ConfigError(failure.detail)
        raise ClusterFailure(
            failure.node or self.label, failure.step if failure.node else step, failure.detail, failure.extra
        )

    def describe_vllm(self, config_path: str = "") -> VllmOffer:
        """The installed vLLM's serve flags and its dry boot on `config_path` (the placed model's config.json; ""
        the profile's shipped copy); kept on the node between calls unless it runs in a container (recreated
        on every start: nothing kept there would be read again)."""
        in_container = isinstance(self.transport, ContainerTransport)
        return self.call(p.DescribeVllm(keep=not in_container, config_path=config_path)).offer
