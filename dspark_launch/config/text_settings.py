"""The non-numeric settings: names, defaults, groups and how each is checked.

Numeric knobs live in `dspark-numeric-knobs.sh`; everything else the launcher
reads is declared here, once. Each check returns the canonical value or raises
ValueError with the "allowed" half of an error line.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Callable

from dspark_launch.config.checks import ASCII_WORD, not_an_option, shell_words, single_line
from dspark_launch.config.forward_env import check_forward_names
from dspark_launch.config.serve_flags import check_extra_args
from dspark_launch.config.ssh_options import check_ssh_options
from dspark_launch.profiles.catalog import DEFAULT_PROFILE, PROFILE_NAMES
from dspark_launch.agent.nccl_hca import parse_hca_list  # stdlib only: the node side reads the same grammar
from dspark_launch.config.container_args import check_container_args, check_image

_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}", re.ASCII)
_HOST = re.compile(r"(?:[A-Za-z0-9_.-]+@)?(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])", re.ASCII)
_SERVED_NAME = re.compile(r"[A-Za-z0-9._:/-]+", re.ASCII)
_REVISION = re.compile(r"[A-Za-z0-9._/-]+", re.ASCII)
_SSH_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,31}", re.ASCII)
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
            raise ValueError("space-separated NAME=VALUE (VALUE: letters, digits and ._:,=+/@-; empty leaves the "
                             "variable unset), e.g. VLLM_USE_FLASHINFER_SAMPLER=0 CUTE_DSL_ARCH=")
        check_forward_names([match[1]], profile_names_allowed=True)
    return " ".join(words)


_NODE_FABRIC = re.compile(r"(head|worker[1-9][0-9]*):(DSPARK_FABRIC_IFNAME|NCCL_SOCKET_IFNAME|GLOO_SOCKET_IFNAME|"
                          r"TP_SOCKET_IFNAME|NCCL_IB_HCA|NCCL_IB_GID_INDEX)=([A-Za-z0-9_.:,^=-]+)", re.ASCII)


def _gid_index(value: str) -> str:
    if not value.isascii() or not value.isdigit():
        raise ValueError("a GID index (ASCII digits)")
    return value


def _node_fabric(value: str) -> str:
    entries = value.split()
    for entry in entries:
        match = _NODE_FABRIC.fullmatch(entry)
        if not match or (match[2] == "NCCL_IB_GID_INDEX" and not match[3].isdigit()):  # ASCII: re.ASCII above
            raise ValueError("space-separated NODE:NAME=VALUE (NODE head or workerN; NAME DSPARK_FABRIC_IFNAME, "
                             "NCCL_IB_HCA, NCCL_IB_GID_INDEX or a *_SOCKET_IFNAME), e.g. worker1:NCCL_IB_GID_INDEX=3")
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


def _serve_args(value: str) -> str:
    check_extra_args(shell_words(value))
    return value


def _served_name(value: str) -> str:
    if not _SERVED_NAME.fullmatch(value) or value.startswith("-"):
        raise ValueError("letters, digits and ._:/-, not starting with '-'")
    return value


def _revision(value: str) -> str:
    if not _REVISION.fullmatch(value) or value.startswith("-"):
        raise ValueError("a commit, tag or branch: letters, digits and ._/-, not starting with '-'")
    return value


def _ssh_user(value: str) -> str:
    if not _SSH_USER.fullmatch(value):
        raise ValueError("a user name: letters, digits and ._-, not starting with '-', at most 32")
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
        raise ValueError(f"at least {RAY_TOKEN_MIN_LENGTH} characters of printable ASCII without whitespace "
                         "(e.g. `openssl rand -hex 32`)")
    return value


@dataclass(frozen=True)
class TextSetting:
    name: str
    default: str
    group: str
    description: str
    check: Callable[[str], str] = _any
    secret: bool = False
    required_for_cluster: bool = False
    quiet: bool = False  # errors never show the value: it may hold a secret (an --api-key in VLLM_EXTRA_ARGS)


TEXT_SETTINGS: tuple[TextSetting, ...] = (
    # cluster
    TextSetting("DSPARK_HEAD_IP", "", "cluster",
                "Fabric IP of the head node (this machine); Ray and vLLM bind to it",
                _optional_ip, required_for_cluster=True),
    TextSetting("DSPARK_WORKER_HOSTS", "", "cluster",
                "SSH address of each worker node, space-separated ([user@]host)",
                _host_list, required_for_cluster=True),
    TextSetting("DSPARK_WORKER_IPS", "", "cluster",
                "Fabric IP of each worker, same order as DSPARK_WORKER_HOSTS (default: the host itself)",
                _ip_list),
    TextSetting("DSPARK_HEAD_PYTHON", "", "cluster",
                "Python interpreter that runs the head's agent, Ray and vllm serve (default: the launcher's own)",
                single_line),
    TextSetting("DSPARK_WORKER_PYTHON", "", "cluster",
                "Python interpreter on the workers (default: the head's interpreter path)", single_line),
    TextSetting("DSPARK_SSH_USER", "", "cluster", "SSH user for the workers (default: ssh's own)", _ssh_user),
    TextSetting("DSPARK_SSH_KEY", "", "cluster", "SSH private key file (default: ssh's own)", single_line),
    TextSetting("DSPARK_SSH_OPTIONS", "", "cluster",
                "Extra ssh options, split like a shell would (never run by one); only those listed under "
                "\"ssh options\" below", check_ssh_options),
    TextSetting("DSPARK_SSH_HOST_KEY_CHECK", "yes", "cluster",
                "StrictHostKeyChecking for workers: yes, or accept-new to trust a first-seen key",
                _choice("yes", "accept-new")),
    TextSetting("DSPARK_FORWARD_ENV", "", "cluster",
                "Names of variables passed from the launcher's environment to every node's Ray and to vllm serve; "
                "secrets and loader/interpreter names are refused (list below)",
                _env_names),
    TextSetting("DSPARK_STATE_DIR", "", "cluster",
                "State folder (pids, logs, Ray token); default $XDG_STATE_HOME/dspark", single_line),
    # fabric
    TextSetting("DSPARK_FABRIC_IFNAME", "", "fabric",
                "Fabric interface (same name on every node); default for the *_SOCKET_IFNAME below",
                _ifname, required_for_cluster=True),
    TextSetting("NCCL_SOCKET_IFNAME", "", "fabric", "NCCL bootstrap interface(s)", _ifname_list),
    TextSetting("GLOO_SOCKET_IFNAME", "", "fabric", "Gloo interface(s)", _ifname_list),
    TextSetting("TP_SOCKET_IFNAME", "", "fabric", "TensorPipe interface(s)", _ifname_list),
    TextSetting("NCCL_IB_HCA", "", "fabric", "RoCE HCA(s) NCCL uses, in NCCL's form ([^][=]device[:port],...), e.g. "
                "=rocep1s0f1,roceP2p1s0f1; default: each node's device behind the fabric interface and its twin port, "
                "read from its sysfs; every device it selects is checked on its node", _hca_list),
    TextSetting("NCCL_IB_GID_INDEX", "", "fabric",
                "GID index NCCL uses; default: each node's RoCE v2 GID of its fabric IP, read from its sysfs",
                _gid_index),
    TextSetting("DSPARK_NODE_FABRIC", "", "fabric",
                "Per-node fabric values for sites whose nodes differ: NODE:NAME=VALUE, e.g. "
                "worker1:NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0", _node_fabric),
    # serving
    TextSetting("DSPARK_MODEL", "deepseek-ai/DeepSeek-V4-Flash", "serving",
                "Hugging Face model id or local path", not_an_option),
    TextSetting("DSPARK_MODEL_REVISION", "", "serving", "Model revision pin (commit, tag or branch)", _revision),
    TextSetting("DSPARK_SERVED_MODEL_NAME", "deepseek-v4-flash", "serving",
                "Model name clients ask for", _served_name),
    TextSetting("VLLM_HOST", "127.0.0.1", "serving",
                "Address the API binds to; an address other than loopback needs an API key "
                "(or DSPARK_TRUSTED_NETWORK=1)",
                _bind_host),
    TextSetting("DSPARK_PROFILE", DEFAULT_PROFILE, "serving",
                "Model profile: the recipe's vllm serve flags and variables, checked against the installed vLLM "
                "(docs/deepseek-v4-flash.md); none: only the settings' flags", _choice(*PROFILE_NAMES)),
    TextSetting("DSPARK_PROFILE_ENV", "", "serving",
                "The profile's vllm serve variables set otherwise: NAME=VALUE (NAME= leaves it unset), only names "
                "the profile sets (docs/deepseek-v4-flash.md)", _profile_env),
    TextSetting("VLLM_EXTRA_ARGS", "", "serving",
                "Extra vllm serve arguments, split like a shell would (never run by one); the flags the launcher "
                "sets are refused (list below)", _serve_args, quiet=True),
    # security
    TextSetting("VLLM_API_KEY", "", "security", "API key clients must send (never on argv)",
                _api_key, secret=True),
    TextSetting("DSPARK_API_KEYS", "", "security",
                "Several API keys, space-separated (instead of VLLM_API_KEY, never both)",
                _api_key_list, secret=True),
    TextSetting("RAY_AUTH_MODE", "token", "security",
                "Ray authentication: token (default) or disabled (isolated fabric only)",
                _choice("token", "disabled")),
    TextSetting("RAY_AUTH_TOKEN", "", "security",
                f"Ray token shared by all nodes (at least {RAY_TOKEN_MIN_LENGTH} printable ASCII characters); "
                "generated into the state folder when empty", _ray_token, secret=True),
    TextSetting("DSPARK_RAY_DASHBOARD", "off", "security",
                "Ray dashboard: off, or local (127.0.0.1 only; reach it through an SSH tunnel)",
                _choice("off", "local")),
    # container (docs/containers.md)
    TextSetting("DSPARK_RUNTIME", "host", "container",
                "Where Ray and vLLM run on each node: host (a venv), or one docker or podman container per node",
                _choice("host", "docker", "podman")),
    TextSetting("DSPARK_IMAGE", "", "container",
                "Node image for docker/podman (tag or name@sha256:digest); the same image id on every node",
                check_image),
    TextSetting("DSPARK_CONTAINER_ARGS", "", "container",
                "Extra arguments for the node container's run, split like a shell would; "
                "none that replace the launcher's own (network, ipc, pid, name, label, ...)", check_container_args),
    TextSetting("DSPARK_CONTAINER_PYTHON", "python3", "container",
                "Python inside the image (the one vLLM and Ray are installed for)"),
    TextSetting("DSPARK_CONTAINER_MODEL_CACHE", "", "container",
                "Hugging Face cache folder on every node, mounted at the same path (HF_HOME) in the containers; "
                "default $HF_HOME or ~/.cache/huggingface"),
    TextSetting("DSPARK_CONTAINER_JIT_CACHE", "", "container",
                "Host folder of the JIT compile caches (vLLM, FlashInfer, Triton, TileLang, CuTe DSL), mounted at the "
                "same path so a recreated container does not compile again; default <state dir>/jit-cache; "
                "ours and not group- or other-writable", single_line),
    # model weights (dspark_launch.model)
    TextSetting("DSPARK_MODEL_CACHE", "", "model",
                "Hub cache folder for the weights, same path on every node (default: HF_HUB_CACHE, "
                "else $HF_HOME/hub); vllm serve reads the weights there"),
    TextSetting("DSPARK_MODEL_COPY_STREAMS", "4", "model",
                "Parallel rsync streams per worker for the model copy (one stream is bound by one SSH cipher core)",
                _choice(*(str(n) for n in range(1, 17)))),
    TextSetting("DSPARK_MODEL_COPY_HOSTS", "", "model",
                "Address the model copy reaches each worker at, same order as DSPARK_WORKER_HOSTS ([user@]host; "
                "default: the worker's fabric IP, with the SSH settings of the agent)", _host_list),
    TextSetting("HF_TOKEN", "", "model",
                "Hugging Face token for gated models (default: the hub's token file from `hf auth login`)",
                secret=True),
)

# Names the launcher reads that are not settings of a run.
META_NAMES = frozenset({"DSPARK_ENV_FILE"})
