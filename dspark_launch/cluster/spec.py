"""The cluster as the settings describe it: nodes, how to reach them, what each must carry."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.container_transport import ContainerTransport
from dspark_launch.agent.host_shell import LocalHost, SSHHost
from dspark_launch.agent.transport import LocalTransport, SSHTransport, Transport
from dspark_launch.config.node_fabric import fabric_request
from dspark_launch.config.settings import Settings
from dspark_launch.errors import ConfigError
from dspark_launch.node.fabric import FabricRequest
from dspark_launch.report import Reporter


@dataclass(frozen=True)
class Node:
    name: str  # "head", "worker1", ...
    ip: str  # fabric IP: Ray's --node-ip-address and VLLM_HOST_IP
    ssh_host: str | None  # None for the head (local)
    transport: Transport
    fabric: FabricRequest | None = None  # what its agent needs to work out its own fabric environment
    copy_host: str = ""  # [user@]address the model copy reaches it at (a worker's fabric IP by default)

    @property
    def is_head(self) -> bool:
        return self.ssh_host is None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.ip})"

    def agent(self, reporter: Reporter | None = None) -> NodeAgent:
        """This node's agent; progress its operations report goes to `reporter`."""
        return NodeAgent(self.label, self.transport, reporter)


@dataclass(frozen=True)
class NodeContainers:
    """DSPARK_RUNTIME=docker|podman: every node's agent (and so Ray and vLLM) runs in one container per node."""

    runtime: str  # "docker" | "podman"
    image: str
    marker: str  # the deployment's marker (from the state folder): container names and owner label
    python: str  # the image's interpreter
    extra_args: tuple[str, ...]
    model_cache: str  # host folder mounted at the same path as HF_HOME; "" = none
    jit_cache: str = ""  # host folder of the JIT compile caches, mounted at the same path

    def name(self, node: str) -> str:
        return f"{self.marker}-{node}"


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    nodes: tuple[Node, ...]
    ray_port: int
    ray_address: str
    fabric_ifname: str
    node_env: tuple[tuple[str, str], ...]  # variables every node's Ray gets (its fabric ones come from its agent)
    forwarded: tuple[tuple[str, str], ...] = field(repr=False)  # DSPARK_FORWARD_ENV names with their values
    gpus_per_node: int
    object_store_bytes: int
    auth_mode: str
    dashboard: str
    state_dir: Path
    join_timeout_s: int
    ssh_timeout_s: int
    config_digest: str
    auth_token: str = field(default="", repr=False)  # configured RAY_AUTH_TOKEN; else generated
    containers: NodeContainers | None = None  # None: DSPARK_RUNTIME=host
    allow_tcp_fabric: bool = False  # DSPARK_ALLOW_TCP_FABRIC=1: a node without RoCE is a warning, not exit 2
    hotfix: str = "required"  # DSPARK_HOTFIX: off serves vLLM's own scheduler (hotfix_rollout)

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[Node, ...]:
        return self.nodes[1:]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ConfigError(f"--node {name}: no such node; allowed: {', '.join(n.name for n in self.nodes)}")


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dspark"


def state_dir_of(settings: Settings) -> Path:
    return Path(settings.dspark_state_dir).expanduser() if settings.dspark_state_dir else default_state_dir()


def placeholder(settings: Settings, attr: str) -> bool:
    """True when the setting in attribute `attr` still holds a placeholder: a documentation address, the example's
    interface beside one,
    or any value read from the example file itself (such an address is never dialled)."""
    from dspark_launch.config.placeholders import placeholders

    entry = settings.entry(attr)
    from_example = settings.from_example and entry.source.startswith(str(settings.env_file))
    return from_example or any(p.name == entry.name for p in placeholders(settings))


def _require_real_hosts(settings: Settings, placeholders_ok: bool) -> None:
    from dspark_launch.config.placeholders import placeholder_error, placeholders

    found = placeholders(settings)
    if found and not placeholders_ok:
        raise ConfigError(placeholder_error(found))
    for attr in ("dspark_head_ip", "dspark_worker_hosts", "dspark_fabric_ifname"):
        entry = settings.entry(attr)
        name = entry.name
        if placeholder(settings, attr) and not placeholders_ok:
            raise ConfigError(
                f"{name}={entry.value} from {entry.source} is a placeholder from the example file; "
                "allowed: your own hosts: run `dspark config init` and set them in .env.dspark"
            )
        if not entry.value:
            raise ConfigError(
                f"{name} is not set ({entry.source}); allowed: {NOT_SET_HINT[name]}; "
                "`dspark config init` writes an env file with every setting to edit"
            )


NOT_SET_HINT = {
    "DSPARK_HEAD_IP": "the head's fabric IP",
    "DSPARK_WORKER_HOSTS": "each worker's SSH address ([user@]host)",
    "DSPARK_FABRIC_IFNAME": "the fabric interface's name (`ip -br link`)",
}


def _hf_home() -> str:
    """The hub client's own folder, as huggingface_hub finds it."""
    return os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )


def _refuse_the_token_folder(settings: Settings, cache: str) -> None:
    """The container model cache is mounted into every serving container: never the folder of the hub token."""
    from dspark_launch.node.safe_path import within

    home = _hf_home()
    token = os.environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")
    if within(os.path.abspath(os.path.expanduser(token)), os.path.abspath(os.path.expanduser(cache))):
        where = settings.source_of("dspark_container_model_cache")
        raise ConfigError(
            f"DSPARK_CONTAINER_MODEL_CACHE={cache} ({where}) holds the hub login token "
            f"({token}), which every serving container would then read; allowed: the hub cache "
            f"({os.path.join(home, 'hub')}) or another folder of weights"
        )


