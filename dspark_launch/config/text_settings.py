"""The non-numeric settings: names, defaults, groups and how each is checked.

Numeric knobs are declared in `config/knobs.py`; everything else the launcher
reads is declared here, once: one field of `TextSettings` per setting, its
docstring the description. Each check returns the canonical value or raises
ValueError with the "allowed" half of an error line.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable

from dspark_launch.config.checks import ASCII_WORD, not_an_option, shell_words, single_line, user_name
from dspark_launch.config.container_args import check_container_args, check_image
from dspark_launch.config.field_docs import declared_docs
from dspark_launch.config.forward_env import check_forward_names
from dspark_launch.config.levels import Level, ServeFlag, nature_metadata, owned
from dspark_launch.config.ssh_options import check_ssh_options
from dspark_launch.node.nccl_hca import parse_hca_list  # stdlib only: the node side reads the same grammar
from dspark_launch.profiles.catalog import DEFAULT_PROFILE, SHIPPED, profile_names

_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}", re.ASCII)
_HOST = re.compile(r"(?:[A-Za-z0-9_.-]+@)?(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])", re.ASCII)
_SERVED_NAME = re.compile(r"[A-Za-z0-9._:/-]+", re.ASCII)
_REVISION = re.compile(r"[A-Za-z0-9._/-]+", re.ASCII)
_LIST_SEPARATORS = re.compile(r"[ \t]+")
RAY_TOKEN_MIN_LENGTH = 32  # 128 bits as hex; the generated token has 64 hex digits


def _any(value: str) -> str:
    return value


def _ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError("an IPv4 or IPv6 address") from None


def _optional_ip(value: str) -> str:
    return _ip(value) if value else ""


def _ip_list(value: str) -> str:
    return " ".join(_ip(item) for item in value.replace(",", " ").split())


def _host_list(value: str) -> str:
    hosts = value.replace(",", " ").split()
    for host in hosts:
        if not _HOST.fullmatch(host) or host.startswith("-"):
            raise ValueError("space-separated host names or IPs, optionally user@host")
    return " ".join(hosts)


def _ifname(value: str) -> str:
    if value and not _IFNAME.fullmatch(value):
        raise ValueError("a network interface name (letters, digits, _.:-; at most 15)")
    return value


def _ifname_list(value: str) -> str:
    names = value.replace(",", " ").split()
    for name in names:
        _ifname(name)
    return ",".join(names)


def _hca_list(value: str) -> str:
    return parse_hca_list(value).text if value.strip() else ""


def _env_names(value: str) -> str:
    names = value.replace(",", " ").split()
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name, re.ASCII):
            raise ValueError("space-separated environment variable names")
    check_forward_names(names)
    return " ".join(names)


_PROFILE_ENV_WORD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([A-Za-z0-9_.:,=+/@-]*)", re.ASCII)


def _profile_env(value: str) -> str:
    words = value.split()
    for word in words:
        match = _PROFILE_ENV_WORD.fullmatch(word)
        if not match:
            raise ValueError(
                "space-separated NAME=VALUE (VALUE: letters, digits and ._:,=+/@-; empty leaves the "
                "variable unset), e.g. VLLM_USE_FLASHINFER_SAMPLER=0 CUTE_DSL_ARCH="
            )
        check_forward_names([match[1]], profile_names_allowed=True)
    return " ".join(words)


_NODE_FABRIC = re.compile(
    r"(head|worker[1-9][0-9]*):(DSPARK_FABRIC_IFNAME|NCCL_SOCKET_IFNAME|GLOO_SOCKET_IFNAME|"
    r"TP_SOCKET_IFNAME|NCCL_IB_HCA|NCCL_IB_GID_INDEX)=([A-Za-z0-9_.:,^=-]+)",
    re.ASCII,
)


def _gid_index(value: str) -> str:
    if not value.isascii() or not value.isdigit():
        raise ValueError("a GID index (ASCII digits)")
    return value


def _node_fabric(value: str) -> str:
    entries = value.split()
    for entry in entries:
        match = _NODE_FABRIC.fullmatch(entry)
        if not match or (match[2] == "NCCL_IB_GID_INDEX" and not match[3].isdigit()):  # ASCII: re.ASCII above
            raise ValueError(
                "space-separated NODE:NAME=VALUE (NODE head or workerN; NAME DSPARK_FABRIC_IFNAME, "
                "NCCL_IB_HCA, NCCL_IB_GID_INDEX or a *_SOCKET_IFNAME), e.g. worker1:NCCL_IB_GID_INDEX=3"
            )
        if match[2] == "NCCL_IB_HCA":
            _hca_list(match[3])
        elif match[2] != "NCCL_IB_GID_INDEX":
            _ifname_list(match[3])
    return " ".join(entries)


def _choice(*allowed: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in allowed:
            raise ValueError("one of " + ", ".join(allowed))
        return value

    return check


def _profile(value: str) -> str:
    """A shipped profile, or one another installed distribution registers (the tests' own)."""
    if value in (p.name for p in SHIPPED):
        return value
    return _choice(*profile_names())(value)


def _serve_args(value: str) -> str:
    """Shell words; the flags the settings own are refused by the resolver (`TextRule.vllm_flags`)."""
    shell_words(value)
    return value


def _served_name(value: str) -> str:
    if not _SERVED_NAME.fullmatch(value) or value.startswith("-"):
        raise ValueError("letters, digits and ._:/-, not starting with '-'")
    return value


def _revision(value: str) -> str:
    if not _REVISION.fullmatch(value) or value.startswith("-"):
        raise ValueError("a commit, tag or branch: letters, digits and ._/-, not starting with '-'")
    return value


def _bind_host(value: str) -> str:
    if value in ("localhost",):
        return value
    return _ip(value)


def _api_key(value: str) -> str:
    if not ASCII_WORD.fullmatch(value) or "\\" in value:
        raise ValueError("one key of printable ASCII, without whitespace or backslashes")
    return value


def _api_key_list(value: str) -> str:
    keys = _LIST_SEPARATORS.split(value)
    if not all(ASCII_WORD.fullmatch(key) and "\\" not in key for key in keys):
        raise ValueError("keys of printable ASCII separated by spaces (no other whitespace, no backslashes)")
    return " ".join(keys)


def _ray_token(value: str) -> str:
    if not ASCII_WORD.fullmatch(value) or len(value) < RAY_TOKEN_MIN_LENGTH:
        raise ValueError(
            f"at least {RAY_TOKEN_MIN_LENGTH} characters of printable ASCII without whitespace "
            "(e.g. `openssl rand -hex 32`)"
        )
    return value


@dataclass(frozen=True, kw_only=True)
class TextSetting:
    name: str
    default: str
    group: str
    description: str
    check: Callable[[str], str] = _any
    secret: bool = False
    required_for_cluster: bool = False
    quiet: bool = False  # errors never show the value: it may hold a secret (an --api-key in VLLM_EXTRA_ARGS)
    vllm_flags: bool = False  # `vllm serve` flags: those the settings own are refused (TextRule.vllm_flags)


@dataclass(frozen=True)
class TextRule:
    group: str
    check: Callable[[str], str]
    secret: bool
    required_for_cluster: bool
    quiet: bool
    vllm_flags: bool = False
    """The value is `vllm serve` flags, and a flag a setting owns is refused naming the setting. That table
    (config/serve_flags.py) is derived from every declaration, this one's class included, so the resolver
    (config/settings.py) applies it after `check`: a declaration module never imports what is derived from it."""


def text(
    default: str | int | tuple[str, ...],
    *,
    group: str,
    check: Callable[[str], str] = _any,
    secret: bool = False,
    required_for_cluster: bool = False,
    quiet: bool = False,
    level: Level = "cluster",
    flag: str | ServeFlag | None = None,
    vllm_flags: bool = False,
) -> Any:
    """A text setting field: its default and how a value is checked (`check` gets the text the operator wrote).
    The attribute's type says what the code gets: `str` (the canonical text), `int`, or `tuple[str, ...]`
    (the value split like a shell would, never run by one). `level` and `flag`: what its change needs and the
    `vllm serve` flag it sets (config/levels.py)."""
    rule = TextRule(group, check, secret, required_for_cluster, quiet, vllm_flags)
    return dataclasses.field(default=default, metadata={"text": rule, **nature_metadata(level, flag)})


@dataclass(frozen=True, kw_only=True)
class TextSettings:
    """The settings that are not numeric knobs; the environment name is the field name in capitals."""

    # ---- cluster
    dspark_head_ip: str = text("", group="cluster", check=_optional_ip, required_for_cluster=True)
    """Head's fabric IP (this machine); Ray and vLLM bind to it"""
    dspark_worker_hosts: str = text("", group="cluster", check=_host_list, required_for_cluster=True)
    """Workers' SSH addresses, space-separated ([user@]host)"""
    dspark_worker_ips: str = text("", group="cluster", check=_ip_list)
    """Workers' fabric IPs, in DSPARK_WORKER_HOSTS order (default: the host itself)"""
    dspark_head_python: str = text("", group="cluster", check=single_line)
    """Python for the head's agent, Ray and vllm serve (default: the launcher's own)"""
    dspark_worker_python: str = text("", group="cluster", check=single_line)
    """Python on the workers (default: the head's interpreter path)"""
    dspark_ssh_user: str = text("", group="cluster", check=user_name)
    """SSH user for the workers (default: ssh's own)"""
    dspark_ssh_key: str = text("", group="cluster", check=single_line)
    """SSH private key file (default: ssh's own)"""
    dspark_ssh_options: tuple[str, ...] = text((), group="cluster", check=check_ssh_options)
    """Extra ssh options, split like a shell (never run by one); only those listed below"""
    dspark_ssh_host_key_check: str = text("yes", group="cluster", check=_choice("yes", "accept-new"))
    """StrictHostKeyChecking for workers: yes, or accept-new (trust a first-seen key)"""
    dspark_forward_env: str = text("", group="cluster", check=_env_names)
    """Variables passed from the launcher's environment to every node's Ray and vllm serve; only the reviewed names
    below"""
    dspark_state_dir: str = text("", group="cluster", check=single_line)
    """State folder (pids, logs, Ray token); default $XDG_STATE_HOME/dspark"""

    # ---- fabric
    dspark_fabric_ifname: str = text("", group="fabric", check=_ifname, required_for_cluster=True)
    """Fabric interface, same name on every node; default of the *_SOCKET_IFNAME below"""
    nccl_socket_ifname: str = text("", group="fabric", check=_ifname_list)
    """NCCL bootstrap interface(s)"""
    gloo_socket_ifname: str = text("", group="fabric", check=_ifname_list)
    """Gloo interface(s)"""
    tp_socket_ifname: str = text("", group="fabric", check=_ifname_list)
    """TensorPipe interface(s)"""
    nccl_ib_hca: str = text("", group="fabric", check=_hca_list)
    """NCCL's RoCE HCA(s), in NCCL's form ([^][=]device[:port],...); default: the device behind each node's fabric
    interface and its twin port (sysfs); each one checked on its node"""
    nccl_ib_gid_index: str = text("", group="fabric", check=_gid_index)
    """NCCL's GID index; default: each node's RoCE v2 GID of its fabric IP (sysfs)"""
    dspark_node_fabric: str = text("", group="fabric", check=_node_fabric)
    """Per-node fabric values where nodes differ: NODE:NAME=VALUE, e.g. worker1:NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0"""

    # ---- serving
    dspark_model: str = text(
        "deepseek-ai/DeepSeek-V4-Flash", group="serving", check=not_an_option, level="serve", flag=owned("--model")
    )
    """Hugging Face model id or local path"""
    dspark_model_revision: str = text("", group="serving", check=_revision, level="serve", flag=owned("--revision"))
    """Model revision pin (commit, tag or branch)"""
    dspark_served_model_name: str = text(
        "deepseek-v4-flash", group="serving", check=_served_name, level="serve", flag=owned("--served-model-name")
    )
    """Model name clients ask for"""
    vllm_host: str = text("127.0.0.1", group="serving", check=_bind_host, level="serve", flag=owned("--host"))
    """API bind address; other than loopback needs an API key (or DSPARK_TRUSTED_NETWORK=1)"""
    dspark_profile: str = text(DEFAULT_PROFILE, group="serving", check=_profile, level="serve")
    """Model profile: the recipe's flags and variables, checked against the installed vLLM (docs/deepseek-v4-flash.md);
    none: the settings' flags only"""
    dspark_profile_env: tuple[str, ...] = text((), group="serving", check=_profile_env, level="serve")
    """Override the profile's variables: NAME=VALUE (NAME= unsets); only names the profile sets"""
    vllm_extra_args: tuple[str, ...] = text(
        (), group="serving", check=_serve_args, quiet=True, level="serve", vllm_flags=True
    )
    """Extra vllm serve arguments, split like a shell (never run by one); the launcher's flags (below) are refused"""

    # ---- hotfix
    dspark_hotfix: str = text("required", group="hotfix", check=_choice("required", "off"))
    """required: patch and verify the scheduler on every node, refuse a vLLM it cannot patch; off: vLLM's own scheduler
    (an earlier patch reverted), no in-flight prefill cap, so long prompts can starve streams"""

    # ---- supervision
    dspark_memory_guard: str = text("off", group="supervision", check=_choice("off", "pause"))
    """off (default): start --foreground only samples every node's memory (status shows it); pause: it closes
    admission of new prompts while a node's memory is short (DSPARK_MEMORY_FLOOR_MIB,
    DSPARK_MEMORY_PRESSURE_PCT), running streams going on, and opens it again once memory is back"""

    # ---- security
    vllm_api_key: str = text("", group="security", check=_api_key, secret=True, level="serve", flag=owned("--api-key"))
    """API key clients must send (never on argv)"""
    dspark_api_keys: str = text(
        "", group="security", check=_api_key_list, secret=True, level="serve", flag=owned("--api-key")
    )
    """Several API keys, space-separated (instead of VLLM_API_KEY, never both)"""
    ray_auth_mode: str = text("token", group="security", check=_choice("token", "disabled"))
    """Ray authentication: token, or disabled (isolated fabric only)"""
    ray_auth_token: str = text("", group="security", check=_ray_token, secret=True)
    """Ray token for all nodes (32+ printable ASCII); empty: generated into the state folder"""
    dspark_ray_dashboard: str = text("off", group="security", check=_choice("off", "local"))
    """Ray dashboard: off, or local (127.0.0.1 only, via an SSH tunnel)"""
    dspark_hub_trusted_http_endpoint: str = text("", group="security", check=single_line)
    """The one http:// HF_ENDPOINT (spelled exactly) that may get the hub token in clear text; no other plain-http
    endpoint, loopback included"""

    # ---- container
    dspark_runtime: str = text("host", group="container", check=_choice("host", "docker", "podman"))
    """Where Ray and vLLM run: host (a venv), or one docker or podman container per node"""
    dspark_image: str = text("", group="container", check=check_image)
    """Node image (tag or name@sha256:digest); the same image id on every node"""
    dspark_container_args: tuple[str, ...] = text((), group="container", check=check_container_args)
    """Extra container run arguments, split like a shell; none replacing the launcher's (network, ipc, pid, name, label,
    ...)"""
    dspark_container_python: str = text("python3", group="container")
    """Python inside the image (the one with vLLM and Ray)"""
    dspark_container_model_cache: str = text("", group="container")
    """Weights folder, mounted read-only at the same path; default $HF_HOME/hub (never HF_HOME: it holds the hub login
    token)"""
    dspark_container_jit_cache: str = text("", group="container", check=single_line)
    """Host folder of the JIT caches (vLLM, FlashInfer, Triton, TileLang, CuTe DSL), kept across containers; default
    <state dir>/jit-cache; ours, not group/other-writable"""

    # ---- model
    dspark_model_cache: str = text("", group="model")
    """Hub cache of the weights, same path on every node; default HF_HUB_CACHE, else $HF_HOME/hub"""
    dspark_model_copy_streams: int = text(
        4, group="model", check=_choice(*(str(n) for n in range(1, 17))), level="serve"
    )
    """rsync streams per worker for the model copy (one SSH cipher core each)"""
    dspark_model_copy_hosts: str = text("", group="model", check=_host_list)
    """Workers' addresses for the model copy, in DSPARK_WORKER_HOSTS order ([user@]host; default: the fabric IP, the
    agent's SSH settings)"""
    hf_token: str = text("", group="model", secret=True, level="serve")
    """Hugging Face token for gated models (default: the `hf auth login` token file)"""


def as_text(value: str | int | tuple[str, ...]) -> str:
    """A typed default as an operator would write it."""
    return shlex.join(value) if isinstance(value, tuple) else str(value)


def text_settings_of(cls: type) -> tuple[TextSetting, ...]:
    """The text settings `cls` declares (TextSettings, or a declaration class extending it: the tests' fake
    settings), in declaration order."""
    docs = declared_docs(cls)
    specs = []
    for field in dataclasses.fields(cls):
        if "text" not in field.metadata:
            if "knob" in field.metadata:
                continue  # declared by the other kind, in a class that declares both
            raise ValueError(f"{cls.__name__}.{field.name} is not declared with text()")
        rule: TextRule = field.metadata["text"]
        if field.name not in docs:
            raise ValueError(f"{cls.__name__}.{field.name} has no docstring")
        if field.default is dataclasses.MISSING:
            raise ValueError(f"{cls.__name__}.{field.name} has no default")
        specs.append(
            TextSetting(
                name=field.name.upper(),
                default=as_text(field.default),
                group=rule.group,
                description=docs[field.name],
                check=rule.check,
                secret=rule.secret,
                required_for_cluster=rule.required_for_cluster,
                quiet=rule.quiet,
                vllm_flags=rule.vllm_flags,
            )
        )
    return tuple(specs)


TEXT_SETTINGS: tuple[TextSetting, ...] = text_settings_of(TextSettings)

# Names the launcher reads that are not settings of a run.
META_NAMES = frozenset({"DSPARK_ENV_FILE"})
