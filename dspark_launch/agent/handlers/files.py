"""The agent's file operations: a private log folder made ready, logs read (tail, in chunks), files found."""

from __future__ import annotations

import os
from pathlib import Path

from dspark_launch.agent import protocol as p
from dspark_launch.agent.protocol import Report


def prepare_log_dir(req: p.PrepareLogDir, report: Report) -> p.PrepareLogDirAnswer:
    """The private log folder made (or found) and written to once (the pre-flight's; `probe` only reads)."""
    return p.PrepareLogDirAnswer(_writable_dir(req.path))


def _writable_dir(path: str) -> str | None:
    """None when `path` is (or can be made) a private log folder this user writes to; else why not,
    naming the path."""
    from dspark_launch.node.safe_path import UnsafePath, make_log_dir

    try:
        make_log_dir(Path(path))
        probe_file = Path(path, f".write-test-{os.getpid()}")
        os.close(os.open(probe_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        probe_file.unlink()
    except UnsafePath as exc:
        return str(exc)
    except OSError as exc:
        return f"{path} is not writable there ({exc.strerror or exc})"
    return None


def tail(req: p.Tail, report: Report) -> p.TailAnswer:
    lines: list[str] = []
    for path in req.paths:
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - p.READ_CHUNK // max(1, len(req.paths))))
                text = handle.read().decode(errors="replace").splitlines()[-req.lines :]
        except OSError:
            continue
        lines += [f"==> {path} <=="] + text
    return p.TailAnswer(tuple(lines))


def read_log(req: p.ReadLog, report: Report) -> p.ReadLogAnswer:
    """Bytes of a log from `offset` on (at most READ_CHUNK: the answer's line stays under MAX_LINE)."""
    try:
        with open(req.path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            offset = min(req.offset, handle.tell())
            handle.seek(offset)
            data = handle.read(p.READ_CHUNK)
    except OSError as exc:
        return p.ReadLogAnswer("", 0, exc.strerror or str(exc))
    return p.ReadLogAnswer(data.decode(errors="replace"), offset + len(data))


def glob(req: p.Glob, report: Report) -> p.GlobAnswer:
    return p.GlobAnswer(tuple(sorted(str(path) for path in Path(req.root).glob(req.pattern))))
