"""Who holds a listening TCP port, before anything carrying a secret is sent there (stdlib only).

A port above 1024 can be bound by any local user once our server is gone (a reboot, a crash), and a
client sends its Ray token or API key to whoever answers. So every call that carries one first asks
this node: the listening sockets a connection to IP:PORT could reach (`/proc/net/tcp` and `tcp6`,
state LISTEN, the address itself, the wildcard or the IPv4-mapped form), and the processes whose
`/proc/PID/fd` hold those sockets' inodes. The port is ours only when every such socket is held by a
recorded process (same pid, start time and boot) or one of its descendants.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from dspark_launch.node import procfs
from dspark_launch.agent import protocol as p

_LISTEN = "0A"


@dataclass(frozen=True)
class ListeningSocket:
    address: str
    port: int
    uid: int
    inode: int


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host byte order (little-endian on x86-64 and arm64)."""
    raw = bytes.fromhex(hex_address)
    native = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, native)


def listening_sockets(port: int, net: Path = Path("/proc/net")) -> list[ListeningSocket]:
    """Every socket listening on `port` in this network namespace, IPv4 and IPv6."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            hex_address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port:
                found.append(ListeningSocket(_address(hex_address), port, int(fields[7]), int(fields[9])))
    return found


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return ipaddress.ip_address(socket.gethostbyname(host))


def reaches(listening: str, target: str) -> bool:
    """Whether a connection to `target` could land on a socket listening on `listening`."""
    bound, aimed = _ip(listening), _ip(target)
    if bound == aimed or (bound.version == aimed.version and bound.is_unspecified):
        return True
    if bound.version == 6 and aimed.version == 4:  # a dual-stack socket takes IPv4 too
        return bound.is_unspecified or bound.ipv4_mapped == aimed
    return False


def socket_inodes(pid: int) -> set[int]:
    """The socket inodes among /proc/PID/fd; empty when gone or not ours to read."""
    inodes: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _alive(proc: p.Process, boot: str) -> bool:
    return (not proc.boot_id or proc.boot_id == boot) and procfs.start_time(proc.pid) == proc.start_time


def _with_descendants(roots: set[int], pids: Iterable[int]) -> set[int]:
    parents = {pid: procfs.parent(pid) for pid in pids}
    ours = set(roots)
    for pid in parents:
        chain, at = [], pid
        while at and at not in ours and at not in chain and at in parents:
            chain.append(at)
            at = parents[at]
        if at in ours:
            ours.update(chain)
    return ours


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def port_holder_query(req: p.PortHolderQuery, report: p.Report | None = None) -> p.PortHolderAnswer:
    """OURS, NONE (nothing listens), GONE (nothing listens and the recorded process is gone) or FOREIGN
    (some socket that could take the connection is not held by a recorded process or its descendants)."""
    boot = procfs.boot_id()
    alive = {proc.pid for proc in req.processes if _alive(proc, boot)}
    sockets = [s for s in listening_sockets(req.port) if reaches(s.address, req.ip)]
    if not sockets:
        return p.PortHolderAnswer(p.PortHolderAnswer.NONE if alive else p.PortHolderAnswer.GONE, bool(alive))
    all_pids = procfs.pids()
    ours = _with_descendants(alive, all_pids) if alive else set()
    held = set().union(*(socket_inodes(pid) for pid in ours)) if ours else set()
    strangers = [s for s in sockets if s.inode not in held]
    if not strangers:
        return p.PortHolderAnswer(p.PortHolderAnswer.OURS, True)
    wanted = {s.inode for s in strangers}
    holders: dict[int, list[int]] = {}
    for pid in all_pids:
        for inode in socket_inodes(pid) & wanted:
            holders.setdefault(inode, []).append(pid)
    listeners = tuple(p.PortListener(f"[{s.address}]:{s.port}" if ":" in s.address else f"{s.address}:{s.port}",
                                     min(holders[s.inode]) if s.inode in holders else None, s.uid, _user(s.uid))
                      for s in strangers)
    return p.PortHolderAnswer(p.PortHolderAnswer.FOREIGN, bool(alive), listeners)
