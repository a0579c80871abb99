"""Values nobody configured: the documentation address ranges and the example file's fabric interface.

The example ships `192.0.2.1`/`192.0.2.2` (RFC 5737 documentation ranges, never a real host) and an
interface name. Wherever such a value sits (the example, a copy made by `dspark config init`, the
environment), no command dials it and `config check` names the lines to edit.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import lru_cache

from dspark_launch.config.envfile import packaged_example
from dspark_launch.config.settings import Settings

DOCUMENTATION_NETS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
# The settings that name a node: an address nobody configured there is refused.
ADDRESS_SETTINGS = ("DSPARK_HEAD_IP", "DSPARK_WORKER_HOSTS", "DSPARK_WORKER_IPS", "DSPARK_MODEL_COPY_HOSTS")
IFNAME_SETTING = "DSPARK_FABRIC_IFNAME"


@dataclass(frozen=True)
class Placeholder:
    name: str
    value: str
    source: str  # "path:line", "environment", ...

    @property
    def line(self) -> str:
        return f"{self.name}={self.value} ({self.source})"


def documentation_address(word: str) -> bool:
    """`[user@]host` or an address inside a documentation range."""
    host = word.rsplit("@", 1)[-1].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in net for net in DOCUMENTATION_NETS if net.version == address.version)


@lru_cache(maxsize=1)
def example_ifname() -> str:
    """DSPARK_FABRIC_IFNAME as the packaged example sets it."""
    for line in packaged_example().read_text(encoding="utf-8").splitlines():
        if line.startswith(IFNAME_SETTING + "="):
            return line.partition("=")[2].strip()
    return ""


def placeholders(settings: Settings) -> list[Placeholder]:
    """Every address setting holding a documentation address; the fabric interface too when it is the example's
    value beside such an address or read from the example file itself (alone it may well be the real name: the
    example's is a DGX Spark's own)."""
    found = [
        Placeholder(name, entry.value, entry.source)
        for name in ADDRESS_SETTINGS
        for entry in (settings.entries[name],)
        if any(documentation_address(w) for w in entry.value.split())
    ]
    ifname = settings.entries[IFNAME_SETTING]
    if ifname.value and ifname.value == example_ifname() and (found or settings.from_example):
        found.append(Placeholder(IFNAME_SETTING, ifname.value, ifname.source))
    return found


def placeholder_error(found: list[Placeholder]) -> str:
    """One line naming every value to edit, where it is, and what is allowed."""
    return (
        f"placeholders from the example still set: {', '.join(p.line for p in found)}; "
        "allowed: your own nodes' addresses and fabric interface (edit those lines)"
    )
