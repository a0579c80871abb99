"""The launcher end of the agent protocol: one `NodeAgent` per node, one method per operation.

Each method sends a typed request over the node's transport and returns the typed
answer; progress lines the agent writes on the way go to the reporter. A failure on
the node (or a node that cannot be reached) raises ClusterFailure naming the node and
the step; a node whose launcher version differs raises VersionMismatch before anything
was started there (the first contact of every command is a read-only operation).
"""

from __future__ import annotations

import json
from typing import Any, Protocol, TypeVar

from dspark_launch import __version__
from dspark_launch.cluster import protocol as p
from dspark_launch.cluster.codec import DecodeError, from_data, to_data
from dspark_launch.cluster.container_transport import ContainerTransport
from dspark_launch.cluster.fabric import FabricEnv, FabricRequest
from dspark_launch.cluster.transport import NodeUnreachable, Transport
from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.model.manifest import Manifest
from dspark_launch.model.node_check import DiskSpace, VerifyReport
from dspark_launch.profiles.offer import VllmOffer

A = TypeVar("A")
AGENT_TIMEOUT_S = 60
HOTFIX_TIMEOUT_S = 120
MODEL_VERIFY_TIMEOUT_S = 3 * 3600  # a full sha256 of 160 GB reads every byte (minutes at disk speed)


class Reporter(Protocol):
    def phase(self, message: str) -> None: ...

    def waiting(self, message: str, elapsed: float, timeout: float) -> None: ...

    def warn(self, message: str) -> None: ...


class SilentReporter:
    def phase(self, message: str) -> None:
        pass

    def waiting(self, message: str, elapsed: float, timeout: float) -> None:
        pass

    def warn(self, message: str) -> None:
        pass


class ClusterFailure(DsparkError):
    """A step failed on a node; `node` and `step` say where."""

    def __init__(self, node: str, step: str, detail: str, extra: list[str] | tuple[str, ...] | None = None):
        super().__init__(f"{node}: {step}: {detail}")
        self.node, self.step, self.detail = node, step, detail
        self.extra = list(extra or [])  # lines to show after the error (a version matrix, ...)