def cluster_spec(settings: Settings, placeholders_ok: bool = False) -> ClusterSpec:
    """The nodes to contact; refuses placeholders so nothing reaches an address nobody configured
    (`placeholders_ok`: for `dspark plan`, which never dials a placeholder, see `placeholder`)."""
    _require_real_hosts(settings, placeholders_ok)
    hosts = settings.dspark_worker_hosts.split()
    ips = settings.dspark_worker_ips.split() or [h.rsplit("@", 1)[-1].strip("[]") for h in hosts]
    for host, ip in zip(hosts, ips):
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(
                f"DSPARK_WORKER_IPS: worker {host} has no fabric IP "
                f"({settings.source_of('dspark_worker_ips')}); allowed: one IP per worker"
            ) from None
    head_ip = settings.dspark_head_ip
    if head_ip in ips or len(set(ips)) != len(ips):
        raise ConfigError(
            f"DSPARK_WORKER_IPS={' '.join(ips)}: every node needs its own fabric IP "
            f"(head {head_ip}); allowed: distinct addresses"
        )
    head_python = settings.dspark_head_python or sys.executable
    python = settings.dspark_worker_python or head_python
    ssh = dict(
        port=settings.ssh_port,
        user=settings.dspark_ssh_user,
        key=settings.dspark_ssh_key,
        host_key_check=settings.dspark_ssh_host_key_check,
        connect_timeout=settings.ssh_connect_timeout_s,
        extra_options=settings.dspark_ssh_options,
    )
    containers = node_containers(settings)
    copy_hosts = settings.dspark_model_copy_hosts.split() or ips
    nodes = [Node("head", head_ip, None, LocalTransport(head_python), fabric_request(settings, "head", head_ip))]
    for index, (host, ip, copy_host) in enumerate(zip(hosts, ips, copy_hosts), start=1):
        name = f"worker{index}"
        nodes.append(
            Node(
                name,
                ip,
                host,
                SSHTransport(host=host.rsplit("@", 1)[-1], python=python, **{**ssh, "user": _user(host, ssh["user"])}),
                fabric_request(settings, name, ip),
                copy_host,
            )
        )
    if containers:
        nodes = [_in_container(node, containers) for node in nodes]
    ifname = settings.dspark_fabric_ifname
    node_env: list[tuple[str, str]] = []  # NCCL_*, *_SOCKET_IFNAME: per node, from its agent (`fabric_env`)
    port = settings.ray_port
    return ClusterSpec(
        nodes=tuple(nodes),
        ray_port=port,
        ray_address=f"{_bracket(head_ip)}:{port}",
        fabric_ifname=ifname,
        node_env=tuple(node_env),
        # Read from the launcher's environment once, here: every node gets these values, nothing else of it.
        forwarded=tuple((name, os.environ[name]) for name in settings.dspark_forward_env.split() if name in os.environ),
        gpus_per_node=settings.gpus_per_node,
        object_store_bytes=settings.ray_object_store_mb * 1024 * 1024,
        auth_mode=settings.ray_auth_mode,
        dashboard=settings.dspark_ray_dashboard,
        state_dir=state_dir_of(settings),
        join_timeout_s=settings.cluster_join_timeout_s,
        ssh_timeout_s=settings.ssh_connect_timeout_s,
        config_digest=settings.digest(),
        auth_token=settings.ray_auth_token,
        containers=containers,
        allow_tcp_fabric=settings.dspark_allow_tcp_fabric,
        hotfix=settings.dspark_hotfix,
    )


def node_containers(settings: Settings) -> NodeContainers | None:
    runtime = settings.dspark_runtime
    if runtime == "host":
        return None
    # One deployment per state folder (its lock): the containers are named from it, so `stop` and
    # `status` find them from the settings alone, record or not.
    marker = "dspark-" + hashlib.sha256(str(state_dir_of(settings)).encode()).hexdigest()[:8]
    # The hub cache only (HF_HOME/hub), never HF_HOME itself: that holds the hub login token.
    cache = settings.dspark_container_model_cache or os.path.join(_hf_home(), "hub")
    _refuse_the_token_folder(settings, cache)
    jit_cache = settings.dspark_container_jit_cache or str(state_dir_of(settings) / "jit-cache")
    return NodeContainers(
        runtime=runtime,
        image=settings.dspark_image,
        marker=marker,
        python=settings.dspark_container_python or "python3",
        extra_args=settings.dspark_container_args,
        model_cache=cache,
        jit_cache=str(Path(jit_cache).expanduser()),
    )


def _in_container(node: Node, containers: NodeContainers) -> Node:
    """The node's agent runs inside its container, reached through the node's host shell."""
    host = LocalHost() if node.is_head else SSHHost(node.transport)
    return replace(
        node,
        transport=ContainerTransport(
            host=host, runtime=containers.runtime, container=containers.name(node.name), python=containers.python
        ),
    )


def host_ssh(node: Node) -> SSHTransport:
    """A worker's SSH settings on its host (the agent's transport, or the one under its container's)."""
    transport = node.transport
    if isinstance(transport, ContainerTransport) and isinstance(transport.host, SSHHost):
        return transport.host.ssh
    if isinstance(transport, SSHTransport):
        return transport
    raise ValueError(f"{node.name} is not reached over SSH")


def copy_ssh(node: Node) -> SSHTransport:
    """The SSH settings of the model copy to a worker: the agent's (port, key, options, host-key check)
    aimed at its copy address (DSPARK_MODEL_COPY_HOSTS, else its fabric IP), user@ there overriding."""
    ssh = host_ssh(node)
    host = node.copy_host or node.ip
    return replace(ssh, host=host.rsplit("@", 1)[-1].strip("[]"), user=_user(host, ssh.user))


def _user(host: str, default: str) -> str:
    return host.split("@", 1)[0] if "@" in host else default


def _bracket(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
