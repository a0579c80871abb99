"""The file names a hub listing, a manifest or a verify request gives (stdlib only: nodes use it).

Each is a relative POSIX path (no leading `/`, no `..`, `.` or empty part, no `\\`, no control
character) and, with links resolved, stays inside the model's root: the local model folder, or for
a hub snapshot (`.../models--org--name/snapshots/<commit>`) the repo's cache folder, where the
snapshot's links point into `blobs/`. Files are read only when they are regular files, and never
past the size the manifest lists (a listed `/dev/zero` of size 0 must not be hashed forever).
"""

from __future__ import annotations

import errno
import os
import stat
import unicodedata
from pathlib import Path

from dspark_launch.node.safe_path import within

_CONTROL = ("Cc", "Zl", "Zp")


class UnsafeModelPath(ValueError):
    """A file name that is not a relative path inside the model folder; the whole list is refused."""


def path_problem(path: object) -> str | None:
    """Why `path` is not a relative POSIX path inside its folder, or None."""
    if not isinstance(path, str) or not path:
        return "is not a non-empty file name"
    if any(unicodedata.category(c) in _CONTROL for c in path):
        return "holds a control character"
    if path.startswith("/"):
        return "is absolute"
    if "\\" in path:
        return "holds a backslash"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, '.' or '..' part"
    return None


def require_relative(path: object, origin: str) -> str:
    """`path` when it is a safe relative name; else UnsafeModelPath naming it and where it came from."""
    problem = path_problem(path)
    if problem:
        raise UnsafeModelPath(
            f"{origin}: file name {path!r} {problem}; allowed: a relative path inside the "
            f"model folder without '..', '\\', control characters or a leading '/'"
        )
    return path  # type: ignore[return-value]


def model_root(folder: Path) -> Path:
    """The folder a model's files (links resolved) must stay in: a hub snapshot's repo cache folder,
    else the model folder itself."""
    folder = Path(folder)
    return folder.parent.parent if folder.parent.name == "snapshots" else folder


def resolve_inside(folder: Path, rel: str, origin: str = "manifest") -> Path:
    """The file `rel` names in `folder`, links resolved; UnsafeModelPath unless it stays in the model's root."""
    require_relative(rel, origin)
    root = os.path.realpath(model_root(folder))
    real = os.path.realpath(Path(folder) / rel)
    if not within(real, root):
        raise UnsafeModelPath(
            f"{origin}: {rel!r} in {folder} resolves to {real}, outside {root}; "
            f"refusing the whole list, nothing read or deleted"
        )
    return Path(real)


def check_all_inside(folder: Path, paths, origin: str) -> None:
    """Every one of `paths` inside `folder` (raises on the first that is not)."""
    for rel in paths:
        resolve_inside(folder, rel, origin)


def open_regular(path: Path) -> int:
    """A read descriptor on `path` when it is a regular file (a FIFO or device is never read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    return fd


def read_bounded(path: Path, limit: int, chunk: int):
    """The bytes of regular file `path`, chunk by chunk, at most `limit` + 1 of them (the caller
    sees one byte past the listed size and calls the file too long)."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as handle:
        left = limit + 1
        while left > 0 and (data := handle.read(min(chunk, left))):
            left -= len(data)
            yield data
