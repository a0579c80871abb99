"""Who holds a listening TCP port, before anything carrying a secret is sent there (stdlib only).

A port above 1024 can be bound by any local user once our server is gone (a reboot, a crash), and a
client sends its Ray token or API key to whoever answers. So every call that carries one first asks
this node: the listening sockets a connection to IP:PORT lands on, and the processes whose
`/proc/PID/fd` hold those sockets' inodes. The port is ours only when every such socket is held by a
recorded process (same pid, start time and boot) or one of its descendants.

Which sockets a connection lands on follows the kernel's own lookup (`__inet_lookup_listener`): a socket
bound to the exact address first (for IPv4 also an IPv6 socket bound to its `::ffff:` form), else its
family's wildcard, else, for IPv4, a dual-stack IPv6 wildcard (`[::]` without `IPV6_V6ONLY`); only the most
specific kind present counts. So our server on 127.0.0.1:P is the holder of 127.0.0.1:P whatever listens on
`[::]:P` beside it, and an `IPV6_V6ONLY` socket never holds an IPv4 address. Linux lets any user bind
`[::]:P` with `IPV6_V6ONLY` beside our 127.0.0.1:P; a more general socket that takes IPv4 (0.0.0.0, a
dual-stack `[::]`, `[::ffff:0.0.0.0]`) cannot listen beside our listening exact one: EADDRINUSE, with
SO_REUSEADDR or SO_REUSEPORT, bound before ours or after (measured as user nobody on Linux 6.18).

The listening sockets come from the kernel's socket diagnostics (NETLINK_SOCK_DIAG, what `ss -l` reads):
only the listening table is walked (tens of microseconds, where reading `/proc/net/tcp` walks every bucket
of the connection table: milliseconds), and it is the only place that says whether a socket is
`IPV6_V6ONLY` (`/proc/net/tcp6` does not). Where the kernel refuses it (no sock_diag), `/proc/net/tcp` and
`tcp6` are read instead, and every IPv6 wildcard counts as taking IPv4 (never a leak: a refusal too many).

`still_held` is the cheap check made before each request that carries an API key (serve/api_holder.py):
the sockets a connection lands on now are among the inodes a full check found the recorded server's. A
listening socket keeps its inode while it lives and cannot change hands (only its holder could pass it on),
so that answers the same as the full check for that socket, without walking /proc.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Union

from dspark_launch.agent import protocol as p
from dspark_launch.node import procfs

_LISTEN = "0A"
Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


@dataclass(frozen=True)
class ListeningSocket:
    address: str
    port: int
    uid: int
    inode: int
    v6only: bool = False  # IPV6_V6ONLY: takes no IPv4 connection


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host byte order (little-endian on x86-64 and arm64)."""
    raw = bytes.fromhex(hex_address)
    native = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, native)


def _proc_listening(port: int, net: Path = Path("/proc/net")) -> list[ListeningSocket]:
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


# NETLINK_SOCK_DIAG (linux/sock_diag.h, linux/inet_diag.h): a dump of one family's TCP sockets in LISTEN.
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST_DUMP = 0x301  # NLM_F_REQUEST | NLM_F_ROOT | NLM_F_MATCH
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCPF_LISTEN = 1 << 10
_INET_DIAG_SKV6ONLY = 11  # sent for every IPv6 socket in LISTEN or CLOSE (inet_diag_msg_attrs_fill)
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_MESSAGE = 72  # inet_diag_msg: family, state, timer, retrans, sockid (48 bytes), expires, rqueue, wqueue, uid, inode


def _diag_listening(family: int) -> list[ListeningSocket]:
    """Every TCP socket of `family` in LISTEN in this network namespace (OSError when the kernel refuses)."""
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _TCPF_LISTEN) + bytes(48)
    found: list[ListeningSocket] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(5)
        nl.sendto(
            _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0) + request, (0, 0)
        )
        while True:
            data = nl.recv(1 << 16)
            at = 0
            while at + _HEADER.size <= len(data):
                length, kind = _HEADER.unpack_from(data, at)[:2]
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR or length < _HEADER.size + _MESSAGE:
                    raise OSError(f"sock_diag answered message type {kind}")
                body = at + _HEADER.size
                size = 4 if data[body] == socket.AF_INET else 16
                address = socket.inet_ntop(data[body], data[body + 8 : body + 8 + size])
                port = struct.unpack_from(">H", data, body + 4)[0]
                uid, inode = struct.unpack_from("=II", data, body + 64)
                v6only, attr = False, body + _MESSAGE
                while attr + 4 <= at + length:
                    attr_length, attr_type = struct.unpack_from("=HH", data, attr)
                    if attr_length < 4:
                        break
                    if attr_type == _INET_DIAG_SKV6ONLY:
                        v6only = bool(data[attr + 4])
                    attr += (attr_length + 3) & ~3
                found.append(ListeningSocket(address, port, uid, inode, v6only))
                at += (length + 3) & ~3


