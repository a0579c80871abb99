"""Candidates of the live settings `dspark tune` measures: in-flight cap x gate mode x aging x target step time."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dspark_launch.errors import ConfigError
from dspark_launch.hotfix import contract

#: Six points: the cap over its range at the default gate (mode 3, aging 2), mode 3 with a patient aging at
#: cap 2, and mode 2 (no aging) at caps 1 and 2.
DEFAULT_SPACE = "1:3:2 2:3:2 3:3:2 2:3:8 1:2 2:2"
_TARGET = contract.LIVE[contract.ENV_TARGET_STEP_MS]
#: Gate mode 4 over its target step time (ms), at cap 2 and the default aging: `--space TARGET_SWEEP`.
TARGET_SWEEP = "2:4:2:50 2:4:2:100 2:4:2:200"
SPACE_HELP = (
    f"Points CAP:MODE[:AGING[:TARGET_MS]] separated by spaces or commas (cap {contract.CAP_MIN}-{contract.CAP_MAX}, "
    f"gate mode {min(contract.GATE_MODES)}-{max(contract.GATE_MODES)}, aging {contract.AGING_MIN:g}-"
    f"{contract.AGING_MAX:g} (modes 3 and 4), target step time {_TARGET.minimum:g}-{_TARGET.maximum:g} ms (mode 4)). "
    f'Default: "{DEFAULT_SPACE}"; the target swept: "{TARGET_SWEEP}".'
)


@dataclass(frozen=True, order=True)
class Point:
    cap: int
    gate_mode: int
    aging: float = contract.DEFAULT_AGING
    target_ms: float = contract.DEFAULT_TARGET_STEP_MS

    def __post_init__(self):
        # compared as the scheduler logs them (%g, 6 significant digits)
        object.__setattr__(self, "aging", float(f"{float(self.aging):g}"))
        object.__setattr__(self, "target_ms", float(f"{float(self.target_ms):g}"))

    @property
    def name(self) -> str:
        aging = f" aging {self.aging:g}" if self.gate_mode >= 3 else ""
        target = f" target {self.target_ms:g} ms" if self.gate_mode == 4 else ""
        return f"cap {self.cap} mode {self.gate_mode}{aging}{target}"

    @property
    def key(self) -> str:
        """For JSON and file names: 2:3:2, or 2:4:2:100 for mode 4."""
        target = f":{self.target_ms:g}" if self.gate_mode == 4 else ""
        return f"{self.cap}:{self.gate_mode}:{self.aging:g}{target}"

    def values(self) -> dict[str, str]:
        """The live settings, by name, as an env file or the control file writes them."""
        return {
            contract.ENV_CAP: str(self.cap),
            contract.ENV_GATE_MODE: str(self.gate_mode),
            contract.ENV_AGING: f"{self.aging:g}",
            contract.ENV_TARGET_STEP_MS: f"{self.target_ms:g}",
        }

    @classmethod
    def of(cls, values: dict[str, str]) -> "Point":
        """The point a set of public values describes (the server's running settings)."""
        from dspark_launch.serve.reload import InForce

        force = InForce.of(values)
        return cls(int(force.cap), int(force.gate_mode), float(force.aging), float(force.target_ms))


_NUMBER = r"([0-9]*\.?[0-9]+)"
_POINT = re.compile(rf"^(\d+):(\d+)(?::{_NUMBER}(?::{_NUMBER})?)?$")


def parse_space(
    text: str, default_aging: float = contract.DEFAULT_AGING, default_target_ms: float = contract.DEFAULT_TARGET_STEP_MS
) -> list[Point]:
    """`--space`: one error line naming the bad point and what is allowed (exit 2). A field a point leaves out, or
    one its mode does not read (aging below mode 3, the target below mode 4), takes the running server's value."""
    allowed = (
        f"allowed: CAP:MODE[:AGING[:TARGET_MS]] points, cap {contract.CAP_MIN}-{contract.CAP_MAX}, gate mode "
        f"{min(contract.GATE_MODES)}-{max(contract.GATE_MODES)}, aging {contract.AGING_MIN:g}-"
        f"{contract.AGING_MAX:g}, target {_TARGET.minimum:g}-{_TARGET.maximum:g} ms, "
        f'e.g. "{DEFAULT_SPACE}" or "{TARGET_SWEEP}"'
    )
    points: list[Point] = []
    for item in (part for part in re.split(r"[\s,]+", text.strip()) if part):
        match = _POINT.match(item)
        if not match:
            raise ConfigError(f"--space={text!r}: {item!r} is not a point; {allowed}")
        cap, mode = int(match.group(1)), int(match.group(2))
        aging = float(match.group(3)) if match.group(3) else default_aging
        target = float(match.group(4)) if match.group(4) else default_target_ms
        if not (
            contract.CAP_MIN <= cap <= contract.CAP_MAX
            and mode in contract.GATE_MODES
            and contract.AGING_MIN <= aging <= contract.AGING_MAX
            and float(_TARGET.minimum) <= target <= float(_TARGET.maximum)
        ):
            raise ConfigError(f"--space={text!r}: {item!r} is out of range; {allowed}")
        if match.group(4) and mode != 4:
            raise ConfigError(f"--space={text!r}: {item!r} sets a target, which only gate mode 4 reads; {allowed}")
        point = Point(cap, mode, aging if mode >= 3 else default_aging, target if mode == 4 else default_target_ms)
        if point not in points:
            points.append(point)
    if len(points) < 2:
        raise ConfigError(f"--space={text!r}: {len(points)} point(s); allowed: at least 2 distinct points; {allowed}")
    return points
