"""A Reporter stand-in that keeps the phase and warning lines a launcher step reports, in order."""

from __future__ import annotations


class Recorder:
    def __init__(self) -> None:
        self.phases: list[str] = []

    def phase(self, message: str) -> None:
        self.phases.append(message)

    def waiting(self, message: str, elapsed: float, timeout: float) -> None:
        pass

    def warn(self, message: str) -> None:
        self.phases.append(message)
