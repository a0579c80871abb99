"""Ray across the nodes, every node through its agent: pre-flight, start, checks, stop.

Every process started carries the node's DSPARK_OWNER marker, so stopping touches only
what this launcher started, never a machine-wide `ray stop`. The head is a node like
the others: its agent starts its Ray and reads Ray's node table for the join wait and the
IP and GPU checks (`agent/handlers/ray.py`); every node's agent reports its version row and applies the
hotfix while Ray starts (`hotfix_rollout`).
"""

from __future__ import annotations

import hashlib
import secrets

from dspark_launch.agent import protocol as p
from dspark_launch.cluster.parallel import Background, on_each
from dspark_launch.cluster.spec import ClusterSpec, Node
from dspark_launch.cluster.state import (
    NodeRecord,
    ProcessRecord,
    SessionRecord,
    ray_token,
    recorded,
    rotate_ray_token,
    wire_processes,
    wire_sessions,
)
from dspark_launch.errors import ClusterFailure, ConfigError
from dspark_launch.node.fabric import SYSFS_ROOT_VAR, FabricEnv
from dspark_launch.report import Reporter

RAY_START_TIMEOUT_S = 180
CHECKS_TIMEOUT_S = 60  # beyond the join wait (its own timeout): the IP and GPU checks
DASHBOARD_PORT = 8265
# Ray 2.60 binds each worker's (and driver's) gRPC server to every interface; keep them in
# Ray's default range, named here so a firewall rule and docs/security.md can rely on it.
WORKER_PORTS = (10002, 19999)
CORE_PROCESSES = ("raylet", "gcs_server")
# Ray's daemons and idle workers hold nothing we keep (the cluster is discarded) and some of them
# sit out SIGTERM: SIGKILL after this long. (`ray stop` waits up to 16 s; measured in bench/launch.py.)
RAY_STOP_GRACE_S = 2.0


def ray_temp_dir_name(spec: ClusterSpec, node: Node) -> str:
    """The node's Ray temp folder inside its user's private folder (`ray_dirs`): one per state folder."""
    digest = hashlib.sha256(str(spec.state_dir).encode()).hexdigest()[:8]
    return f"{digest}-{node.name}"


def auth_env(spec: ClusterSpec, create: bool = False) -> dict[str, str]:
    """Ray's auth settings for a client or a node; `create` (under the state lock only) generates the
    first token."""
    env = {"RAY_AUTH_MODE": spec.auth_mode}
    if spec.auth_mode == "token":
        env["RAY_AUTH_TOKEN"] = ray_token(spec.state_dir, spec.auth_token, create)
    return env


def node_env(spec: ClusterSpec, node: Node, token_env: dict[str, str], fabric: FabricEnv | None) -> dict[str, str]:
    """The declared environment of everything started on `node` (Ray workers inherit the raylet's):
    the node's own fabric variables among them, so vLLM's workers there use this node's values."""
    env = dict(spec.forwarded)  # first: the launcher's own values below always win over a forwarded name
    env.update(spec.node_env)
    env.update(fabric.env if fabric else ())
    env.update(token_env)
    env["VLLM_HOST_IP"] = node.ip
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # No Prometheus exporter in the dashboard agent: Ray binds it to every interface
    # (ray[default] installs only; docs/security.md lists what Ray 2.60 cannot bind).
    env["RAY_enable_metrics_collection"] = "0"
    return env


def ray_start_argv(spec: ClusterSpec, node: Node, temp_dir: str) -> list[str]:
    argv = [
        node.transport.python,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--node-ip-address",
        node.ip,
        "--num-gpus",
        str(spec.gpus_per_node),
        "--object-store-memory",
        str(spec.object_store_bytes),
        "--temp-dir",
        temp_dir,
        "--disable-usage-stats",
        "--min-worker-port",
        str(WORKER_PORTS[0]),
        "--max-worker-port",
        str(WORKER_PORTS[1]),
    ]
    if node.is_head:
        # --no-monitor: no autoscaler on a fixed set of nodes, and so no autoscaler metrics
        # server, which Ray 2.60 binds to 0.0.0.0:44217.
        argv += ["--head", "--port", str(spec.ray_port), "--no-monitor"]
        if spec.dashboard == "local":
            argv += [
                "--include-dashboard=true",
                "--dashboard-host",
                "127.0.0.1",
                "--dashboard-port",
                str(DASHBOARD_PORT),
            ]
        else:
            argv += ["--include-dashboard=false"]
    else:
        argv += ["--address", spec.ray_address]
    return argv


