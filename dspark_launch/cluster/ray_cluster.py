"""Ray across the nodes: pre-flight, start, join, verify, hotfix, stop; with rollback.

The head runs Ray locally; workers are reached through their transport. Every
process started carries the node's DSPARK_OWNER marker, so stopping touches only
what this launcher started, never a machine-wide `ray stop`.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from dspark_launch import __version__
from dspark_launch.cluster.spec import ClusterSpec, Node
from dspark_launch.cluster.state import ClusterState, NodeRecord, ray_token
from dspark_launch.cluster.transport import NodeUnreachable
from dspark_launch.errors import DsparkError

AGENT_TIMEOUT_S = 60
RAY_START_TIMEOUT_S = 180
DASHBOARD_PORT = 8265
# Ray 2.60 binds each worker's (and driver's) gRPC server to every interface; keep them in
# Ray's default range, named here so a firewall rule and docs/security.md can rely on it.
WORKER_PORTS = (10002, 19999)
VERSION_ROWS = ("python", "vllm", "ray", "torch", "cuda", "driver", "dspark_launch", "scheduler_sha256")


class Reporter(Protocol):
    def phase(self, message: str) -> None: ...

    def waiting(self, message: str, elapsed: float, timeout: float) -> None: ...

    def warn(self, message: str) -> None: ...


class ClusterFailure(DsparkError):
    """A step failed on a node; `node` and `step` say where."""

    def __init__(self, node: str, step: str, detail: str, extra: list[str] | None = None):
        super().__init__(f"{node}: {step}: {detail}")
        self.node, self.step, self.detail = node, step, detail
        self.extra = extra or []  # lines to show after the error (a version matrix, ...)


@dataclass(frozen=True)
class Matrix:
    rows: dict[str, dict[str, str | None]]  # row -> node name -> value

    @property
    def differing(self) -> list[str]:
        return [row for row, values in self.rows.items() if len(set(values.values())) > 1]

    def lines(self, nodes: list[str]) -> list[str]:
        width = max(len(r) for r in self.rows) + 2
        out = ["  " + "".ljust(width) + "  ".join(n.ljust(20) for n in nodes)]
        for row, values in self.rows.items():
            mark = "!" if row in self.differing else " "
            cells = "  ".join(str(values.get(n))[:20].ljust(20) for n in nodes)
            out.append(f"{mark} {row.ljust(width)}{cells}")
        return out


def call(node: Node, request: dict, step: str, timeout: float = AGENT_TIMEOUT_S) -> dict:
    try:
        answer = node.transport.call(request, timeout)
    except NodeUnreachable as exc:
        raise ClusterFailure(node.label, step, str(exc)) from None
    if not answer.get("ok"):
        raise ClusterFailure(node.label, step, answer.get("error", "agent failed"))
    return answer


def ray_temp_dir(spec: ClusterSpec, node: Node) -> str:
    # Ray's unix sockets live under the temp dir and must stay under 108 bytes: keep it short.
    digest = hashlib.sha256(str(spec.state_dir).encode()).hexdigest()[:8]
    return f"/tmp/dspark-{digest}/{node.name}"


def auth_env(spec: ClusterSpec) -> dict[str, str]:
    env = {"RAY_AUTH_MODE": spec.auth_mode}
    if spec.auth_mode == "token":
        env["RAY_AUTH_TOKEN"] = ray_token(spec.state_dir, spec.auth_token)
    return env


def node_env(spec: ClusterSpec, node: Node, token_env: dict[str, str]) -> dict[str, str]:
    """The environment of everything started on `node` (Ray workers inherit the raylet's)."""
    env = dict(spec.node_env)
    env.update({name: os.environ[name] for name in spec.forward_env if name in os.environ})
    env.update(token_env)
    env["VLLM_HOST_IP"] = node.ip
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # No Prometheus exporter in the dashboard agent: Ray binds it to every interface
    # (ray[default] installs only; docs/security.md lists what Ray 2.60 cannot bind).
    env["RAY_enable_metrics_collection"] = "0"
    return env


def ray_start_argv(spec: ClusterSpec, node: Node, python: str) -> list[str]:
    argv = [python, "-m", "ray.scripts.scripts", "start", "--node-ip-address", node.ip,
            "--num-gpus", str(spec.gpus_per_node), "--object-store-memory", str(spec.object_store_bytes),
            "--temp-dir", ray_temp_dir(spec, node), "--disable-usage-stats",
            "--min-worker-port", str(WORKER_PORTS[0]), "--max-worker-port", str(WORKER_PORTS[1])]
    if node.is_head:
        # --no-monitor: no autoscaler on a fixed set of nodes, and so no autoscaler metrics
        # server, which Ray 2.60 binds to 0.0.0.0:44217.
        argv += ["--head", "--port", str(spec.ray_port), "--no-monitor"]
        if spec.dashboard == "local":
            argv += ["--include-dashboard=true", "--dashboard-host", "127.0.0.1",
                     "--dashboard-port", str(DASHBOARD_PORT)]
        else:
            argv += ["--include-dashboard=false"]
    else:
        argv += ["--address", spec.ray_address]
    return argv


def security_warnings(spec: ClusterSpec) -> list[str]:
    """Lines to print before Ray starts, for settings that weaken the defaults."""
    if spec.auth_mode == "disabled":
        return [f"RAY_AUTH_MODE=disabled: anyone who reaches a Ray port on any node (GCS {spec.ray_address}) "
                "can run code there; use it only on an isolated fabric (default: token); see docs/security.md"]
    return []


def dashboard_hint(spec: ClusterSpec) -> str | None:
    """The SSH tunnel to the dashboard (bound to the head's 127.0.0.1), or None when it is off."""
    if spec.dashboard != "local":
        return None
    import getpass
    import socket

    return (f"Ray dashboard: http://127.0.0.1:{DASHBOARD_PORT} on the head only; from your desk: "
            f"ssh -N -L {DASHBOARD_PORT}:127.0.0.1:{DASHBOARD_PORT} {getpass.getuser()}@{socket.gethostname()} "
            f"(or the head's address on your network), then open http://127.0.0.1:{DASHBOARD_PORT}")


def preflight(spec: ClusterSpec, reporter: Reporter, nodes: list[Node]) -> dict[str, dict]:
    """Every check that can fail before anything starts on `nodes`; one line per failure."""
    probes = {}
    for node in nodes:
        reporter.phase(f"pre-flight {node.label}")
        request = {"op": "probe", "log_dir": str(spec.state_dir / "logs"),
                   "dashboard": node.is_head and spec.dashboard == "local"}
        probe = call(node, request, "ssh/agent" if not node.is_head else "agent", spec.ssh_timeout_s + 30)
        missing = [m for m, info in probe["modules"].items() if not info["found"]]
        if missing:
            raise ClusterFailure(node.label, "python", f"{probe['python']} cannot import {', '.join(missing)}")
        if probe.get("log_dir_error"):
            raise ClusterFailure(node.label, "log folder",
                                 f"{spec.state_dir / 'logs'} is not writable there ({probe['log_dir_error']})")
        if probe.get("dashboard_missing"):
            raise ClusterFailure(node.label, "dashboard",
                                 f"DSPARK_RAY_DASHBOARD=local needs Ray's dashboard packages, missing "
                                 f"{', '.join(probe['dashboard_missing'])}: pip install 'ray[default]' "
                                 f"(the same Ray version) in {probe['python']}'s environment, "
                                 "or set DSPARK_RAY_DASHBOARD=off")
        iface = call(node, {"op": "interface", "ifname": spec.fabric_ifname, "ip": node.ip}, "fabric interface")
        if not iface["exists"]:
            raise ClusterFailure(node.label, "fabric interface", f"no interface {spec.fabric_ifname}")
        if not iface["has_ip"]:
            raise ClusterFailure(node.label, "fabric interface",
                                 f"{spec.fabric_ifname} carries {', '.join(iface['addresses']) or 'no address'}, "
                                 f"not VLLM_HOST_IP {node.ip}")
        probes[node.name] = probe
    if not any(node.is_head for node in nodes):
        return probes
    port = call(spec.head, {"op": "port_free", "ip": spec.head.ip, "port": spec.ray_port}, "ray port")
    if not port["free"]:
        raise ClusterFailure(spec.head.label, "ray port", f"{spec.head.ip}:{spec.ray_port} is taken ({port['reason']})")
    return probes


class Bringup:
    """One `cluster up`: remembers what it started so a failure stops exactly that."""

    def __init__(self, spec: ClusterSpec, reporter: Reporter, python_of: Callable[[Node], str]):
        self.spec = spec
        self.reporter = reporter
        self.python_of = python_of
        self.run_id = secrets.token_hex(4)
        self.records: dict[str, NodeRecord] = {}
        self.token_env = auth_env(spec)

    def record(self, node: Node) -> NodeRecord:
        if node.name not in self.records:
            self.records[node.name] = NodeRecord(
                name=node.name, ip=node.ip, ssh_host=node.ssh_host, marker=f"dspark-{self.run_id}-{node.name}",
                ray_temp_dir=ray_temp_dir(self.spec, node),
                ray_log=str(self.spec.state_dir / "logs" / f"ray-start-{node.name}.log"))
        return self.records[node.name]

    def start_ray(self, node: Node) -> None:
        record = self.record(node)
        self.reporter.phase(f"starting Ray on {node.label}")
        call(node, {"op": "forget_ray_address", "temp_dir": record.ray_temp_dir}, "ray start")
        answer = call(node, {"op": "run", "argv": ray_start_argv(self.spec, node, self.python_of(node)),
                             "env": node_env(self.spec, node, self.token_env), "marker": record.marker,
                             "log": record.ray_log, "timeout": RAY_START_TIMEOUT_S, "sessions": record.sessions},
                      "ray start", RAY_START_TIMEOUT_S + 30)
        record.sessions.append(answer["session"])
        record.processes = answer["processes"]
        if answer["returncode"] != 0:
            tail = call(node, {"op": "tail", "paths": [record.ray_log], "lines": 15}, "ray log")["lines"]
            raise ClusterFailure(node.label, "ray start", f"exit {answer['returncode']}; log {record.ray_log}", tail)

    def rollback(self) -> list[str]:
        """Stop everything this run started, on every node; returns what could not be stopped."""
        problems = []
        for name, record in self.records.items():
            node = self.spec.node(name)
            try:
                answer = stop_node(node, record)
                if answer["left"]:
                    problems.append(f"{node.label}: pids {answer['left']} survived SIGKILL")
            except ClusterFailure as exc:
                problems.append(str(exc))
        return problems


def _python_signal_handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signal_handlers(saved: dict) -> None:
    """Ray's core worker installs C-level handlers (SIGTERM aborts the process with a stack dump)
    and may reset them at shutdown: put ours back so SIGTERM still unwinds through the rollback."""
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


def ray_driver(spec: ClusterSpec, token_env: dict[str, str]):
    """Connect this process to the cluster as a Ray driver (lazy import); end it with `ray_shutdown`."""
    os.environ.update(token_env)
    import ray

    if not ray.is_initialized():
        saved = _python_signal_handlers()
        try:
            ray.init(address=spec.ray_address, logging_level="ERROR", log_to_driver=False,
                     configure_logging=True, include_dashboard=False)
        finally:
            _restore_signal_handlers(saved)
    return ray


def ray_shutdown(ray) -> None:
    saved = _python_signal_handlers()
    try:
        ray.shutdown()
    finally:
        _restore_signal_handlers(saved)


def alive_ray_nodes(ray, ignore: set[str] = frozenset()) -> dict[str, dict]:
    return {n["NodeManagerAddress"]: n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in ignore}


def _alive_registrations(ray, ignore: set[str]) -> dict[str, int]:
    """How many nodes Ray lists as alive per IP (2 while a killed raylet's entry lingers beside its successor)."""
    counts: dict[str, int] = {}
    for n in ray.nodes():
        if n.get("Alive") and n["NodeID"] not in ignore:
            counts[n["NodeManagerAddress"]] = counts.get(n["NodeManagerAddress"], 0) + 1
    return counts


def wait_for_nodes(spec: ClusterSpec, ray, reporter: Reporter, ignore: set[str] = frozenset()) -> dict[str, dict]:
    """Until every node is registered, once: `ignore` holds node IDs of registrations made before
    a repair, which Ray may still list as alive until its health check drops them."""
    expected = {n.ip for n in spec.nodes}
    start = time.monotonic()
    while True:
        registrations = _alive_registrations(ray, ignore)
        if all(registrations.get(ip) == 1 for ip in expected):
            return alive_ray_nodes(ray, ignore)
        alive = set(registrations)
        elapsed = time.monotonic() - start
        missing = ", ".join(n.label for n in spec.nodes if registrations.get(n.ip) != 1)
        if elapsed > spec.join_timeout_s:
            extra = sorted(set(alive) - expected)
            detail = f"not joined after {spec.join_timeout_s} s"
            if extra:
                detail += f"; Ray sees unexpected node IP(s) {', '.join(extra)}: a node registered another NIC's IP"
            raise ClusterFailure(missing, "join", detail)
        reporter.waiting(f"waiting for {missing} to join Ray", elapsed, spec.join_timeout_s)
        time.sleep(1.0)


def run_pinned(ray, node_id: str, fn, timeout: float):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=0)(fn)
    ref = remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote()
    return ray.get(ref, timeout=timeout)


