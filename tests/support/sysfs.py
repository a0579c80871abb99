"""A sysfs tree as a DGX Spark shows it (netdevs, RDMA devices, GIDs), built under a folder."""

from __future__ import annotations

import os
from pathlib import Path

# GID types as sysfs names them (gid_attrs/types/N).
V1, V2 = "IB/RoCE v1", "RoCE v2"


def ipv4_gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def add_port(root: Path, pci: str, ifname: str, hca: str | None, gids: dict[int, tuple[str, str]]) -> None:
    """One PCIe function as sysfs shows it: its netdev, its RDMA device, the class links."""
    function = root / "devices" / f"pci{pci[:7]}" / pci
    (function / "net" / ifname).mkdir(parents=True)
    (root / "class" / "net").mkdir(parents=True, exist_ok=True)
    (root / "class" / "net" / ifname).symlink_to(os.path.relpath(function / "net" / ifname, root / "class" / "net"))
    (function / "net" / ifname / "device").symlink_to("../..")
    if hca is None:
        return
    device = function / "infiniband" / hca
    for index, (gid, kind) in gids.items():
        (device / "ports/1/gids").mkdir(parents=True, exist_ok=True)
        (device / "ports/1/gid_attrs/types").mkdir(parents=True, exist_ok=True)
        (device / "ports/1/gids" / str(index)).write_text(gid + "\n")
        (device / "ports/1/gid_attrs/types" / str(index)).write_text(kind + "\n")
    (device / "device").symlink_to("../..")
    (root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    (root / "class" / "infiniband" / hca).symlink_to(os.path.relpath(device, root / "class" / "infiniband"))
