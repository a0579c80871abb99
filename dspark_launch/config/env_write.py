"""Setting values in an env file in place: each on the line that sets it now (its key, `export`, quotes style
and trailing comment kept), else appended; every other line, comment and the order untouched. Written
atomically (a temporary file in the same folder, flushed, renamed over the old one) with the old file's
mode and, where allowed, its owner.

The line numbers come from the settings as read when the command began (`dspark tune --apply` minutes before):
a write goes ahead only while the file is byte for byte what was read then (its sha256, `Settings.env_file_sha256`)
and each rewritten line still sets that setting (its name or an alias); otherwise nothing is written (a line
removed during a tune once turned `VLLM_API_KEY=...` into `VLLM_API_KEY=3`). Checked under an exclusive `flock` on
the file (two dspark writers take turns) and again just before the rename; an editor that writes the file in
place in the microseconds between that last check and the rename is not seen.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Mapping

from dspark_launch.config.registry import load_registry
from dspark_launch.errors import ConfigError

_LINE = re.compile(
    r"^(?P<head>\s*(?:export\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_.]*)\s*=\s*)"
    r"(?P<value>'[^']*'|\"(?:[^\"\\]|\\.)*\"|[^\s#]*)(?P<tail>.*)$"
)
_BOM = "\ufeff"


def _replaced(line: str, value: str) -> str:
    match = _LINE.match(line)
    assert match is not None  # checked by the caller
    quote = match.group("value")[:1] if match.group("value")[:1] in ("'", '"') else ""
    return f"{match.group('head')}{quote}{value}{quote}{match.group('tail')}"


def where_set(path: Path, name: str, source: str) -> int | None:
    """The line (1-based) that sets `name` in `path`, from the setting's source (`path:line`); None when the
    file does not set it. A value from the environment or the CLI is refused: the file would not win."""
    prefix = f"{path}:"
    if source.startswith(prefix) and source[len(prefix) :].isdigit():
        return int(source[len(prefix) :])
    if source == "default":
        return None
    raise ConfigError(
        f"{name}: its value comes from {source}, which beats the env file {path}; "
        f"allowed: unset it there so the env file's line is the one in force"
    )


def _spellings(name: str) -> frozenset[str]:
    """The keys that set `name` in an env file: the name and its aliases (the registry's)."""
    return frozenset({name, *(alias for alias, target in load_registry().aliases.items() if target == name)})


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _require_unchanged(path: Path, real: Path, fd: int, read_sha256: str) -> bytes:
    """The file's bytes, when `real` is still the file open as `fd` and holds what was read (`read_sha256`)."""
    changed = (
        f"{path} changed since it was read when this command began; nothing written; "
        "allowed: run the command again on the file as it is now"
    )
    try:
        same_file = os.stat(real).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        same_file = False
    raw = _read_all(fd)
    if not same_file or hashlib.sha256(raw).hexdigest() != read_sha256:
        raise ConfigError(changed)
    return raw


def set_values(path: Path, changes: Mapping[str, tuple[str, int | None]], *, read_sha256: str, note: str = "") -> None:
    """`changes`: name -> (value, the line that sets it now or None). Appended lines get `note` above them.
    `read_sha256`: the sha256 of the file's bytes as the line numbers were read (`Settings.env_file_sha256`);
    ConfigError, nothing written, when the file changed since or a line no longer sets its setting."""
    real = Path(os.path.realpath(path))
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot open it ({exc.strerror}); nothing written") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another dspark writing this file waits, then finds it changed
        raw = _require_unchanged(path, real, fd, read_sha256)
        body = _rewritten(path, raw.decode("utf-8"), changes, note)
        _replace(path, real, fd, read_sha256, body)
    finally:
        os.close(fd)


def _rewritten(path: Path, text: str, changes: Mapping[str, tuple[str, int | None]], note: str) -> str:
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.split(newline)
    ended = bool(lines) and lines[-1] == ""
    if ended:
        lines.pop()
    added = []
    for name, (value, number) in changes.items():
        if number is None:
            added.append(f"{name}={value}")
            continue
        line = lines[number - 1] if 1 <= number <= len(lines) else ""
        bom = _BOM if number == 1 and line.startswith(_BOM) else ""
        match = _LINE.match(line[len(bom) :])
        if match is None or match.group("key") not in _spellings(name):
            found = f"sets {match.group('key')}" if match else "is not an assignment"
            raise ConfigError(
                f"{name}: {path}:{number} {found}, not {name} (the file changed since it was read); "
                "nothing written; allowed: run the command again on the file as it is now"
            )
        lines[number - 1] = bom + _replaced(line[len(bom) :], value)
    if added:
        lines += ([f"# {note}"] if note else []) + added
    return newline.join(lines) + newline


def _replace(path: Path, real: Path, fd: int, read_sha256: str, body: str) -> None:
    """`body` into a temporary file beside `real`, renamed over it once the file is checked unchanged again."""
    old = os.fstat(fd)
    out, tmp = tempfile.mkstemp(prefix=f".{real.name}.", dir=real.parent)
    try:
        with os.fdopen(out, "w", encoding="utf-8", newline="") as handle:
            handle.write(body)
            handle.flush()
            os.fchmod(handle.fileno(), old.st_mode & 0o7777)
            if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(handle.fileno(), old.st_uid, old.st_gid)
                except PermissionError:
                    pass  # not ours to give away: the file stays ours, its mode kept
            os.fsync(handle.fileno())
        _require_unchanged(path, real, fd, read_sha256)  # the last look before the rename
        os.replace(tmp, real)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    folder = os.open(real.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
