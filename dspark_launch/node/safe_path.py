"""Folders only this user can write: checked without following links, created with care (stdlib only).

Used for the state folder (on the launcher's machine), for Ray's temp folders and for the logs
(on every node, through its agent). A folder is safe when it is a real folder (not a link), owned
by this user, and neither group nor others can write it (a log folder: nor enter it); an existing
folder is never chmod-ed. A log is opened without following a link, relative to its opened folder,
and only when it is a plain file of this user with no other name (no hard link).

Inside a node container of a rootful runtime the agent is root while the mounted state folder
belongs to the operator on the host: there (CONTAINER_STATE_VAR set, euid 0) a log folder inside
the state folder may also belong to that folder's owner, and what the agent creates there is given
to them (docs/security.md, "The nodes' files").
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

WRITABLE_BY_OTHERS = 0o022
PRIVATE = 0o077  # no access at all for group or others
# Set on every node container (runtime.run_argv): the state folder mounted there at its host path.
CONTAINER_STATE_VAR = "DSPARK_CONTAINER_STATE_DIR"


class UnsafePath(Exception):
    """A folder another user could write or replace; the message names it and why."""


@dataclass(frozen=True)
class LogOwner:
    """Who logs are kept for: this user, or (root agent in a launcher container) the state folder's owner."""

    uid: int
    gid: int

    @property
    def accepted(self) -> frozenset[int]:
        """Owners a log folder or log may have: this user, and the state folder's owner."""
        return frozenset((self.uid, os.geteuid()))

    def not_accepted(self, uid: int) -> str | None:
        if uid in self.accepted:
            return None
        also = f" nor by the state folder's owner (uid {self.uid})" if self.uid != os.geteuid() else ""
        return f"is owned by uid {uid}, not by this user (uid {os.geteuid()}){also}"


def this_user() -> LogOwner:
    return LogOwner(os.geteuid(), os.getegid())


def log_owner(folder: Path) -> LogOwner:
    """This user; for a root agent in a launcher container, when `folder` lies in the mounted state
    folder, that folder's owner (read with lstat: a link, or a folder group or others can write, is
    refused), so the operator who launched keeps reading the logs on the host."""
    root = os.environ.get(CONTAINER_STATE_VAR, "")
    inside = root and os.path.isabs(root) and within(os.path.abspath(folder), os.path.normpath(root))
    if os.geteuid() != 0 or not inside:
        return this_user()
    try:
        st = os.lstat(root)
    except OSError as exc:
        raise UnsafePath(f"the state folder {root}: {exc.strerror}") from None
    problem = _problem(st, WRITABLE_BY_OTHERS, LogOwner(st.st_uid, st.st_gid))
    if problem:
        raise UnsafePath(f"the state folder {root} {problem}")
    return LogOwner(st.st_uid, st.st_gid)


def within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or below it (as text: nothing resolved)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _problem(st: os.stat_result, forbidden: int, owner: LogOwner | None = None) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link (never followed there)"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    not_ours = (owner or this_user()).not_accepted(st.st_uid)
    if not_ours:
        return not_ours
    if st.st_mode & forbidden:
        who = "can write it" if forbidden == WRITABLE_BY_OTHERS else "have access"
        return f"has mode {stat.S_IMODE(st.st_mode):04o}: group or others {who}"
    return None


def check_dir(path: Path, forbidden: int = WRITABLE_BY_OTHERS, owner: LogOwner | None = None) -> None:
    """Raise UnsafePath unless `path` is a folder (not a link) of this user (or `owner`) without the
    `forbidden` mode bits."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UnsafePath(f"{path}: {exc.strerror}") from None
    problem = _problem(st, forbidden, owner)
    if problem:
        raise UnsafePath(f"{path} {problem}")


def check_ancestors(path: Path, owner: LogOwner | None = None) -> None:
    """Every folder above `path` that exists: owned by root or this user (or `owner`), and writable by
    others only with the sticky bit (like /tmp), so nobody else can rename or replace what lies below."""
    trusted = {0, *(owner or this_user()).accepted}
    for parent in list(Path(os.path.abspath(path)).parents)[::-1]:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise UnsafePath(f"{parent}: {exc.strerror}") from None
        if st.st_uid not in trusted:
            raise UnsafePath(f"{parent} (above {path}) is owned by uid {st.st_uid}: that user could replace {path}")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePath(
                f"{parent} (above {path}) has mode {stat.S_IMODE(st.st_mode):04o}: group or others could replace {path}"
            )


def make_dir(path: Path, forbidden: int = WRITABLE_BY_OTHERS, owner: LogOwner | None = None) -> bool:
    """`path` as a safe folder: created 0700 when absent (parents too), else checked; returns whether
    this call created it. Never changes the mode of a folder it did not create. A folder that cannot
    be created raises OSError. With an `owner` other than this user, what is made is given to them."""
    check_ancestors(path, owner)
    created = False
    missing = [p for p in [path, *Path(path).parents] if not os.path.lexists(p)][::-1]
    for folder in missing:
        try:
            os.mkdir(folder, 0o700)
            created = folder == path
        except FileExistsError:
            continue  # made meanwhile by someone else: the check below decides
        if owner and owner.uid != os.geteuid():
            _give(folder, os.O_RDONLY | os.O_DIRECTORY, owner)
    check_dir(path, forbidden, owner)
    return created


def _give(path: Path, flags: int, owner: LogOwner) -> None:
    """chown what this call just made to `owner`, through a descriptor: never a link's target."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, owner.uid, owner.gid)
    finally:
        os.close(fd)


