"""A node's platform as its own procfs and sysfs say (stdlib, node side), and the pre-flight's judgement of the
nodes side by side (pure: plan, start and status call it with the facts every node's agent read).

What is read: the kernel release, `CmaTotal`, the NVIDIA driver's version and whether its kernel module is loaded or
built for the running kernel (depmod's `modules.dep` of each release under /lib/modules), every RDMA device's
firmware (`fw_ver`: the ConnectX firmware), each of its ports' state and its interface's MTU and link speed, and the
agent's locked-memory limit. Memory for the supervisor's watch: MemTotal, MemAvailable and the kernel's memory
pressure (PSI, /proc/pressure/memory, where the kernel has it).

What is refused (a fact with a public failure report, or one that cannot serve at all), naming the node, the value
and why; what differs between nodes is a warning:
- `CmaTotal: 0 kB` on a node with the NVIDIA driver: NCCL's memory registration for RDMA fails (`ibv_reg_mr`
  ENOMEM) after kernel 7.0.0-1019 on the GB10 (eugr/spark-vllm-docker #389 and #392; MiaAI-Lab's DeepSeek-V4-Flash
  repository #259), fixed by NVIDIA's board firmware update;
- the NVIDIA driver installed (its module found for some kernel) but neither loaded nor built for the running
  kernel: CUDA cannot reach the GPU (a kernel updated without the driver's modules).

The roots are injectable (`PlatformRoots`): the tests give each node a fake tree of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dspark_launch.node.values import FabricPortFacts, PlatformFacts

PROCFS_ROOT_VAR = "DSPARK_TEST_PROCFS_ROOT"  # tests only: a fake /proc (meminfo, pressure, kernel, driver) per node
MODULES_ROOT_VAR = "DSPARK_TEST_MODULES_ROOT"  # tests only: a fake /lib/modules per node


@dataclass(frozen=True)
class PlatformRoots:
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    modules: Path = Path("/lib/modules")

    @classmethod
    def given(cls, proc: str = "", sys: str = "", modules: str = "") -> PlatformRoots:
        """The roots a request names ("" keeps the real one)."""
        return cls(Path(proc or "/proc"), Path(sys or "/sys"), Path(modules or "/lib/modules"))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def meminfo(roots: PlatformRoots) -> dict[str, int]:
    """/proc/meminfo's kB values by name (MemTotal, MemAvailable, CmaTotal, ...)."""
    found: dict[str, int] = {}
    for line in _read(roots.proc / "meminfo").splitlines():
        name, _, rest = line.partition(":")
        words = rest.split()
        if words and words[0].isdigit():
            found[name.strip()] = int(words[0])
    return found


@dataclass(frozen=True)
class Pressure:
    """The kernel's memory pressure (PSI): the share of the last 10 s in which some task (`some`) or every
    non-idle task (`full`) waited for memory, in percent."""

    some_avg10: float
    full_avg10: float


def memory_pressure(roots: PlatformRoots) -> Pressure | None:
    """/proc/pressure/memory; None where the kernel has no PSI (or it is off: `psi=0`)."""
    found: dict[str, float] = {}
    for line in _read(roots.proc / "pressure" / "memory").splitlines():
        kind, _, rest = line.partition(" ")
        match = re.search(r"avg10=([0-9.]+)", rest)
        if match:
            found[kind] = float(match.group(1))
    if "some" not in found:
        return None
    return Pressure(found["some"], found.get("full", 0.0))


_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def _nvidia_driver(roots: PlatformRoots) -> str | None:
    text = _read(roots.proc / "driver" / "nvidia" / "version")
    found = _DRIVER.search(text)
    if found:
        return found.group(1)
    return _read(roots.sys / "module" / "nvidia" / "version") or None


def _release_order(release: str) -> tuple:
    """6.8.0-1010 before 6.11.0-1016: numbers compared as numbers."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", release) if part)


def _module_kernels(root: Path) -> tuple[str, ...]:
    """The kernel releases whose depmod index (`modules.dep`) lists an nvidia module, oldest first."""
    kernels = []
    try:
        releases = sorted((entry.name for entry in root.iterdir() if entry.is_dir()), key=_release_order)
    except OSError:
        return ()
    for release in releases:
        index = _read(root / release / "modules.dep")
        if re.search(r"(^|/)nvidia\.ko(\.(xz|zst|gz))?:", index, re.M):
            kernels.append(release)
    return tuple(kernels)


def _ports(root: Path) -> tuple[FabricPortFacts, ...]:
    """Every port of every RDMA device: firmware, state, and its interface's MTU and speed."""
    found = []
    devices = root / "class" / "infiniband"
    try:
        hcas = sorted(entry.name for entry in devices.iterdir())
    except OSError:
        return ()
    for hca in hcas:
        firmware = _read(devices / hca / "fw_ver")
        netdevs = sorted(p.name for p in (devices / hca / "device" / "net").glob("*"))
        netdev = netdevs[0] if netdevs else ""
        mtu = _read(root / "class" / "net" / netdev / "mtu") if netdev else ""
        speed = _read(root / "class" / "net" / netdev / "speed") if netdev else ""
        for port in sorted((p.name for p in (devices / hca / "ports").glob("*")), key=lambda n: (len(n), n)):
            found.append(
                FabricPortFacts(
                    hca,
                    port,
                    firmware,
                    _read(devices / hca / "ports" / port / "state"),
                    netdev,
                    int(mtu) if mtu.isdigit() else None,
                    int(speed) if speed.isdigit() else None,
                )
            )
    return tuple(found)


