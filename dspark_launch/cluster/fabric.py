"""Each node's own fabric environment, read from its sysfs (node side, stdlib only).

On a node: the RoCE devices behind the fabric interface and its twin (a DGX Spark's
QSFP port shows as two PCIe functions, one per PCI domain, each about half of the
200 Gb), the GID index of the RoCE v2 GID that carries the node's fabric IP, and the
NCCL variables that follow. Values differ between nodes (device names, GID indexes
renumbered after a reboot), so each node computes its own and sets them in its own
`ray start` environment; `NON_CARRY_OVER` names them so vLLM does not copy the head's
values over them (see `write_non_carry_over` and docs/deepseek-v4-flash.md).
"""

from __future__ import annotations

import ipaddress
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from dspark_launch.errors import ConfigError, DsparkError

if TYPE_CHECKING:  # the node side imports nothing from config
    from dspark_launch.config.settings import Settings

SYSFS_ROOT_VAR = "DSPARK_TEST_SYSFS_ROOT"  # tests only: a fake sysfs tree per node
# What DSPARK_NODE_FABRIC may set for one node (config/text_settings.py checks the same names).
NODE_FABRIC_NAMES = ("DSPARK_FABRIC_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX",
                     "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")

# Same on every node; each with its reason in docs/deepseek-v4-flash.md.
FIXED_ENV: tuple[tuple[str, str], ...] = (
    ("NCCL_CROSS_NIC", "1"),
    ("NCCL_CUMEM_ENABLE", "0"),
    ("NCCL_IGNORE_CPU_AFFINITY", "1"),
    ("RAY_memory_monitor_refresh_ms", "0"),
    ("RAY_CGRAPH_get_timeout", "1800"),
)
ROCE_ENV: tuple[tuple[str, str], ...] = (("NCCL_NET", "IB"), ("NCCL_IB_DISABLE", "0"), ("NCCL_IB_ROCE_VERSION_NUM", "2"))

# Names whose value is a node's own: vLLM must not copy the head's over them.
NON_CARRY_OVER: tuple[str, ...] = (
    "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
    "VLLM_CONFIG_ROOT",  # the head's folder holding this very list: a path on the head only
)
NON_CARRY_OVER_FILE = "ray_non_carry_over_env_vars.json"  # vllm/ray/ray_env.py reads it from VLLM_CONFIG_ROOT


class FabricError(DsparkError):
    """The fabric is not as NCCL needs it (exit 1): nothing is started."""


@dataclass(frozen=True)
class FabricRequest:
    """What one node needs to work out its fabric environment (built by the launcher, sent to the node's agent)."""

    node: str  # "head", "worker1": for messages
    ifname: str  # the fabric interface on this node
    fabric_ip: str  # the node's fabric IP (Ray's --node-ip-address)
    hcas: tuple[str, ...] = ()  # NCCL_IB_HCA given by the operator (for this node); () = found in sysfs
    gid_index: str = ""  # NCCL_IB_GID_INDEX given by the operator (for this node); "" = found in sysfs
    socket_ifnames: tuple[tuple[str, str], ...] = ()  # NCCL_/GLOO_/TP_SOCKET_IFNAME the operator set


@dataclass(frozen=True)
class FabricEnv:
    """One node's fabric environment, and how each value was found."""

    node: str
    env: tuple[tuple[str, str], ...]
    hcas: tuple[str, ...]
    gid_index: str
    roce: bool  # False: NCCL falls back to TCP sockets
    notes: tuple[str, ...]
    warnings: tuple[str, ...]


def fabric_request(settings: Settings, node: str, fabric_ip: str) -> FabricRequest:
    """Launcher side: the request for one node, its DSPARK_NODE_FABRIC entries over the cluster-wide settings."""
    values = {name: settings[name] for name in NODE_FABRIC_NAMES}
    for entry in settings["DSPARK_NODE_FABRIC"].split():
        target, _, assignment = entry.partition(":")
        name, _, value = assignment.partition("=")
        if target == node:
            values[name] = value
    return FabricRequest(
        node=node, ifname=values["DSPARK_FABRIC_IFNAME"], fabric_ip=fabric_ip,
        hcas=tuple(h for h in values["NCCL_IB_HCA"].split(",") if h), gid_index=values["NCCL_IB_GID_INDEX"],
        socket_ifnames=tuple((n, values[n]) for n in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
                             if values[n]))


def sysfs_root() -> Path:
    return Path(os.environ.get(SYSFS_ROOT_VAR) or "/sys")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _pci_address(root: Path, hca: str) -> str:
    """The PCI address of an RDMA device ("0000:01:00.1"), from its `device` link."""
    return os.path.basename(os.path.realpath(root / "class" / "infiniband" / hca / "device"))


