"""What /proc says about a process: one reader for the product and its tests (stdlib only)."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [0] is field 3 (state); None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def state(pid: int) -> str | None:
    """The one-letter state (R, S, Z, ...), None when gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def start_time(pid: int) -> int | None:
    """Clock ticks since boot when `pid` started (field 22); None when gone or a zombie."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def session(pid: int) -> int | None:
    """The session id (field 6)."""
    fields = stat_fields(pid)
    return int(fields[3]) if fields else None


def parent(pid: int) -> int | None:
    """The parent pid (field 4)."""
    fields = stat_fields(pid)
    return int(fields[1]) if fields else None


def cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def environ(pid: int) -> list[bytes]:
    """NAME=value entries; empty when unreadable (another user's process, or gone)."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def boot_id() -> str:
    """This boot's id: start times count from boot, so a record from another boot matches nothing."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