def security_warnings(spec: ClusterSpec) -> list[str]:
    """Lines to print before Ray starts, for settings that weaken the defaults."""
    if spec.auth_mode == "disabled":
        return [
            f"RAY_AUTH_MODE=disabled: anyone who reaches a Ray port on any node (GCS {spec.ray_address}) "
            "can run code there; use it only on an isolated fabric (default: token); see docs/security.md"
        ]
    return []


def dashboard_hint(spec: ClusterSpec) -> str | None:
    """The SSH tunnel to the dashboard (bound to the head's 127.0.0.1), or None when it is off."""
    if spec.dashboard != "local":
        return None
    import getpass
    import socket

    return (
        f"Ray dashboard: http://127.0.0.1:{DASHBOARD_PORT} on the head only; from your desk: "
        f"ssh -N -L {DASHBOARD_PORT}:127.0.0.1:{DASHBOARD_PORT} {getpass.getuser()}@{socket.gethostname()} "
        f"(or the head's address on your network), then open http://127.0.0.1:{DASHBOARD_PORT}"
    )


def node_fabric(spec: ClusterSpec, node: Node, reporter: Reporter | None = None) -> FabricEnv:
    """The node's own fabric environment, worked out by its agent from its sysfs."""
    assert node.fabric is not None  # cluster_spec gives every node its request
    return node.agent(reporter).call(p.FabricQuery(node.fabric, dict(spec.forwarded).get(SYSFS_ROOT_VAR, ""))).fabric


def image_without_ray(image: str) -> str:
    """The one-line fix for an image that ships vLLM without Ray (recent NGC vLLM images): the head's Ray
    version (the launcher's environment), so every node runs the same Ray."""
    from importlib import metadata

    try:
        version = metadata.version("ray")
    except metadata.PackageNotFoundError:
        version = "<the Ray version of your other nodes>"
    return (
        f"image {image} has no Ray: build FROM {image} with `pip install ray=={version}` "
        "(docs/containers.md has the Dockerfile); nothing was started"
    )


def preflight_node(spec: ClusterSpec, node: Node, reporter: Reporter) -> FabricEnv:
    """Every check that can fail before anything starts on `node`, one line per failure; its fabric environment."""
    reporter.phase(f"pre-flight {node.label}")
    agent = node.agent(reporter)
    # Read-only questions, asked at once and all answered before any is judged, in this order: the
    # first problem reported is the one a question at a time would have found, and none is left running.
    # (The log folder is the one thing made here: its own operation, so `probe` stays read-only.)
    asked_probe = Background(
        lambda: agent.call(p.Probe(node.is_head and spec.dashboard == "local"), timeout=spec.ssh_timeout_s + 30)
    )
    asked_logs = Background(
        lambda: agent.call(p.PrepareLogDir(str(spec.state_dir / "logs")), timeout=spec.ssh_timeout_s + 30)
    )
    asked_iface = Background(lambda: agent.call(p.InterfaceQuery(spec.fabric_ifname, node.ip)))
    asked_port = Background(lambda: agent.call(p.PortQuery(node.ip, spec.ray_port))) if node.is_head else None
    asked_fabric = Background(lambda: node_fabric(spec, node, reporter))
    for asked in (asked_probe, asked_logs, asked_iface, asked_port, asked_fabric):
        if asked is not None:
            asked.join()
    probe = asked_probe.result()
    missing = [name for name, info in probe.modules.items() if not info.found]
    if "ray" in missing and spec.containers:
        raise ClusterFailure(node.label, "image", image_without_ray(spec.containers.image))
    if missing:
        raise ClusterFailure(node.label, "python", f"{probe.python} cannot import {', '.join(missing)}")
    log_dir_error = asked_logs.result().error
    if log_dir_error:
        raise ClusterFailure(node.label, "log folder", f"{log_dir_error}; nothing was started")
    if probe.dashboard_missing:
        raise ClusterFailure(
            node.label,
            "dashboard",
            f"DSPARK_RAY_DASHBOARD=local needs Ray's dashboard packages, missing "
            f"{', '.join(probe.dashboard_missing)}: pip install 'ray[default]' "
            f"(the same Ray version) in {probe.python}'s environment, "
            "or set DSPARK_RAY_DASHBOARD=off",
        )
    iface = asked_iface.result()
    if not iface.exists:
        raise ClusterFailure(node.label, "fabric interface", f"no interface {spec.fabric_ifname}")
    if not iface.has_ip:
        raise ClusterFailure(
            node.label,
            "fabric interface",
            f"{spec.fabric_ifname} carries {', '.join(iface.addresses) or 'no address'}, not VLLM_HOST_IP {node.ip}",
        )
    if asked_port is not None:
        port = asked_port.result()
        if not port.free:
            raise ClusterFailure(node.label, "ray port", f"{node.ip}:{spec.ray_port} is taken ({port.reason})")
    fabric = asked_fabric.result()
    require_roce(spec, node, fabric)
    for warning in fabric.warnings:
        reporter.warn(warning)
    return fabric


