"""Progress on stderr: a phase per line, and a live elapsed/timeout line for waits."""

from __future__ import annotations

import sys
import time

from dspark_launch.cli.output import printable


class ConsoleReporter:
    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._last_wait = 0.0
        self._start = time.monotonic()

    def _elapsed(self) -> str:
        return f"[{time.monotonic() - self._start:6.1f}s]"

    def phase(self, message: str) -> None:
        if not self.quiet:
            self._end_wait()
            print(f"{self._elapsed()} {printable(message)}", file=sys.stderr, flush=True)

    def waiting(self, message: str, elapsed: float, timeout: float) -> None:
        if self.quiet:
            return
        line = f"{self._elapsed()} {printable(message)} ({elapsed:.0f}/{timeout:.0f} s)"
        if self.tty:
            print("\r" + line.ljust(100), end="", file=sys.stderr, flush=True)
            self._last_wait = 1.0
        elif time.monotonic() - self._last_wait >= 5:
            print(line, file=sys.stderr, flush=True)
            self._last_wait = time.monotonic()

    def _end_wait(self) -> None:
        if self.tty and self._last_wait:
            print(file=sys.stderr)
            self._last_wait = 0.0

    def warn(self, message: str) -> None:
        self._end_wait()
        print(f"dspark: warning: {printable(message)}", file=sys.stderr, flush=True)
