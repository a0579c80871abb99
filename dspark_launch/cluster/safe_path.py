"""Folders only this user can write: checked without following links, created with care (stdlib only).

Used for the state folder (on the launcher's machine), for Ray's temp folders and for the logs
(on every node, through its agent). A folder is safe when it is a real folder (not a link), owned
by this user, and neither group nor others can write it (a log folder: nor enter it); an existing
folder is never chmod-ed. A log is opened without following a link and only when it is a plain
file of this user.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


WRITABLE_BY_OTHERS = 0o022
PRIVATE = 0o077  # no access at all for group or others


class UnsafePath(Exception):
    """A folder another user could write or replace; the message names it and why."""


def _problem(st: os.stat_result, uid: int, forbidden: int) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link (never followed there)"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & forbidden:
        who = "can write it" if forbidden == WRITABLE_BY_OTHERS else "have access"
        return f"has mode {stat.S_IMODE(st.st_mode):04o}: group or others {who}"
    return None


def check_dir(path: Path, forbidden: int = WRITABLE_BY_OTHERS) -> None:
    """Raise UnsafePath unless `path` is a folder (not a link) of this user without the `forbidden`
    mode bits."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UnsafePath(f"{path}: {exc.strerror}") from None
    problem = _problem(st, os.geteuid(), forbidden)
    if problem:
        raise UnsafePath(f"{path} {problem}")


def check_ancestors(path: Path) -> None:
    """Every folder above `path` that exists: owned by root or this user, and writable by others only
    with the sticky bit (like /tmp), so nobody else can rename or replace what lies below."""
    uid = os.geteuid()
    for parent in list(Path(os.path.abspath(path)).parents)[::-1]:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise UnsafePath(f"{parent}: {exc.strerror}") from None
        if st.st_uid not in (0, uid):
            raise UnsafePath(f"{parent} (above {path}) is owned by uid {st.st_uid}: that user could replace {path}")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePath(f"{parent} (above {path}) has mode {stat.S_IMODE(st.st_mode):04o}: "
                             f"group or others could replace {path}")


def make_dir(path: Path, forbidden: int = WRITABLE_BY_OTHERS) -> bool:
    """`path` as a safe folder: created 0700 when absent (parents too), else checked; returns whether
    this call created it. Never changes the mode of a folder it did not create. A folder that cannot
    be created raises OSError."""
    check_ancestors(path)
    created = False
    missing = [p for p in [path, *Path(path).parents] if not os.path.lexists(p)][::-1]
    for folder in missing:
        try:
            os.mkdir(folder, 0o700)
            created = folder == path
        except FileExistsError:
            pass  # made meanwhile by someone else: the check below decides
    check_dir(path, forbidden)
    return created


def make_log_dir(path: Path) -> bool:
    """A log folder: as `make_dir`, and private (0700 when made; an existing one group or others can
    enter is refused): logs show what was served."""
    return make_dir(path, PRIVATE)


def open_log(path: Path, rotate: bool = False):
    """`path` opened for appending (created 0600) in a private log folder of this user, made when
    absent; with `rotate` the old log is first renamed to `<path>.1`. UnsafePath, naming `path`, when
    the folder is unsafe or `path` is a symbolic link or not a plain file of this user: never
    followed, never written through."""
    make_log_dir(path.parent)
    if os.path.lexists(path):
        _check_log(path, os.lstat(path))  # before the open: a FIFO would block it or fail it unnamed
        if rotate:
            os.replace(path, f"{path}.1")  # a rename: it never follows a link at `<path>.1` either
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"log {path} is a symbolic link (never followed)") from None
        raise
    try:
        _check_log(path, os.fstat(fd))
    except UnsafePath:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def _check_log(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"log {path} is a symbolic link (never followed)")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"log {path} is not a plain file")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"log {path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
