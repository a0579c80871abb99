"""What the engine log says was in force: the patched scheduler's start line, its `(live)` lines after each
control file, and (with DSPARK_ISSUE43_SCHED_DIAG=1) a line per step with the cap and gate mode it used."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dspark_launch.hotfix import contract
from dspark_launch.node.engine_log import engine_lines
from dspark_launch.tune.points import Point

STEP_RE = re.compile(r"dspark-issue27 step=\d+ cap=(\d+) .*? mode=(\d+) ")


@dataclass(frozen=True)
class Evidence:
    """A round's check: the values in force when it began, and what the log said while it ran."""

    at_start: Point | None  # None: the log never said (no hotfix line read)
    changed_during: tuple[str, ...]  # `(live)` or start lines logged during the round
    steps: int  # diagnostic step lines during the round
    steps_other: int  # of those, steps with another cap or gate mode

    def holds(self, point: Point) -> bool:
        return self.at_start == point and not self.changed_during and self.steps_other == 0

    def line(self, point: Point) -> str:
        if self.holds(point):
            steps = (
                f"; {self.steps} scheduler steps logged with cap={point.cap}, mode {point.gate_mode}"
                if self.steps
                else ""
            )
            return f"in force ({point.name}) from the engine log{steps}"
        if self.at_start != point:
            return f"NOT in force: the engine log showed {self.at_start.name if self.at_start else 'nothing'}"
        if self.changed_during:
            return f"NOT in force throughout: the log changed during the round ({self.changed_during[0]})"
        return f"NOT in force throughout: {self.steps_other} of {self.steps} steps logged another cap or mode"

    def to_data(self, point: Point) -> dict:
        return {
            "in_force": self.holds(point),
            "at_start": self.at_start.key if self.at_start else None,
            "changed_during": list(self.changed_during),
            "steps": self.steps,
            "steps_other": self.steps_other,
        }


class EngineLog:
    """The server log read from the head as it grows; `in_force` is the last state the scheduler logged."""

    def __init__(self, reader, start_aging: float):
        self.reader = reader  # serve.logfollow.LogReader on the server log
        self.start_aging = start_aging  # the start line names no aging: the value the server started with
        self.in_force: Point | None = None
        self._partial = ""  # a read may end inside a line: kept for the next one
        self._advance(self._new_lines())

    def _new_lines(self) -> list[str]:
        """The messages the EngineCores' schedulers logged since the last call (by vLLM's prefix at the start of
        a line, node/engine_log.py): a client's prompt or request id holding a `(live)` line is not one."""
        text = self._partial + self.reader.new_text()
        whole, _, self._partial = text.rpartition("\n")
        return [said.message for said in engine_lines(whole, "scheduler.py")] if whole else []

    def _advance(self, lines: list[str]) -> list[str]:
        """Follow `lines` in order; returns the lines that set values."""
        said = []
        for line in lines:
            live = contract.parse_live_lines(line)
            if live:
                self.in_force = Point(int(live[0].cap), int(live[0].gate_mode), float(live[0].aging))
                said.append(line[line.find("dspark-issue27") :][:160])
                continue
            active = contract.parse_active_lines(line)
            if active:
                self.in_force = Point(active[0].cap, active[0].gate_mode, self.start_aging)
                said.append(line[line.find("dspark-issue27") :][:160])
        return said

    def mark(self) -> Point | None:
        """At a round's start: read up to now; what is in force."""
        self._advance(self._new_lines())
        return self.in_force

    def evidence(self, at_start: Point | None, point: Point) -> Evidence:
        """At a round's end: what was logged since `mark`."""
        lines = self._new_lines()
        changed = tuple(self._advance(lines))
        steps = [(int(c), int(m)) for line in lines for c, m in STEP_RE.findall(line)]
        other = sum(1 for cap, mode in steps if (cap, mode) != (point.cap, point.gate_mode))
        return Evidence(at_start, changed, len(steps), other)
