"""Finding and reading the env file: python-dotenv parses it, nothing executes it."""

from __future__ import annotations

import errno
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
    path: Path | None
    values: Mapping[str, str]
    lines: Mapping[str, int]  # the line of the assignment that wins
    is_example: bool

    def where(self, name: str) -> str:
        return f"{self.path}:{self.lines.get(name, '?')}"


def packaged_example() -> Path:
    here = Path(__file__).resolve().parent
    checkout = here.parent.parent / EXAMPLE_FILENAME
    return checkout if checkout.is_file() else here / "env.dspark.example"


def choose_env_file(cli_path: str | None, environ: Mapping[str, str], cwd: Path) -> tuple[Path, bool]:
    """The file to read and whether it is the example (CLI, DSPARK_ENV_FILE, ./.env.dspark, example)."""
    for given, source in ((cli_path, "--env-file"), (environ.get("DSPARK_ENV_FILE"), "DSPARK_ENV_FILE")):
        if given:
            path = Path(given).expanduser()
            _require_regular_file(path, f"{source}={given}")
            return path, path.name == EXAMPLE_FILENAME
    local = cwd / ENV_FILENAME
    if local.is_file():
        return local, False
    local_example = cwd / EXAMPLE_FILENAME
    return (local_example if local_example.is_file() else packaged_example()), True


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


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
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"env file {path}: cannot read it ({exc.strerror})") from None
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
    return EnvFile(path=path, values=values, lines=lines, is_example=is_example)


def group_or_world_readable(path: Path) -> bool:
    try:
        return bool(os.stat(path).st_mode & 0o077)
    except OSError:
        return False