def require_roce(spec: ClusterSpec, node: Node, fabric: FabricEnv) -> None:
    """Fail closed: a node without usable RoCE would run NCCL over TCP sockets (hazyumps measured ~12 against
    30+ tok/s on two GB10s), so start refuses (exit 2) unless DSPARK_ALLOW_TCP_FABRIC=1 (then a warning)."""
    if not fabric.roce and not spec.allow_tcp_fabric:
        raise ConfigError(
            f"{node.label}: {fabric.missing}: NCCL would run over TCP sockets (~12 against 30+ tok/s); "
            "nothing started: fix the fabric (docs/cluster.md) or set DSPARK_ALLOW_TCP_FABRIC=1 to "
            "accept TCP"
        )


class Bringup:
    """One `cluster up`: remembers what it started so a failure stops exactly that."""

    def __init__(self, spec: ClusterSpec, reporter: Reporter):
        self.spec = spec
        self.reporter = reporter
        self.run_id = secrets.token_hex(4)
        self.records: dict[str, NodeRecord] = {}
        self.token_env = auth_env(spec, create=True)  # callers hold the state lock
        self.fabric: dict[str, FabricEnv] = {}  # each started node's own, from its pre-flight
        self.temp_dirs: dict[str, str] = {}  # each started node's Ray temp folder, prepared by its agent

    def record(self, node: Node) -> NodeRecord:
        if node.name not in self.records:
            self.records[node.name] = NodeRecord(
                name=node.name,
                ip=node.ip,
                ssh_host=node.ssh_host,
                marker=f"dspark-{self.run_id}-{node.name}",
                ray_log=str(self.spec.state_dir / "logs" / f"ray-start-{node.name}.log"),
            )
            fabric = self.fabric.get(node.name)
            self.records[node.name].fabric_warnings = list(fabric.warnings) if fabric else []
        return self.records[node.name]

    def prepare(self, node: Node) -> None:
        """The node's Ray temp folder (every node's at once, before the head's Ray starts)."""
        self.temp_dirs[node.name] = (
            node.agent(self.reporter).call(p.RayTempDir(ray_temp_dir_name(self.spec, node))).path
        )

    def start_ray(self, node: Node) -> None:
        record = self.record(node)
        agent = node.agent(self.reporter)
        self.reporter.phase(f"starting Ray on {node.label}")
        record.ray_temp_dir = self.temp_dirs[node.name]
        argv = ray_start_argv(self.spec, node, record.ray_temp_dir)
        answer = agent.call(
            p.Run(
                tuple(argv),
                node_env(self.spec, node, self.token_env, self.fabric.get(node.name)),
                record.marker,
                record.ray_log,
                RAY_START_TIMEOUT_S,
                wire_sessions(record.sessions),
            ),
            "ray start",
            RAY_START_TIMEOUT_S + 30,
        )
        record.sessions.append(recorded(SessionRecord, answer.session))
        record.processes = [recorded(ProcessRecord, proc) for proc in answer.processes]
        if answer.returncode != 0:
            tail = list(agent.call(p.Tail((record.ray_log,), 15)).lines)
            raise ClusterFailure(node.label, "ray start", f"exit {answer.returncode}; log {record.ray_log}", tail)

    def checks(self, ignore_node_ids: tuple[str, ...] = (), head: NodeRecord | None = None) -> p.RayChecksAnswer:
        """Join wait, IPs and GPUs of every node, from Ray's node table by the head's agent; `head` is the
        head's record when its Ray was not started by this run."""
        self.reporter.phase("checking that every node joined Ray with its IP and GPUs")
        head = self.records.get(self.spec.head.name, head)
        request = p.RayChecks(
            self.spec.ray_address,
            self.token_env,
            tuple(p.ExpectedNode(n.name, n.ip) for n in self.spec.nodes),
            self.spec.gpus_per_node,
            self.spec.join_timeout_s,
            ignore_node_ids,
            wire_processes(head.processes) if head else (),
        )
        answer = self.spec.head.agent(self.reporter).call(request, timeout=self.spec.join_timeout_s + CHECKS_TIMEOUT_S)
        self.reporter.phase(
            f"Ray checks passed: {len(answer.nodes)} node(s) joined, each at its IP with "
            f"{self.spec.gpus_per_node} GPU(s)"
        )
        return answer

    def rollback(self) -> list[str]:
        """Stop everything this run started, on every node; returns what could not be stopped."""

        def stop_one(node: Node) -> str | None:
            try:
                answer = stop_node(node, self.records[node.name])
            except ClusterFailure as exc:
                return str(exc)
            return f"{node.label}: pids {list(answer.left)} survived SIGKILL" if answer.left else None

        results = on_each([self.spec.node(name) for name in self.records], stop_one)
        return [problem for problem in results.values() if problem]


