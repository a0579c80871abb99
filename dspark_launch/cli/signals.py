"""SIGTERM unwinds like Ctrl-C, so every rollback runs; both map to their exit codes.

Only the first signal interrupts: a second Ctrl-C (or a supervisor's repeated
SIGTERM) while the rollback stops what this run started is noted and ignored, so
the rollback itself is never cut short and nothing is left running.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from typing import Iterator

import typer

from dspark_launch.cli.output import say
from dspark_launch.errors import EXIT_SIGINT, EXIT_SIGTERM, Terminated


@contextmanager
def interruptible(on_interrupt) -> Iterator[None]:
    """Run a block; on SIGINT/SIGTERM call `on_interrupt(code)` and exit 130/143."""
    interrupted: list[int] = []

    def handler(signum, frame):
        if interrupted:
            say("dspark: still stopping what this run started; please wait", file=sys.stderr, flush=True)
            return
        interrupted.append(signum)
        raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except KeyboardInterrupt:
        on_interrupt(EXIT_SIGINT)
        raise typer.Exit(EXIT_SIGINT) from None
    except Terminated:
        on_interrupt(EXIT_SIGTERM)
        raise typer.Exit(EXIT_SIGTERM) from None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stop_interrupted(code: int) -> None:
    """What a stopping command (`stop`, `cluster down`, a restart's stop) says when a signal ends it: its agents
    were ended with it, so nothing it asked for goes on behind the freed lock."""
    say(
        f"dspark: interrupted while stopping; what was not stopped yet still runs: `dspark stop` stops it (exit {code})",
        file=sys.stderr,
    )
