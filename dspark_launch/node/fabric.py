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

from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.node.module_lookup import installed
from dspark_launch.node.nccl_hca import parse_hca_list
from dspark_launch.node.values import FabricEnv, FabricRequest

SYSFS_ROOT_VAR = "DSPARK_TEST_SYSFS_ROOT"  # tests only: a fake sysfs tree per node

# Same on every node; each with its reason in docs/deepseek-v4-flash.md.
FIXED_ENV: tuple[tuple[str, str], ...] = (
    ("NCCL_CROSS_NIC", "1"),
    ("NCCL_CUMEM_ENABLE", "0"),
    ("NCCL_IGNORE_CPU_AFFINITY", "1"),
    ("RAY_memory_monitor_refresh_ms", "0"),
)
# Only where this node's vLLM reads it: vLLM's compiled-graph Ray executor (RayDistributedExecutor,
# vllm/v1/executor/ray_executor.py) sets 300 s when it is unset, and a first request that JIT-compiles kernels runs
# past that. vLLM 0.32 has that executor beside its default RayExecutorV2 (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 picks
# it); 0.33 removed both it and the variable (0.34 too): only RayExecutorV2, which reads no RAY_CGRAPH_* variable
# and times a step out at VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (the profile's 1800). Decided by the node's own
# install (the executor's module present), as each node's agent computes its environment.
CGRAPH_ENV: tuple[tuple[str, str], ...] = (("RAY_CGRAPH_get_timeout", "1800"),)
CGRAPH_EXECUTOR = "vllm.v1.executor.ray_executor"
ROCE_ENV: tuple[tuple[str, str], ...] = (
    ("NCCL_NET", "IB"),
    ("NCCL_IB_DISABLE", "0"),
    ("NCCL_IB_ROCE_VERSION_NUM", "2"),
)

# Names whose value is a node's own: vLLM must not copy the head's over them.
NON_CARRY_OVER: tuple[str, ...] = (
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_NET",
    "NCCL_IB_DISABLE",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "VLLM_CONFIG_ROOT",  # the head's folder holding this very list: a path on the head only
)
NON_CARRY_OVER_FILE = "ray_non_carry_over_env_vars.json"  # vllm/ray/ray_env.py reads it from VLLM_CONFIG_ROOT


class FabricError(DsparkError):
    """The fabric is not as NCCL needs it (exit 1): nothing is started."""


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
    return ":".join(packed[i : i + 4] for i in range(0, 32, 4))


def _ipv4_of_gid(gid: str) -> str:
    """The IPv4 address an IPv4-mapped GID carries; "" for any other GID (IPv6, link-local, unset)."""
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return ""
    if mapped is None or mapped.is_link_local or mapped.is_unspecified:  # 169.254/16: an autoconf address
        return ""
    return str(mapped)


@dataclass(frozen=True)
class _Member:
    """One RDMA device port as NCCL would use it, with what its sysfs says."""

    hca: str
    port: str
    netdev: str  # the device's own network interface ("" when sysfs names none)
    state: str  # "4: ACTIVE"
    link_layer: str  # "Ethernet" for RoCE
    own_gids: tuple[tuple[str, str], ...]  # (index, IPv4) of each RoCE v2 GID of the netdev's own IPv4 address

    @property
    def label(self) -> str:
        return f"{self.hca} port {self.port}" + (f" ({self.netdev})" if self.netdev else "")

    @property
    def unusable(self) -> str:
        """Why NCCL cannot use this port for RoCE ("" when it can)."""
        if not self.state.endswith("ACTIVE"):
            return f"{self.label} is not ACTIVE (state {self.state or 'unreadable'})"
        if self.link_layer != "Ethernet":
            return f"{self.label} has link layer {self.link_layer or 'unreadable'}, not Ethernet (RoCE)"
        return ""

    def index_of(self, ip: str) -> str:
        return next((index for index, own in self.own_gids if own == ip), "")


