"""The only place that prints: one-line errors and warnings, tables, JSON."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

import typer

from dspark_launch.errors import DsparkError


def warn(message: str) -> None:
    print(f"dspark: warning: {message}", file=sys.stderr)


def warn_all(messages: Iterable[str]) -> None:
    for message in messages:
        warn(message)


def fail(error: DsparkError) -> typer.Exit:
    print(f"dspark: error: {error}", file=sys.stderr)
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