def verify_nodes(spec: ClusterSpec, ray, alive: dict[str, dict], reporter: Reporter) -> dict[str, dict]:
    """IPs, GPUs and the version matrix, from Ray's own view and a task pinned to each node."""
    from dspark_launch.cluster import node_tasks

    unexpected = sorted(set(alive) - {n.ip for n in spec.nodes})
    if unexpected:
        raise ClusterFailure(", ".join(unexpected), "registered IP",
                             "a node joined Ray with an IP that is not configured (another NIC's?)")
    rows = {}
    for node in spec.nodes:
        info = alive[node.ip]
        gpus = info.get("Resources", {}).get("GPU", 0)
        if gpus != spec.gpus_per_node:
            raise ClusterFailure(node.label, "GPUs", f"Ray sees {gpus:g} GPU(s), expected {spec.gpus_per_node}")
        reporter.phase(f"checking versions on {node.label}")
        rows[node.name] = run_pinned(ray, info["NodeID"], node_tasks.node_report, 120)
    matrix = Matrix({row: {name: r.get(row) for name, r in rows.items()} for row in VERSION_ROWS})
    if matrix.differing:
        raise ClusterFailure(", ".join(rows), "version matrix", f"nodes differ in {', '.join(matrix.differing)}",
                             matrix.lines(list(rows)))
    return rows


