"""How a layer tells the operator what it is doing: the `Reporter` every layer is handed (the CLI's
`cli/reporter.py` prints it; `SilentReporter` says nothing), and the helpers around it.

Beside `errors.py` at the bottom of the layer table: imports nothing of dspark_launch."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    def phase(self, message: str) -> None: ...

    def waiting(self, message: str, elapsed: float, timeout: float) -> None: ...

    def measured(self, message: str, done: float, total: float, unit: str) -> None:
        """A long phase with a measure: `unit` "bytes" (a copy: bytes and ETA shown) or a count ("shards")."""

    def warn(self, message: str) -> None: ...


def report_measured(
    reporter: Reporter, message: str, done: float, total: float, unit: str, elapsed: float = 0.0, timeout: float = 0.0
) -> None:
    """`reporter.measured`, or its `waiting` (with `done/total` in the message) for a reporter without it."""
    measured = getattr(reporter, "measured", None)
    if measured is not None:
        measured(message, done, total, unit)
    else:
        reporter.waiting(f"{message} ({done:g}/{total:g} {unit})", elapsed, timeout)


class PhaseLines:
    """A `progress` callable for the layers that report lines (the model's copy): each line a phase of
    `reporter`; `measured` too, for a copy's bytes."""

    def __init__(self, reporter: Reporter):
        self.reporter = reporter

    def __call__(self, line: str) -> None:
        self.reporter.phase(line)

    def measured(self, message: str, done: float, total: float, unit: str) -> None:
        report_measured(self.reporter, message, done, total, unit)


class SilentReporter:
    def phase(self, message: str) -> None:
        pass

    def waiting(self, message: str, elapsed: float, timeout: float) -> None:
        pass

    def measured(self, message: str, done: float, total: float, unit: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass
