"""SIGTERM unwinds like Ctrl-C, so every rollback runs; both map to their exit codes."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator

import typer

from dspark_launch.errors import EXIT_SIGINT, EXIT_SIGTERM, Terminated


def _raise_terminated(signum, frame):
    raise Terminated()


@contextmanager
def interruptible(on_interrupt) -> Iterator[None]:
    """Run a block; on SIGINT/SIGTERM call `on_interrupt(code)` and exit 130/143."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except KeyboardInterrupt:
        on_interrupt(EXIT_SIGINT)
        raise typer.Exit(EXIT_SIGINT) from None
    except Terminated:
        on_interrupt(EXIT_SIGTERM)
        raise typer.Exit(EXIT_SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
