"""Progress on stderr: a line per phase; the long waits live on a terminal, rate-limited in a journal.

On a terminal (Rich): each wait is a progress bar sized to the terminal: bytes, rate and ETA for a copy,
vLLM's own shard count while the weights load, elapsed against the timeout otherwise. Without one (systemd's
journal, a pipe): a line when a wait begins or its phase changes, then at most one a minute while it lasts.
"""

from __future__ import annotations

import sys
import threading
import time

from dspark_launch.cli.output import printable

GIB = 1 << 30
QUIET_LINE_EVERY_S = 60.0  # without a terminal: one waiting line a minute at most, per wait


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def measure_text(
    unit: str, done: float, total: float, speed: float | None = None, remaining: float | None = None
) -> str:
    """`12.30/80.00 GiB, 950 MB/s, ETA 1:12`, `19/41 shards`, `312/1800 s`."""
    if unit == "bytes":
        rate = f", {speed / 1e6:.0f} MB/s" if speed else ""
        return f"{done / GIB:.2f}/{total / GIB:.2f} GiB{rate}, ETA {_clock(remaining)}"
    if unit == "s":
        return f"{done:.0f}/{total:.0f} s"
    return f"{done:g}/{total:g} {unit}".rstrip()


def _progress(console):
    """A Rich progress display sized to the terminal (imported here: `dspark config ...` never loads it)."""
    from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn
    from rich.table import Column
    from rich.text import Text

    class Measure(ProgressColumn):
        def render(self, task):
            unit = task.fields.get("unit", "s")
            return Text(
                measure_text(unit, task.completed, task.total or 0, task.speed, task.time_remaining),
                style="progress.download",
            )

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False, table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
        BarColumn(bar_width=24),
        Measure(),
        console=console,
        transient=True,
        expand=True,
    )


def _family(message: str) -> str:
    """Waits of one family follow each other (`vllm serve: loading weights` replaces `vllm serve: starting`);
    others run beside them (`worker1: copying` and `worker2: copying`)."""
    return message.split(":", 1)[0]


class ConsoleReporter:
    def __init__(self, quiet: bool = False, console=None):
        from rich.console import Console

        self.quiet = quiet
        self.console = console or Console(stderr=True, highlight=False)
        self.tty = self.console.is_terminal
        self._start = time.monotonic()
        self._lock = threading.RLock()
        self._progress = None  # a rich.progress.Progress while a wait is shown on a terminal
        self._tasks: dict[str, tuple[tuple[str, str], int]] = {}  # family -> ((message, unit), task id)
        self._said: dict[str, tuple[str, float]] = {}  # family -> (message, when its last line was printed)

    def _elapsed(self) -> str:
        return f"[{time.monotonic() - self._start:6.1f}s]"

    def _line(self, text: str) -> None:
        if self.tty:
            from rich.text import Text

            (self._progress.console if self._progress else self.console).print(Text(text), highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def phase(self, message: str) -> None:
        if self.quiet:
            return
        with self._lock:
            self._end_wait()
            self._line(f"{self._elapsed()} {printable(message)}")

    def waiting(self, message: str, elapsed: float, timeout: float) -> None:
        self._wait(printable(message), elapsed, timeout, "s")

    def measured(self, message: str, done: float, total: float, unit: str) -> None:
        self._wait(printable(message), done, total, unit)

    def _wait(self, message: str, done: float, total: float, unit: str) -> None:
        if self.quiet:
            return
        with self._lock:
            family, now = _family(message), time.monotonic()
            said, when = self._said.get(family, ("", 0.0))
            if said != message or (not self.tty and now - when >= QUIET_LINE_EVERY_S):
                if said != message or not self.tty:
                    self._line(f"{self._elapsed()} {message} ({measure_text(unit, done, total)})")
                self._said[family] = (message, now)
            if self.tty:
                self._show(family, message, done, total, unit)

    def _show(self, family: str, message: str, done: float, total: float, unit: str) -> None:
        if self._progress is None:
            self._progress = _progress(self.console)
            self._progress.start()
        shown, task = self._tasks.get(family, (("", ""), None))
        if task is not None and shown != (message, unit):
            self._progress.remove_task(task)
            task = None
        if task is None:
            task = self._progress.add_task(message, total=total or None, unit=unit)
            self._tasks[family] = ((message, unit), task)
        self._progress.update(task, completed=done, total=total or None)

    def _end_wait(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._tasks.clear()
        self._said.clear()

    def close(self) -> None:
        with self._lock:
            self._end_wait()

    def warn(self, message: str) -> None:
        with self._lock:
            self._end_wait()
            self._line(f"dspark: warning: {printable(message)}")
