"""The only place that prints: one-line errors and warnings, tables, JSON."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

import typer

from dspark_launch.errors import DsparkError


def printable(text: str, keep: str = "\n\t") -> str:
    """`text` safe to show on a terminal: every character that is not printable (an escape sequence from
    a worker's reply or a log, a carriage return, a bidi override), except those in `keep`, written as
    its Python escape (`\\x1b`), so nothing a node sends can move the cursor, retitle or rewrite the screen."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else ascii(c)[1:-1] for c in text)


def say(*values: Any, sep: str = " ", end: str = "\n", file=None, flush: bool = False) -> None:
    """`print` for everything the CLI shows: through `printable`."""
    print(printable(sep.join(str(v) for v in values)), end=end, file=file or sys.stdout, flush=flush)


def warn(message: str) -> None:
    say(f"dspark: warning: {message}", file=sys.stderr)


def warn_all(messages: Iterable[str]) -> None:
    for message in messages:
        warn(message)


def fail(error: DsparkError) -> typer.Exit:
    say(f"dspark: error: {error}", file=sys.stderr)
    return typer.Exit(error.exit_code)


def emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = []
    for row in (headers, *rows):
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)