def _member(root: Path, hca: str, port: str) -> _Member:
    """Port `port` of `hca`: its state, link layer, netdev, and the RoCE v2 GIDs of that netdev's own IPv4
    addresses (`gid_attrs/ndevs/N` names the netdev a GID belongs to, as MiaAI-Lab's recipe checks)."""
    device = root / "class" / "infiniband" / hca
    netdevs = sorted(p.name for p in (device / "device" / "net").glob("*"))
    netdev = netdevs[0] if netdevs else ""
    folder = device / "ports" / port
    own = []
    for entry in sorted((folder / "gids").glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        ip = _ipv4_of_gid(_read(entry))
        if (
            ip
            and "RoCE v2" in _read(folder / "gid_attrs" / "types" / entry.name)
            and netdev
            and _read(folder / "gid_attrs" / "ndevs" / entry.name) == netdev
        ):
            own.append((entry.name, ip))
    return _Member(hca, port, netdev, _read(folder / "state"), _read(folder / "link_layer"), tuple(own))


def _ports(root: Path, hca: str) -> list[str]:
    return sorted(
        (p.name for p in (root / "class" / "infiniband" / hca / "ports").glob("*")),
        key=lambda n: int(n) if n.isdigit() else 0,
    )


def _twins(root: Path, hca: str) -> list[str]:
    """RDMA devices on the same bus:device.function in another PCI domain: the same QSFP port's second link."""
    domain, _, place = _pci_address(root, hca).partition(":")
    twins = []
    for other in sorted(p.name for p in (root / "class" / "infiniband").glob("*")):
        other_domain, _, other_place = _pci_address(root, other).partition(":")
        if other != hca and place and other_place == place and other_domain != domain:
            twins.append(other)
    return twins


def _operator_members(root: Path, request: FabricRequest, known: list[str]) -> list[_Member]:
    """Every device port the operator's NCCL_IB_HCA selects, as NCCL reads the list; ConfigError for a name that
    selects nothing, a port the device lacks, or a list that leaves no device."""
    given = f"NCCL_IB_HCA={request.hca_list} for {request.node}"
    try:
        wanted = parse_hca_list(request.hca_list)
    except ValueError as exc:
        raise ConfigError(f"{given}: not NCCL's form; allowed: {exc}") from None
    allowed = f"allowed: {', '.join(known) or 'none found'}"
    members: list[_Member] = []
    if wanted.exclude:
        for hca in known:
            if not any(wanted.matches(e, hca) and not e.port for e in wanted.devices):
                members += [
                    _member(root, hca, port)
                    for port in _ports(root, hca)
                    if not any(wanted.matches(e, hca) and e.port == port for e in wanted.devices)
                ]
        if not members:
            raise ConfigError(f"{given}: excludes every RDMA device there; {allowed}")
        return members
    for entry in wanted.devices:
        hcas = [h for h in known if wanted.matches(entry, h)]
        if not hcas:
            raise ConfigError(f"{given}: {entry.device} is no RDMA device there; {allowed}")
        for hca in hcas:
            ports = _ports(root, hca)
            if entry.port and entry.port not in ports:
                raise ConfigError(f"{given}: {hca} has no port {entry.port}; allowed: {', '.join(ports) or 'none'}")
            members += [_member(root, hca, port) for port in ([entry.port] if entry.port else ports)]
    return members


def _mtu_warnings(root: Path, node: str, members: list[_Member]) -> list[str]:
    warnings = []
    for netdev in dict.fromkeys(m.netdev for m in members if m.netdev):
        mtu = _read(root / "class" / "net" / netdev / "mtu")
        if mtu.isdigit() and int(mtu) < 9000:
            warnings.append(
                f"{node}: MTU {mtu} on fabric member {netdev}, below 9000: RoCE runs with smaller "
                f"frames (set mtu 9000 on {netdev} on every node)"
            )
    return warnings


def executor_env() -> tuple[tuple[tuple[str, str], ...], str]:
    """The Ray executor's variables this node's vLLM reads (CGRAPH_ENV or none), and the note saying why."""
    if installed(CGRAPH_EXECUTOR):
        return CGRAPH_ENV, (
            f"RAY_CGRAPH_get_timeout=1800: this vLLM has the compiled-graph Ray executor "
            f"({CGRAPH_EXECUTOR}, VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0), which reads it (300 s unset)"
        )
    return (), (
        f"RAY_CGRAPH_get_timeout not set: this vLLM has no {CGRAPH_EXECUTOR} (removed in 0.33), so nothing "
        "reads it; its RayExecutorV2 times a step out at VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
    )


def fabric_env(request: FabricRequest, root: Path | None = None) -> FabricEnv:
    """Node side: this node's fabric variables; FabricError/ConfigError (one line) when NCCL could not use them.
    No usable RoCE behind the fabric interface: `roce` False with `missing` saying what (the launcher refuses to
    start on it unless DSPARK_ALLOW_TCP_FABRIC=1)."""
    root = root or sysfs_root()
    known = sorted(p.name for p in (root / "class" / "infiniband").glob("*"))
    socket_env = [
        (name, dict(request.socket_ifnames).get(name) or request.ifname)
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
    ]
    if request.hca_list:
        return _operator_fabric(root, request, known, socket_env)
    if not (root / "class" / "net" / request.ifname).exists():
        present = sorted(p.name for p in (root / "class" / "net").glob("*") if p.name != "lo")
        return _tcp_only(
            request,
            socket_env,
            f"no interface {request.ifname} on this node (DSPARK_FABRIC_IFNAME; "
            f"its interfaces: {', '.join(present) or 'only lo'})",
        )
    behind = sorted(p.name for p in (root / "class" / "net" / request.ifname / "device" / "infiniband").glob("*"))
    if not behind:
        return _tcp_only(request, socket_env, f"no RDMA device behind {request.ifname}")
    notes = [f"RoCE device {behind[0]} behind {request.ifname}"]
    primary = next((m for port in _ports(root, behind[0]) if not (m := _member(root, behind[0], port)).unusable), None)
    if primary is None:
        first = _ports(root, behind[0])
        why = _member(root, behind[0], first[0]).unusable if first else f"{behind[0]} has no port"
        return _tcp_only(request, socket_env, f"{request.ifname}: {why}")
    gid_index = request.gid_index or _fabric_ip_index(primary, request)
    _check_index(primary, gid_index, request, primary_member=True)
    notes.append(
        f"NCCL_IB_GID_INDEX {gid_index}: "
        + ("the operator's" if request.gid_index else f"the RoCE v2 GID of {request.fabric_ip} on {primary.hca}")
    )
    members, warnings = [primary], []
    for twin in _twins(root, primary.hca):
        candidate = _member(root, twin, primary.port)
        problem = candidate.unusable or (
            ""
            if any(index == gid_index for index, _ in candidate.own_gids)
            else f"no RoCE v2 GID of its own IPv4 address at index {gid_index}"
            + (
                f" (its own at {', '.join(i for i, _ in candidate.own_gids)})"
                if candidate.own_gids
                else f" ({candidate.netdev or 'its netdev'} carries no IPv4 address of its own)"
            )
        )
        if problem:
            warnings.append(f"{request.node}: twin port {twin} left out of NCCL_IB_HCA: {problem}")
        else:
            members.append(candidate)
            notes.append(
                f"twin port {twin}: same QSFP port, RoCE v2 GID of its own {_ip_at(candidate, gid_index)} "
                f"at index {gid_index}"
            )
    return _roce_env(
        request, socket_env, members, gid_index, notes, warnings + _mtu_warnings(root, request.node, members)
    )


def _operator_fabric(root: Path, request: FabricRequest, known: list[str], socket_env) -> FabricEnv:
    """The operator's NCCL_IB_HCA: every device port it selects must be usable with the one GID index."""
    members = _operator_members(root, request, known)
    notes = [f"NCCL_IB_HCA {request.hca_list}: the operator's ({', '.join(m.label for m in members)})"]
    usable = [m for m in members if not m.unusable]
    for member in members:
        if member.unusable:
            if not parse_hca_list(request.hca_list).exclude:
                raise ConfigError(
                    f"NCCL_IB_HCA={request.hca_list} for {request.node}: {member.unusable}; "
                    "allowed: ACTIVE Ethernet (RoCE) ports only"
                )
            notes.append(f"{member.unusable}: NCCL skips it")
    if not usable:
        return _tcp_only(
            request, socket_env, f"{request.ifname}: no ACTIVE Ethernet port among NCCL_IB_HCA={request.hca_list}"
        )
    primary = next((m for m in usable if m.netdev == request.ifname), usable[0])
    gid_index = request.gid_index or _fabric_ip_index(primary, request)
    for member in usable:
        _check_index(member, gid_index, request, primary_member=member is primary)
    notes.append(
        f"NCCL_IB_GID_INDEX {gid_index}: "
        + ("the operator's" if request.gid_index else f"the RoCE v2 GID of {request.fabric_ip} on {primary.hca}")
        + f", checked on {', '.join(m.hca for m in usable)}"
    )
    return _roce_env(
        request, socket_env, usable, gid_index, notes, _mtu_warnings(root, request.node, usable), request.hca_list
    )


def _ip_at(member: _Member, index: str) -> str:
    return next((ip for i, ip in member.own_gids if i == index), "")


def _fabric_ip_index(member: _Member, request: FabricRequest) -> str:
    index = member.index_of(request.fabric_ip)
    if not index:
        raise FabricError(
            f"{request.node}: no RoCE v2 GID carries the fabric IP {request.fabric_ip} on {member.hca} "
            f"(behind {member.netdev or request.ifname}); NCCL would hang at init: check the address on "
            f"{request.ifname}, or set this node's NCCL_IB_GID_INDEX in DSPARK_NODE_FABRIC"
        )
    return index


def _check_index(member: _Member, index: str, request: FabricRequest, primary_member: bool) -> None:
    """NCCL uses one GID index for every device: at it, each member needs a RoCE v2 GID of its own netdev's IPv4
    (the primary: the fabric IP itself)."""
    ip = _ip_at(member, index)
    if ip and (ip == request.fabric_ip or not primary_member):
        return
    own = ", ".join(f"{i}: {a}" for i, a in member.own_gids) or "none"
    raise FabricError(
        f"{request.node}: {member.label} has no RoCE v2 GID of "
        f"{'the fabric IP ' + request.fabric_ip if primary_member else 'its own IPv4 address'} at "
        f"index {index} (its own RoCE v2 IPv4 GIDs: {own}); NCCL uses one NCCL_IB_GID_INDEX for every "
        f"device and would hang at init: fix the address, or this node's NCCL_IB_HCA / "
        f"NCCL_IB_GID_INDEX in DSPARK_NODE_FABRIC"
    )


def _tcp_only(request: FabricRequest, socket_env, missing: str) -> FabricEnv:
    warning = (
        f"{request.node}: {missing}: NCCL falls back to TCP sockets (hazyumps measured ~12 against 30+ tok/s); "
        "see docs/cluster.md"
    )
    # NCCL_IB_DISABLE=1: NCCL goes straight to sockets instead of probing IB devices that cannot carry the fabric.
    executor, note = executor_env()
    env = socket_env + [("NCCL_IB_DISABLE", "1"), *FIXED_ENV, *executor]
    return FabricEnv(request.node, tuple(env), (), "", False, (note,), (warning,), missing)


def _roce_env(
    request: FabricRequest,
    socket_env,
    members: list[_Member],
    gid_index: str,
    notes: list[str],
    warnings: list[str],
    hca_value: str = "",
) -> FabricEnv:
    hcas = tuple(dict.fromkeys(m.hca for m in members))
    value = hca_value or ",".join(hcas)
    executor, note = executor_env()
    env = socket_env + [("NCCL_IB_HCA", value), ("NCCL_IB_GID_INDEX", gid_index), *ROCE_ENV, *FIXED_ENV, *executor]
    return FabricEnv(request.node, tuple(env), hcas, gid_index, True, (*notes, note), tuple(warnings))


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
