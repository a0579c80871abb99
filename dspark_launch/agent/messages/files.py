"""Log folders, logs and files on a node (handlers/files.py)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.agent.protocol import Request


@dataclass(frozen=True)
class PrepareLogDir(Request["PrepareLogDirAnswer"]):
    """Make (or find) the private log folder `path` and write to it once."""

    path: str


@dataclass(frozen=True)
class PrepareLogDirAnswer:
    error: str | None  # why it is not a private folder this user writes to, naming it; None when it is


@dataclass(frozen=True)
class Tail(Request["TailAnswer"]):
    paths: tuple[str, ...]
    lines: int = 40


@dataclass(frozen=True)
class TailAnswer:
    lines: tuple[str, ...]


@dataclass(frozen=True)
class ReadLog(Request["ReadLogAnswer"]):
    path: str
    offset: int = 0


@dataclass(frozen=True)
class ReadLogAnswer:
    text: str
    offset: int
    missing: str = ""


@dataclass(frozen=True)
class Glob(Request["GlobAnswer"]):
    root: str
    pattern: str


@dataclass(frozen=True)
class GlobAnswer:
    paths: tuple[str, ...]