class VersionMismatch(ClusterFailure):
    """The node runs another launcher (or protocol) version: nothing is started anywhere."""


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

    def call(self, request: Any, step: str = "", timeout: float = AGENT_TIMEOUT_S) -> Any:
        """Send `request` (a protocol dataclass); returns the answer type its operation declares."""
        op = p.OP_OF_REQUEST[type(request)]
        _, answer_type = p.OPERATIONS[op]
        step = step or op
        line = json.dumps({"protocol": p.PROTOCOL_VERSION, "launcher": __version__, "op": op,
                           "request": to_data(request)})
        final: list[dict] = []

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
            raise ClusterFailure(self.label, step, str(exc)) from None
        if not final:
            raise ClusterFailure(self.label, step, f"{self.transport.description}: the agent gave no answer")
        return self._result(final[-1], answer_type, step)

    def _result(self, message: dict, answer_type: type, step: str) -> Any:
        try:
            if "answer" in message:
                return from_data(answer_type, message["answer"])
            failure = from_data(p.Failure, message["failure"])
        except DecodeError as exc:
            raise ClusterFailure(self.label, step, f"unreadable answer ({exc})") from None
        if failure.step == "version":
            raise VersionMismatch(self.label, "version", f"{failure.detail}; install the same dspark-launch "
                                  f"on every node ({self.transport.python})")
        if failure.config_error:
            raise ConfigError(failure.detail)
        raise ClusterFailure(failure.node or self.label, failure.step if failure.node else step, failure.detail,
                             failure.extra)

    # One method per operation ------------------------------------------------------------------

    def hello(self) -> p.HelloAnswer:
        return self.call(p.Hello(), "agent", 30)

    def probe(self, log_dir: str = "", dashboard: bool = False, timeout: float = AGENT_TIMEOUT_S) -> p.ProbeAnswer:
        return self.call(p.Probe(log_dir, dashboard), "agent", timeout)

    def interface(self, ifname: str, ip: str) -> p.InterfaceAnswer:
        return self.call(p.InterfaceQuery(ifname, ip), "fabric interface")

    def port_free(self, ip: str, port: int) -> p.PortAnswer:
        return self.call(p.PortQuery(ip, port), "ray port")

    def meminfo(self) -> p.MemoryAnswer:
        return self.call(p.MemoryQuery(), "memory")

    def run(self, request: p.Run, step: str, timeout: float) -> p.RunAnswer:
        return self.call(request, step, timeout)

    def spawn(self, request: p.Spawn, step: str) -> p.SpawnAnswer:
        return self.call(request, step)

    def alive(self, processes: tuple[p.Process, ...], step: str = "status", timeout: float = 30) -> tuple[bool, ...]:
        return self.call(p.AliveQuery(tuple(processes)), step, timeout).alive

    def stop(self, request: p.Stop, step: str = "stop") -> p.StopAnswer:
        return self.call(request, step, 90 + request.drain_s)

    def tail(self, paths: list[str] | tuple[str, ...], lines: int = 40) -> tuple[str, ...]:
        return self.call(p.Tail(tuple(paths), lines), "logs").lines

    def read(self, path: str, offset: int) -> p.ReadAnswer:
        return self.call(p.ReadLog(path, offset), "logs")

    def glob(self, root: str, pattern: str) -> tuple[str, ...]:
        return self.call(p.Glob(root, pattern), "logs").paths

    def ray_nodes(self, address: str, env: dict[str, str], timeout: float = 20) -> tuple[p.RayNode, ...]:
        return self.call(p.RayNodesQuery(address, env), "ray nodes", timeout).nodes

    def ray_checks(self, request: p.RayChecks, timeout: float) -> p.RayChecksAnswer:
        return self.call(request, "ray checks", timeout)

    def check_serve_args(self, serve_args: tuple[str, ...]) -> str | None:
        return self.call(p.ServeArgsCheck(tuple(serve_args)), "serve arguments", 300).refused

    # model weights (issue 12) -------------------------------------------------------------------

    def model_verify(self, folder: str, manifest: Manifest, full: bool,
                     only: tuple[str, ...] | None = None, caches: tuple[str, ...] = ()) -> VerifyReport:
        return self.call(p.ModelVerify(folder, manifest, full, only, caches), "model verify",
                         MODEL_VERIFY_TIMEOUT_S if full else 120)

    def model_fast_check(self, folder: str, stamp: str, caches: tuple[str, ...] = ()) -> VerifyReport:
        return self.call(p.ModelFastCheck(folder, stamp, caches), "model check", 120)

    def model_free_space(self, path: str) -> DiskSpace:
        return self.call(p.ModelDiskQuery(path), "model disk")

    # --- Ray's private temp folders (security review, issue 14)
    def ray_temp_dir(self, name: str) -> str:
        return self.call(p.RayTempDir(name), "ray temp folder").path
    # model profile and fabric (issue 11)

    def describe_vllm(self) -> VllmOffer:
        in_container = isinstance(self.transport, ContainerTransport)
        return self.call(p.DescribeVllm(keep=not in_container), "installed vLLM", 300).offer

    def fabric_env(self, request: FabricRequest, sysfs_root: str = "") -> FabricEnv:
        return self.call(p.FabricQuery(request, sysfs_root), "fabric").fabric

    def non_carry_over(self, config_root: str) -> str:
        return self.call(p.NonCarryOver(config_root), "vLLM config folder").path

    # each node's version row and hotfix, on its own agent (launch time) --------------------------

    def node_versions(self) -> p.VersionRow:
        return self.call(p.VersionQuery(), "versions")

    def apply_hotfix(self) -> p.HotfixReport:
        return self.call(p.HotfixApply(), "hotfix", HOTFIX_TIMEOUT_S)

    def scheduler_control(self, path: str, text: str = "", remove: bool = False) -> p.SchedulerControlAnswer:
        return self.call(p.SchedulerControl(path, text, remove), "scheduler control file")
