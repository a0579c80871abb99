"""The non-numeric settings: names, defaults, groups and how each is checked.

Numeric knobs live in `dspark-numeric-knobs.sh`; everything else the launcher
reads is declared here, once. Each check returns the canonical value or raises
ValueError with the "allowed" half of an error line.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass
from typing import Callable

_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}", re.ASCII)
_HOST = re.compile(r"(?:[A-Za-z0-9_.-]+@)?(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])", re.ASCII)
_SERVED_NAME = re.compile(r"[A-Za-z0-9._:/-]+", re.ASCII)


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


def _env_names(value: str) -> str:
    names = value.replace(",", " ").split()
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name, re.ASCII):
            raise ValueError("space-separated environment variable names")
    return " ".join(names)


def _choice(*allowed: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in allowed:
            raise ValueError("one of " + ", ".join(allowed))
        return value

    return check


def _shell_words(value: str) -> str:
    try:
        shlex.split(value)
    except ValueError as exc:
        raise ValueError(f"arguments split like a shell would ({exc})") from None
    return value


def _served_name(value: str) -> str:
    if not _SERVED_NAME.fullmatch(value):
        raise ValueError("letters, digits and ._:/-")
    return value


def _bind_host(value: str) -> str:
    if value in ("localhost",):
        return value
    return _ip(value)


def _api_key(value: str) -> str:
    if any(c.isspace() or c == "\\" for c in value):
        raise ValueError("one key without whitespace, newlines or backslashes")
    return value


def _api_key_list(value: str) -> str:
    if "\n" in value or "\r" in value or "\\" in value:
        raise ValueError("space-separated keys without newlines or backslashes")
    return " ".join(value.split())


@dataclass(frozen=True)
class TextSetting:
    name: str
    default: str
    group: str
    description: str
    check: Callable[[str], str] = _any
    secret: bool = False
    required_for_cluster: bool = False


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
                "Python interpreter that runs the head's agent, Ray and vllm serve (default: the launcher's own)"),
    TextSetting("DSPARK_WORKER_PYTHON", "", "cluster",
                "Python interpreter on the workers (default: the head's interpreter path)"),
    TextSetting("DSPARK_SSH_USER", "", "cluster", "SSH user for the workers (default: ssh's own)"),
    TextSetting("DSPARK_SSH_KEY", "", "cluster", "SSH private key file (default: ssh's own)"),
    TextSetting("DSPARK_SSH_OPTIONS", "", "cluster",
                "Extra ssh arguments, split like a shell would (never run by one)", _shell_words),
    TextSetting("DSPARK_SSH_HOST_KEY_CHECK", "yes", "cluster",
                "StrictHostKeyChecking for workers: yes, or accept-new to trust a first-seen key",
                _choice("yes", "accept-new")),
    TextSetting("DSPARK_FORWARD_ENV", "", "cluster",
                "Names of variables passed from the launcher's environment to every node's Ray and to vllm serve",
                _env_names),
    TextSetting("DSPARK_STATE_DIR", "", "cluster",
                "State folder (pids, logs, Ray token); default $XDG_STATE_HOME/dspark"),
    # fabric
    TextSetting("DSPARK_FABRIC_IFNAME", "", "fabric",
                "Fabric interface (same name on every node); default for the *_SOCKET_IFNAME below",
                _ifname, required_for_cluster=True),
    TextSetting("NCCL_SOCKET_IFNAME", "", "fabric", "NCCL bootstrap interface(s)", _ifname_list),
    TextSetting("GLOO_SOCKET_IFNAME", "", "fabric", "Gloo interface(s)", _ifname_list),
    TextSetting("TP_SOCKET_IFNAME", "", "fabric", "TensorPipe interface(s)", _ifname_list),
    TextSetting("NCCL_IB_HCA", "", "fabric", "RoCE HCA(s) NCCL uses, e.g. rocep1s0f1", _ifname_list),
    # serving
    TextSetting("DSPARK_MODEL", "deepseek-ai/DeepSeek-V4-Flash", "serving",
                "Hugging Face model id or local path"),
    TextSetting("DSPARK_MODEL_REVISION", "", "serving", "Model revision pin (commit, tag or branch)"),
    TextSetting("DSPARK_SERVED_MODEL_NAME", "deepseek-v4-flash", "serving",
                "Model name clients ask for", _served_name),
    TextSetting("VLLM_HOST", "127.0.0.1", "serving",
                "Address the API binds to; 0.0.0.0 exposes it to every network (set an API key)",
                _bind_host),
    TextSetting("VLLM_EXTRA_ARGS", "", "serving",
                "Extra vllm serve arguments, split like a shell would (never run by one)", _shell_words),
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
                "Ray token shared by all nodes; generated into the state folder when empty",
                secret=True),
    TextSetting("DSPARK_RAY_DASHBOARD", "off", "security",
                "Ray dashboard: off, or local (127.0.0.1 only; reach it through an SSH tunnel)",
                _choice("off", "local")),
)

# Names the launcher reads that are not settings of a run.
META_NAMES = frozenset({"DSPARK_ENV_FILE"})

_SECRET_WORDS = re.compile(r"KEY|TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL", re.IGNORECASE)


def looks_secret(name: str) -> bool:
    return bool(_SECRET_WORDS.search(name))