def read_platform(roots: PlatformRoots, memlock: str) -> PlatformFacts:
    """This node's facts (`memlock`: the agent's RLIMIT_MEMLOCK, node/versions.memlock_limit)."""
    memory = meminfo(roots)
    return PlatformFacts(
        kernel=_read(roots.proc / "sys" / "kernel" / "osrelease"),
        cma_total_kb=memory.get("CmaTotal"),
        nvidia_driver=_nvidia_driver(roots),
        nvidia_loaded=(roots.sys / "module" / "nvidia").is_dir(),
        nvidia_module_kernels=_module_kernels(roots.modules),
        ports=_ports(roots.sys),
        memlock=memlock,
    )


# ----------------------------------------------------------------------------------- judged across nodes

CMA_REPORTS = "eugr/spark-vllm-docker #389 and #392, MiaAI-Lab's DeepSeek-V4-Flash repository #259"


def _nvidia(facts: PlatformFacts) -> bool:
    """The NVIDIA driver is on this node (loaded, or its module built for some kernel)."""
    return facts.nvidia_driver is not None or facts.nvidia_loaded or bool(facts.nvidia_module_kernels)


def module_state(facts: PlatformFacts) -> str:
    """The NVIDIA kernel module: loaded, built for the running kernel, not built for it, or none installed."""
    if facts.nvidia_loaded:
        return "loaded"
    if not facts.nvidia_module_kernels:
        return "none installed"
    return (
        "built for the running kernel"
        if facts.kernel in facts.nvidia_module_kernels
        else "NOT built for the running kernel"
    )


def modules_line(facts: PlatformFacts) -> str:
    state = module_state(facts)
    if state.startswith("NOT"):
        return f"{state} {facts.kernel} (built for {', '.join(facts.nvidia_module_kernels)})"
    return state


def node_refusals(label: str, facts: PlatformFacts) -> list[str]:
    """What this node's facts refuse (start and plan exit 2), each naming the node, the value and why."""
    refusals = []
    if _nvidia(facts) and facts.cma_total_kb == 0:
        refusals.append(
            f"platform: {label}: CmaTotal 0 kB (kernel {facts.kernel or 'unknown'}): NCCL's memory "
            f"registration for RDMA fails (ibv_reg_mr ENOMEM; {CMA_REPORTS}); update the board firmware "
            "(NVIDIA's fix for kernel 7.0.0-1019) or boot the kernel before it"
        )
    if (
        _nvidia(facts)
        and not facts.nvidia_loaded
        and facts.nvidia_module_kernels
        and facts.kernel not in facts.nvidia_module_kernels
    ):
        refusals.append(
            f"platform: {label}: the NVIDIA driver's kernel module is {modules_line(facts)}: CUDA cannot "
            f"reach the GPU; install the driver's modules for {facts.kernel} (DKMS, or the "
            f"linux-modules-nvidia package of this kernel) or boot {facts.nvidia_module_kernels[-1]}"
        )
    return refusals


def compared(facts: PlatformFacts) -> dict[str, str]:
    """The facts compared across nodes (and with those at start), by name, as text."""

    def values(items) -> str:
        shown = sorted({str(item) for item in items if item not in (None, "")})
        return ", ".join(shown) or "none"

    return {
        "kernel": facts.kernel or "unknown",
        "CmaTotal": "none shown" if facts.cma_total_kb is None else f"{facts.cma_total_kb} kB",
        "NVIDIA driver": facts.nvidia_driver or "none",
        "NVIDIA module": module_state(facts),
        "ConnectX firmware": values(p.firmware for p in facts.ports),
        "fabric port state": values(p.state for p in facts.ports),
        "fabric MTU": values(p.mtu for p in facts.ports),
        "fabric link speed (Mb/s)": values(p.speed_mbps for p in facts.ports),
        "memlock": facts.memlock,
    }


@dataclass(frozen=True)
class PlatformVerdict:
    refusals: tuple[str, ...]  # start and plan exit 2
    warnings: tuple[str, ...]  # the nodes differ

    def lines(self) -> list[str]:
        return [*self.refusals, *self.warnings]


def judge(facts: dict[str, PlatformFacts]) -> PlatformVerdict:
    """Every node's refusals, then a warning for each fact that differs between the nodes (by node label)."""
    refusals = [line for label, node in facts.items() for line in node_refusals(label, node)]
    rows = {label: compared(node) for label, node in facts.items()}
    warnings = []
    if len(rows) > 1:
        for name in next(iter(rows.values())):
            seen = {label: row[name] for label, row in rows.items()}
            if len(set(seen.values())) > 1:
                warnings.append(
                    f"platform: {name} differs between the nodes: "
                    + "; ".join(f"{label} {value}" for label, value in seen.items())
                )
    return PlatformVerdict(tuple(refusals), tuple(warnings))


def drift(at_start: dict[str, str], now: PlatformFacts) -> list[str]:
    """What changed on a node since start: `name before -> now` for each compared fact."""
    current = compared(now)
    return [
        f"{name} {before} -> {current[name]}"
        for name, before in at_start.items()
        if name in current and current[name] != before
    ]