def make_log_dir(path: Path) -> bool:
    """A log folder: as `make_dir`, and private (0700 when made; an existing one group or others can
    enter is refused): logs show what was served. In a launcher container see `log_owner`."""
    return make_dir(path, PRIVATE, log_owner(path))


def open_log(path: Path, rotate: bool = False):
    """`path` opened for appending (created 0600) in a private log folder of this user, made when
    absent; with `rotate` the old log is first renamed to `<path>.1`. UnsafePath, naming `path`, when
    the folder is unsafe or `path` is a symbolic link, not a plain file of this user, or a hard link:
    never followed, never written through. The folder is opened once (not a link) and checked, and the
    log opened in it, so neither can be swapped between check and use."""
    owner = log_owner(path.parent)
    make_dir(path.parent, PRIVATE, owner)
    folder = _open_folder(path.parent, owner)
    try:
        return _open_in(folder, path, rotate, owner)
    finally:
        os.close(folder)


def promote_log(pending: Path, path: Path) -> None:
    """`pending` (a log of this user in the same private folder) renamed to `path`, the old `path` kept as
    `<path>.1`: a process writing `pending` goes on writing, now under `path`. UnsafePath as `open_log`."""
    if pending.parent != path.parent:
        raise UnsafePath(f"log {pending} is not in the folder of {path}")
    owner = log_owner(path.parent)
    folder = _open_folder(path.parent, owner)
    try:
        _check_log(pending, os.lstat(pending.name, dir_fd=folder), owner)
        try:
            _check_log(path, os.lstat(path.name, dir_fd=folder), owner)
            os.replace(path.name, f"{path.name}.1", src_dir_fd=folder, dst_dir_fd=folder)
        except FileNotFoundError:
            pass
        os.replace(pending.name, path.name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)


def _open_folder(path: Path, owner: LogOwner) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(f"{path} is a symbolic link or not a folder (never followed there)") from None
        raise
    problem = _problem(os.fstat(fd), PRIVATE, owner)
    if problem:
        os.close(fd)
        raise UnsafePath(f"{path} {problem}")
    return fd


def _open_in(folder: int, path: Path, rotate: bool, owner: LogOwner):
    name = path.name
    try:
        _check_log(path, os.lstat(name, dir_fd=folder), owner)  # before the open: a FIFO would block it
        if rotate:
            os.replace(name, f"{name}.1", src_dir_fd=folder, dst_dir_fd=folder)  # a rename: never follows a link
    except FileNotFoundError:
        pass
    try:
        fd = os.open(
            name,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o600,
            dir_fd=folder,
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"log {path} is a symbolic link (never followed)") from None
        raise
    try:
        st = os.fstat(fd)
        _check_log(path, st, owner)
        if st.st_uid != owner.uid:
            os.fchown(fd, owner.uid, owner.gid)  # root's log in the operator's folder: theirs to read
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def _check_log(path: Path, st: os.stat_result, owner: LogOwner) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"log {path} is a symbolic link (never followed)")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"log {path} is not a plain file")
    not_ours = owner.not_accepted(st.st_uid)
    if not_ours:
        raise UnsafePath(f"log {path} {not_ours}")
    if st.st_nlink != 1:
        raise UnsafePath(f"log {path} has {st.st_nlink} names (a hard link: never appended to)")


def read_private(path: Path, forbidden: int = WRITABLE_BY_OTHERS, limit: int | None = None) -> bytes:
    """A plain file of this user with none of the `forbidden` mode bits, opened without following a
    link (FileNotFoundError when absent; PermissionError when not such a file, or over `limit` bytes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & forbidden:
            raise PermissionError(
                errno.EPERM,
                f"not a regular file of this user that only it can write "
                f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})",
            )
        data = handle.read() if limit is None else handle.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise PermissionError(errno.EFBIG, f"{path} is larger than {limit} bytes")
    return data


def write_temp(path: Path, text: str) -> str:
    """`text` in a new 0600 file beside `path` with a unique name (O_EXCL: never an existing file or link)."""
    import tempfile  # here: it pulls shutil and random into every node-agent process, and few write a file

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_private(path: Path, text: str) -> None:
    """Replace `path` by a new 0600 file holding `text` (renamed over it: the old one is never followed)."""
    tmp = write_temp(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
