"""A sysfs tree as a DGX Spark shows it (netdevs, RDMA devices, ports, GIDs), built under a folder."""

from __future__ import annotations

import os
from pathlib import Path

# GID types as sysfs names them (gid_attrs/types/N).
V1, V2 = "IB/RoCE v1", "RoCE v2"
ACTIVE, DOWN = "4: ACTIVE", "1: DOWN"


def ipv4_gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def add_port(
    root: Path,
    pci: str,
    ifname: str,
    hca: str | None,
    gids: dict[int, tuple[str, str]],
    state: str = ACTIVE,
    link_layer: str = "Ethernet",
    mtu: int = 9000,
    ndevs: dict[int, str] | None = None,
) -> None:
    """One PCIe function as sysfs shows it: its netdev (with its MTU), its RDMA device with port 1 (state, link
    layer, GIDs with their type and netdev: `ifname` unless `ndevs` says otherwise), the class links."""
    function = root / "devices" / f"pci{pci[:7]}" / pci
    (function / "net" / ifname).mkdir(parents=True)
    (function / "net" / ifname / "mtu").write_text(f"{mtu}\n")
    (root / "class" / "net").mkdir(parents=True, exist_ok=True)
    (root / "class" / "net" / ifname).symlink_to(os.path.relpath(function / "net" / ifname, root / "class" / "net"))
    (function / "net" / ifname / "device").symlink_to("../..")
    if hca is None:
        return
    device = function / "infiniband" / hca
    port = device / "ports" / "1"
    for folder in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / folder).mkdir(parents=True, exist_ok=True)
    (port / "state").write_text(state + "\n")
    (port / "link_layer").write_text(link_layer + "\n")
    for index, (gid, kind) in gids.items():
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs/types" / str(index)).write_text(kind + "\n")
        (port / "gid_attrs/ndevs" / str(index)).write_text((ndevs or {}).get(index, ifname) + "\n")
    (device / "device").symlink_to("../..")
    (root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    (root / "class" / "infiniband" / hca).symlink_to(os.path.relpath(device, root / "class" / "infiniband"))


def fake_spark(root: Path, ip: str, hca: str, twin: str | None, gid_index: int) -> Path:
    """A node's sysfs: `fab0` on RDMA device `hca` (ACTIVE, Ethernet) whose RoCE v2 GID `gid_index` carries `ip`;
    a twin port in PCI domain 0002 with its own address at the same index (a Spark's second PCIe link of the same
    QSFP port)."""
    link_local = ("fe80:0000:0000:0000:0000:0000:0000:0001", V2)
    add_port(root, "0000:01:00.1", "fab0", hca, {0: link_local, gid_index: (ipv4_gid(ip), V2)})
    if twin:  # its own address on its own link, at the same index
        a, b, c, d = ip.split(".")
        add_port(
            root, "0002:01:00.1", "fab1", twin, {0: link_local, gid_index: (ipv4_gid(f"{a}.{b}.{int(c) + 1}.{d}"), V2)}
        )
    return root
