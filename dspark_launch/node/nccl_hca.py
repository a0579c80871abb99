"""NCCL_IB_HCA as NCCL reads it (stdlib only: the node side and the settings check share it).

NCCL's grammar (src/transport/net_ib.cc): an optional `^` (use every device except these),
then an optional `=` (exact names; without it each name is a prefix: `mlx5` matches mlx5_0,
mlx5_1 ...), then comma-separated `device[:port]`. In an env file `NCCL_IB_HCA==a,b` is the
value `=a,b` (MiaAI-Lab's recommended form: exactly these two devices).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ENTRY = re.compile(r"([A-Za-z0-9_.-]{1,64})(?::([0-9]{1,3}))?", re.ASCII)
ALLOWED = "[^][=]device[:port],... (NCCL's form: ^ excludes, = matches names exactly), e.g. =rocep1s0f1,roceP2p1s0f1"


@dataclass(frozen=True)
class HcaEntry:
    device: str
    port: str = ""  # "" = every port of the device


@dataclass(frozen=True)
class HcaList:
    devices: tuple[HcaEntry, ...]  # each `device[:port]` as written
    exclude: bool = False  # `^`: every device but these
    exact: bool = False  # `=`: whole names, not prefixes

    def matches(self, entry: HcaEntry, device: str) -> bool:
        return device == entry.device if self.exact else device.startswith(entry.device)

    @property
    def text(self) -> str:
        body = ",".join(e.device + (f":{e.port}" if e.port else "") for e in self.devices)
        return ("^" if self.exclude else "") + ("=" if self.exact else "") + body


def parse_hca_list(value: str) -> HcaList:
    """The parsed list; ValueError (naming the allowed form) when NCCL would not read it so."""
    rest = value.strip()
    exclude = rest.startswith("^")
    rest = rest[1:] if exclude else rest
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    entries = []
    for item in rest.split(","):
        match = _ENTRY.fullmatch(item.strip())
        if not match:
            raise ValueError(ALLOWED)
        entries.append(HcaEntry(match[1], match[2] or ""))
    return HcaList(tuple(entries), exclude, exact)