def listening_sockets(port: int) -> list[ListeningSocket]:
    """Every socket listening on `port` in this network namespace, IPv4 and IPv6: from sock_diag, else from
    /proc/net/tcp and tcp6 (then without IPV6_V6ONLY: every IPv6 socket counts as dual-stack)."""
    try:
        return [s for family in (socket.AF_INET, socket.AF_INET6) for s in _diag_listening(family) if s.port == port]
    except OSError:
        return _proc_listening(port)


def bind_address(host: str) -> str:
    """The address a server told to bind `host` listens on, as vLLM binds (`create_server_socket`: IPv6 for an
    IPv6 literal, else IPv4, the name resolved by Python's `bind` like `gethostbyname`: its first IPv4
    address); a literal comes back in its canonical form."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return socket.gethostbyname(host)


def _ip(host: str) -> Address:
    return ipaddress.ip_address(bind_address(host))


def _tier(bound: Address, aimed: Address, v6only: bool) -> int | None:
    """How a socket bound to `bound` takes a connection to `aimed`, in the kernel's order of preference: 0 the
    exact address, 1 its family's wildcard, 2 (IPv4 only) a dual-stack IPv6 wildcard; None: never."""
    if isinstance(bound, ipaddress.IPv6Address) and bound.ipv4_mapped is not None:
        bound = bound.ipv4_mapped  # an IPv6 socket bound to ::ffff:A takes IPv4 connections to A
    if bound == aimed:
        return 0
    if bound.version == aimed.version and bound.is_unspecified:
        return 1
    if bound.version == 6 and aimed.version == 4 and bound.is_unspecified and not v6only:
        return 2
    return None


def reaches(listening: str, target: str, v6only: bool = False) -> bool:
    """Whether a connection to `target` could land on a socket listening on `listening`."""
    return _tier(_ip(listening), _ip(target), v6only) is not None


def landing(sockets: Iterable[ListeningSocket], target: str) -> list[ListeningSocket]:
    """The sockets a connection to `target` lands on: those of the most specific kind present (`_tier`)."""
    aimed = _ip(target)
    tiers = [(tier, s) for s in sockets if (tier := _tier(_ip(s.address), aimed, s.v6only)) is not None]
    best = min((tier for tier, _ in tiers), default=None)
    return [s for tier, s in tiers if tier == best]


def still_held(ip: str, port: int, inodes: Iterable[int]) -> bool:
    """Whether every socket a connection to ip:port lands on now (at least one) is among `inodes`: those a
    full check (`port_holder_query`) found held by the recorded processes. One sock_diag dump, no /proc walk."""
    known = set(inodes)
    now = landing(listening_sockets(port), ip)
    return bool(now) and all(s.inode in known for s in now)


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
    (some socket the connection lands on is not held by a recorded process or its descendants); with OURS, the
    inodes of the sockets it lands on (`still_held` checks them before each later request)."""
    boot = procfs.boot_id()
    alive = {proc.pid for proc in req.processes if _alive(proc, boot)}
    sockets = landing(listening_sockets(req.port), req.ip)
    if not sockets:
        return p.PortHolderAnswer(p.PortHolderAnswer.NONE if alive else p.PortHolderAnswer.GONE, bool(alive))
    all_pids = procfs.pids()
    ours = _with_descendants(alive, all_pids) if alive else set()
    held = set().union(*(socket_inodes(pid) for pid in ours)) if ours else set()
    strangers = [s for s in sockets if s.inode not in held]
    if not strangers:
        return p.PortHolderAnswer(p.PortHolderAnswer.OURS, True, sockets=tuple(sorted(s.inode for s in sockets)))
    wanted = {s.inode for s in strangers}
    holders: dict[int, list[int]] = {}
    for pid in all_pids:
        for inode in socket_inodes(pid) & wanted:
            holders.setdefault(inode, []).append(pid)
    listeners = tuple(
        p.PortListener(
            f"[{s.address}]:{s.port}" if ":" in s.address else f"{s.address}:{s.port}",
            min(holders[s.inode]) if s.inode in holders else None,
            s.uid,
            _user(s.uid),
        )
        for s in strangers
    )
    return p.PortHolderAnswer(p.PortHolderAnswer.FOREIGN, bool(alive), listeners)
