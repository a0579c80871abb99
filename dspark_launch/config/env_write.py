"""Setting values in an env file in place: each on the line that sets it now (its key, `export`, quotes style
and trailing comment kept), else appended; every other line, comment and the order untouched. Written
atomically (a temporary file in the same folder, flushed, renamed over the old one) with the old file's
mode and, where allowed, its owner."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Mapping

from dspark_launch.errors import ConfigError

_LINE = re.compile(r"^(?P<head>\s*(?:export\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_.]*)\s*=\s*)"
                   r"(?P<value>'[^']*'|\"(?:[^\"\\]|\\.)*\"|[^\s#]*)(?P<tail>.*)$")


def _replaced(line: str, value: str) -> str:
    match = _LINE.match(line)
    quote = match.group("value")[:1] if match.group("value")[:1] in ("'", '"') else ""
    return f"{match.group('head')}{quote}{value}{quote}{match.group('tail')}"


def where_set(path: Path, name: str, source: str) -> int | None:
    """The line (1-based) that sets `name` in `path`, from the setting's source (`path:line`); None when the
    file does not set it. A value from the environment or the CLI is refused: the file would not win."""
    prefix = f"{path}:"
    if source.startswith(prefix) and source[len(prefix):].isdigit():
        return int(source[len(prefix):])
    if source == "default":
        return None
    raise ConfigError(f"{name}: its value comes from {source}, which beats the env file {path}; "
                      f"allowed: unset it there so the env file's line is the one in force")


def set_values(path: Path, changes: Mapping[str, tuple[str, int | None]], note: str = "") -> None:
    """`changes`: name -> (value, the line that sets it now or None). Appended lines get `note` above them."""
    real = Path(os.path.realpath(path))
    text = real.read_text(encoding="utf-8")
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
        if not (1 <= number <= len(lines)) or not _LINE.match(lines[number - 1]):
            raise ConfigError(f"{name}: {path}:{number} is not the assignment it was read from; nothing written")
        lines[number - 1] = _replaced(lines[number - 1], value)
    if added:
        lines += ([f"# {note}"] if note else []) + added
    body = newline.join(lines) + newline
    old = real.stat()
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", dir=real.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(body)
            handle.flush()
            os.fchmod(handle.fileno(), old.st_mode & 0o7777)
            if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(handle.fileno(), old.st_uid, old.st_gid)
                except PermissionError:
                    pass  # not ours to give away: the file stays ours, its mode kept
            os.fsync(handle.fileno())
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