def _gid_of(ip: str) -> str:
    """The GID sysfs shows for `ip`: an IPv4 address as ::ffff:a.b.c.d, in 8 groups of 4 hex digits."""
    address = ipaddress.ip_address(ip)
    if address.version == 4:
        address = ipaddress.IPv6Address("::ffff:" + ip)
    packed = address.packed.hex()
    return ":".join(packed[i:i + 4] for i in range(0, 32, 4))


def _roce_v2_indexes(root: Path, hca: str) -> list[tuple[str, str]]:
    """(index, gid) of every RoCE v2 GID on port 1 of `hca`."""
    port = root / "class" / "infiniband" / hca / "ports" / "1"
    found = []
    for entry in sorted((port / "gids").glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if "RoCE v2" in _read(port / "gid_attrs" / "types" / entry.name):
            found.append((entry.name, _read(entry)))
    return found


def _twins(root: Path, hca: str) -> list[str]:
    """RDMA devices on the same bus:device.function in another PCI domain: the same QSFP port's second link."""
    domain, _, place = _pci_address(root, hca).partition(":")
    twins = []
    for other in sorted(p.name for p in (root / "class" / "infiniband").glob("*")):
        other_domain, _, other_place = _pci_address(root, other).partition(":")
        if other != hca and place and other_place == place and other_domain != domain:
            twins.append(other)
    return twins


def fabric_env(request: FabricRequest, root: Path | None = None) -> FabricEnv:
    """Node side: this node's fabric variables; FabricError/ConfigError (one line) when NCCL could not use them."""
    root = root or sysfs_root()
    notes: list[str] = []
    warnings: list[str] = []
    known = sorted(p.name for p in (root / "class" / "infiniband").glob("*"))
    if request.hcas:
        unknown = [h for h in request.hcas if h not in known]
        if unknown:
            raise ConfigError(f"NCCL_IB_HCA={','.join(request.hcas)} for {request.node}: {', '.join(unknown)} is no "
                              f"RDMA device there; allowed: {', '.join(known) or 'none found'}")
        hcas = list(request.hcas)
        notes.append(f"NCCL_IB_HCA {','.join(hcas)}: the operator's")
    else:
        hcas = sorted(p.name for p in (root / "class" / "net" / request.ifname / "device" / "infiniband").glob("*"))
        if hcas:
            notes.append(f"RoCE device {hcas[0]} behind {request.ifname}")
    socket_env = [(name, dict(request.socket_ifnames).get(name) or request.ifname)
                  for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")]
    if not hcas:
        warnings.append(f"{request.node}: no RoCE device behind {request.ifname}: NCCL falls back to TCP sockets "
                        f"(far slower); see docs/deepseek-v4-flash.md")
        return FabricEnv(request.node, tuple(socket_env + list(FIXED_ENV)), (), "", False, tuple(notes),
                         tuple(warnings))
    gid_index = request.gid_index or _gid_index(root, hcas[0], request)
    notes.append(f"NCCL_IB_GID_INDEX {gid_index}: " + ("the operator's" if request.gid_index else
                                                       f"the RoCE v2 GID of {request.fabric_ip} on {hcas[0]}"))
    if not request.hcas:
        for twin in _twins(root, hcas[0]):
            if gid_index in dict(_roce_v2_indexes(root, twin)):
                hcas.append(twin)
                notes.append(f"twin port {twin}: same QSFP port, RoCE v2 GID at index {gid_index}")
            else:
                warnings.append(f"{request.node}: twin port {twin} left out of NCCL_IB_HCA: no RoCE v2 GID at "
                                f"index {gid_index}")
    env = socket_env + [("NCCL_IB_HCA", ",".join(hcas)), ("NCCL_IB_GID_INDEX", gid_index), *ROCE_ENV, *FIXED_ENV]
    return FabricEnv(request.node, tuple(env), tuple(hcas), gid_index, True, tuple(notes), tuple(warnings))


def _gid_index(root: Path, hca: str, request: FabricRequest) -> str:
    wanted = _gid_of(request.fabric_ip)
    for index, gid in _roce_v2_indexes(root, hca):
        if gid == wanted:
            return index
    raise FabricError(f"{request.node}: no RoCE v2 GID carries the fabric IP {request.fabric_ip} on {hca} "
                      f"(behind {request.ifname}); NCCL would hang at init: check the address on {request.ifname}, "
                      f"or set this node's NCCL_IB_GID_INDEX in DSPARK_NODE_FABRIC")


def write_non_carry_over(config_root: Path, names: tuple[str, ...] = NON_CARRY_OVER) -> Path:
    """Head side: the file vLLM reads (at import, from VLLM_CONFIG_ROOT) naming the variables it must not copy
    from the driver to its Ray workers. Written atomically; `vllm serve` then runs with VLLM_CONFIG_ROOT=config_root."""
    config_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = config_root / NON_CARRY_OVER_FILE
    fd, tmp = tempfile.mkstemp(dir=config_root, prefix=".tmp-")
    with os.fdopen(fd, "w") as handle:
        json.dump(sorted(names), handle)
    os.replace(tmp, target)
    return target
