"""A node's procfs, sysfs and /lib/modules as the platform pre-flight reads them (node/platform.py), built under a
folder: a GB10 that is fine by default, each fact replaceable (CmaTotal, the kernel, the driver's module, the
ConnectX firmware)."""

from __future__ import annotations

from pathlib import Path

from tests.support.sysfs import V2, add_port, ipv4_gid

KERNEL = "6.11.0-1016-nvidia"
DRIVER = "580.95.05"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def meminfo(available_kb: int, total_kb: int = 125_000_000, cma_kb: int | None = 65536) -> str:
    cma = f"CmaTotal:       {cma_kb} kB\nCmaFree:        {cma_kb} kB\n" if cma_kb is not None else ""
    return (
        f"MemTotal:       {total_kb} kB\nMemFree:        {available_kb // 2} kB\n"
        f"MemAvailable:   {available_kb} kB\n{cma}"
    )


def pressure(some: float, full: float = 0.0) -> str:
    return (
        f"some avg10={some:.2f} avg60=0.00 avg300=0.00 total=0\nfull avg10={full:.2f} avg60=0.00 avg300=0.00 total=0\n"
    )


def spark_tree(
    root: Path,
    ip: str = "10.9.0.1",
    kernel: str = KERNEL,
    cma_kb: int | None = 65536,
    module_kernels: tuple[str, ...] = (KERNEL,),
    loaded: bool = True,
    firmware: str = "28.45.1020",
    driver: str | None = DRIVER,
    available_kb: int = 100_000_000,
    nvidia: bool = True,
) -> Path:
    """`root`/proc, `root`/sys and `root`/modules of one node: the fabric port fab0 (RoCE v2, ACTIVE, MTU 9000, 200
    Gb/s) with its ConnectX firmware, the kernel, meminfo (CmaTotal), PSI, the driver and its module's builds."""
    proc, sys, modules = root / "proc", root / "sys", root / "modules"
    write(proc / "sys" / "kernel" / "osrelease", kernel + "\n")
    write(proc / "meminfo", meminfo(available_kb, cma_kb=cma_kb))
    write(proc / "pressure" / "memory", pressure(0.0))
    if nvidia and driver:
        write(
            proc / "driver" / "nvidia" / "version",
            f"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  {driver}  Release Build  (dvs-builder)\n"
            "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n",
        )
    if nvidia and loaded:
        write(sys / "module" / "nvidia" / "version", f"{driver}\n")
    for release in (kernel, *module_kernels):
        nvidia_line = (
            "updates/dkms/nvidia.ko.zst: kernel/drivers/video/fbdev/core/fb.ko.zst\n"
            if nvidia and release in module_kernels
            else ""
        )
        write(modules / release / "modules.dep", "kernel/fs/ext4/ext4.ko.zst: kernel/fs/mbcache.ko.zst\n" + nvidia_line)
    add_port(sys, "0000:01:00.1", "fab0", "rocep1s0f1", {3: (ipv4_gid(ip), V2)})
    write(sys / "class" / "infiniband" / "rocep1s0f1" / "fw_ver", firmware + "\n")
    write(sys / "class" / "net" / "fab0" / "speed", "200000\n")
    return root