class ForeignRayPort(ClusterFailure):
    """Another process holds the GCS's port: nothing was sent to it, and the token on file was replaced."""


class RayPortDown(ClusterFailure):
    """Nothing of ours listens on the GCS's port: Ray was not asked."""


def ray_view(spec: ClusterSpec, head: NodeRecord | None, timeout: float = 20) -> tuple[p.RayNode, ...]:
    """Ray's own list of nodes, asked of the head's agent, which first checks that the GCS's port is held by
    the head's recorded Ray (`head`): the token goes to no one else."""
    holders = wire_processes(head.processes) if head else ()
    answer = spec.head.agent().call(p.RayNodesQuery(spec.ray_address, auth_env(spec), holders), timeout=timeout)
    if answer.port is None or answer.port.ours:
        return answer.nodes
    if answer.port.verdict == p.PortHolderAnswer.FOREIGN:
        renewed = rotate_ray_token(spec.state_dir) if spec.auth_mode == "token" and not spec.auth_token else False
        token = (
            "a new Ray token was drawn for the next start"
            if renewed
            else "the Ray token was not sent" + ("; replace RAY_AUTH_TOKEN" if spec.auth_token else "")
        )
        raise ForeignRayPort(
            spec.head.label,
            "ray port",
            f"RAY_PORT {spec.ray_address} is held by {answer.port.foreign}, not by the Ray "
            f"started there; {token}; stop that process before `dspark restart`",
        )
    raise RayPortDown(spec.head.label, "ray port", f"nothing of ours listens on {spec.ray_address} (Ray is down)")


def foreign_ray_port(ray_view: Background | None) -> str | None:
    """The problem line when Ray's view found another process on the GCS's port."""
    if ray_view is None:
        return None
    try:
        ray_view.result()
    except ForeignRayPort as exc:
        return str(exc)
    except ClusterFailure:
        pass
    return None


def stop_node(node: Node, record: NodeRecord, grace_s: float = RAY_STOP_GRACE_S) -> p.StopAnswer:
    return node.agent().call(
        p.Stop(record.marker, wire_processes(record.processes), wire_sessions(record.sessions), grace_s)
    )


def core_processes(record: NodeRecord) -> list[ProcessRecord]:
    """The Ray daemons a node cannot lose (idle Ray workers come and go by design)."""
    return [proc for proc in record.processes if any(name in proc.cmd.split(" ")[0] for name in CORE_PROCESSES)]


def node_alive(node: Node, record: NodeRecord) -> bool:
    """Whether the node's Ray daemons recorded at start are still the same processes."""
    core = core_processes(record)
    return bool(core) and all(node.agent().call(p.AliveQuery(wire_processes(core))).alive)


def ray_log_paths(node: Node, record: NodeRecord) -> list[str]:
    return [record.ray_log, *node.agent().call(p.Glob(record.ray_temp_dir, "session_latest/logs/raylet.out")).paths]