def hotfix_all(spec: ClusterSpec, ray, alive: dict[str, dict], reporter: Reporter) -> dict[str, dict]:
    """Apply then verify on every node; any node failing aborts (after all have reported)."""
    from dspark_launch.cluster import node_tasks

    reports, failures = {}, []
    for node in spec.nodes:
        reporter.phase(f"applying the scheduler hotfix on {node.label}")
        report = run_pinned(ray, alive[node.ip]["NodeID"], node_tasks.apply_hotfix, 120)
        reports[node.name] = report
        failed = report["apply"] if report["apply"]["code"] != 0 else report["status"]
        if failed["code"] != 0:
            failures.append((node, failed["message"]))
    if failures:
        node, message = failures[0]
        others = [f"{n.label}: {m}" for n, m in failures[1:]]
        raise ClusterFailure(node.label, "hotfix", message, others)
    return reports


def new_state(spec: ClusterSpec, bringup: Bringup) -> ClusterState:
    return ClusterState(ray_address=spec.ray_address, config_digest=spec.config_digest, started_at=time.time(),
                        launcher_version=__version__, nodes=[bringup.records[n.name] for n in spec.nodes])


def stop_node(node: Node, record: NodeRecord) -> dict:
    return call(node, {"op": "stop", "marker": record.marker, "processes": record.processes,
                       "sessions": record.sessions}, "stop", 90)


CORE_PROCESSES = ("raylet", "gcs_server")


def core_processes(record: NodeRecord) -> list[dict]:
    """The Ray daemons a node cannot lose (idle Ray workers come and go by design)."""
    return [p for p in record.processes if any(name in p["cmd"].split(" ")[0] for name in CORE_PROCESSES)]


def node_alive(node: Node, record: NodeRecord) -> bool:
    """Whether the node's Ray daemons recorded at start are still the same processes."""
    core = core_processes(record)
    if not core:
        return False
    answer = call(node, {"op": "alive", "processes": core}, "status", 30)
    return all(answer["alive"])


def ray_log_paths(node: Node, record: NodeRecord) -> list[str]:
    paths = [record.ray_log]
    found = call(node, {"op": "glob", "root": record.ray_temp_dir, "pattern": "session_latest/logs/raylet.out"},
                 "logs")["paths"]
    return paths + found
