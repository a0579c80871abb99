"""Finding and reading the env file: python-dotenv parses it, nothing executes it.

The file decides which programs run (`DSPARK_HEAD_PYTHON`, ...), so it is read only when nobody
but this user or root could have written it: the file and the folder holding it owned by this
user or root and not writable by group or others, the folders above as for the state folder
(docs/security.md, "The code root runs on the nodes"). The example is a template (`config init` copies it), never
read from the working directory: without `--env-file`, `DSPARK_ENV_FILE` or `./.env.dspark`
the settings are the built-in defaults and the environment.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from dspark_launch.errors import ConfigError

ENV_FILENAME = ".env.dspark"
EXAMPLE_FILENAME = ".env.dspark.example"
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)\s*=")


@dataclass(frozen=True)
class EnvFile:
    path: Path | None  # None: no env file (built-in defaults and the environment)
    values: Mapping[str, str]
    lines: Mapping[str, int]  # the line of the assignment that wins
    is_example: bool
    sha256: str = ""  # of the bytes read: a later write checks the file is still what was read (config/env_write.py)

    @staticmethod
    def none() -> "EnvFile":
        return EnvFile(path=None, values={}, lines={}, is_example=False)

    def where(self, name: str) -> str:
        return f"{self.path}:{self.lines.get(name, '?')}"


def packaged_example() -> Path:
    here = Path(__file__).resolve().parent
    checkout = here.parent.parent / EXAMPLE_FILENAME
    return checkout if checkout.is_file() else here / "env.dspark.example"


def choose_env_file(cli_path: str | None, environ: Mapping[str, str], cwd: Path) -> tuple[Path | None, bool]:
    """The file to read and whether it is the example (CLI, DSPARK_ENV_FILE, ./.env.dspark); None: no file."""
    for given, source in ((cli_path, "--env-file"), (environ.get("DSPARK_ENV_FILE"), "DSPARK_ENV_FILE")):
        if given:
            path = Path(given).expanduser()
            _require_regular_file(path, f"{source}={given}")
            return path, path.name == EXAMPLE_FILENAME
    local = cwd / ENV_FILENAME
    if os.path.lexists(local):
        _require_regular_file(local, f"env file {local}")
        return local, False
    return None, False


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _require_regular_file(path: Path, label: str) -> None:
    """A regular file (a link to one is fine), or /dev/null: read as an empty file, i.e. no file."""
    allowed = "allowed: a readable env file, or /dev/null for none"
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        reason = "no such file" if exc.errno == errno.ENOENT else f"cannot read it ({exc.strerror})"
        raise ConfigError(f"{label}: {reason}; {allowed}") from None
    if stat.S_ISREG(mode) or os.path.realpath(path) == os.devnull:
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise ConfigError(f"{label}: {kind}, not a regular file; {allowed}")


def read_env_file(path: Path, is_example: bool) -> EnvFile:
    raw = _read_trusted(path)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"env file {path}: not UTF-8 (byte {exc.start}); allowed: UTF-8 text") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    from dotenv import dotenv_values

    parsed = dotenv_values(stream=io.StringIO(text), interpolate=False)
    values = {name: ("" if value is None else value) for name, value in parsed.items()}
    lines: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        match = _ASSIGNMENT.match(line)
        if match:
            lines[match.group(1)] = number
    return EnvFile(path=path, values=values, lines=lines, is_example=is_example, sha256=hashlib.sha256(raw).hexdigest())


def group_or_world_readable(path: Path) -> bool:
    try:
        return bool(os.stat(path).st_mode & 0o077)
    except OSError:
        return False


_TRUST_RULE = (
    "allowed: an env file and folder owned by you (uid {uid}) or root that group and others "
    "cannot write, under folders only root or you can replace"
)


def _read_trusted(path: Path) -> bytes:
    """The file's bytes, read through one descriptor checked with fstat: refused (ConfigError, one line
    naming it) unless this user or root owns it and its folder and neither is writable by group or
    others (a link: both the link's folder and the target's). /dev/null reads as an empty file."""
    from dspark_launch.node.safe_path import UnsafePath, check_ancestors

    if os.path.realpath(path) == os.devnull:
        return b""
    allowed = _TRUST_RULE.format(uid=os.geteuid())
    try:
        for where in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
            _require_trusted(where.parent, os.stat(where.parent), f"env file {path}: its folder {where.parent}")
            check_ancestors(where.parent)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except UnsafePath as exc:
        raise ConfigError(f"env file {path}: {exc}; {allowed}") from None
    except OSError as exc:
        raise ConfigError(f"env file {path}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(
                f"env file {path}: not a regular file; allowed: a readable env file, or /dev/null for none"
            )
        _require_trusted(path, st, f"env file {path}")
        try:
            return handle.read()
        except OSError as exc:
            raise ConfigError(f"env file {path}: cannot read it ({exc.strerror})") from None


def _require_trusted(path: Path, st: os.stat_result, label: str) -> None:
    allowed = _TRUST_RULE.format(uid=os.geteuid())
    if st.st_uid not in (0, os.geteuid()):
        raise ConfigError(f"{label} is owned by uid {st.st_uid}, not by you or root; {allowed}")
    if st.st_mode & 0o022:
        raise ConfigError(f"{label} has mode {stat.S_IMODE(st.st_mode):04o}: group or others can write it; {allowed}")
