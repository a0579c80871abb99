"""Candidates of the live settings `dspark tune` measures: in-flight cap x gate mode x aging."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dspark_launch.errors import ConfigError
from dspark_launch.hotfix import contract

#: Six points: the cap over its range at the default gate (mode 3, aging 2), mode 3 with a patient aging at
#: cap 2, and mode 2 (no aging) at caps 1 and 2.
DEFAULT_SPACE = "1:3:2 2:3:2 3:3:2 2:3:8 1:2 2:2"
SPACE_HELP = (
    "Points CAP:MODE[:AGING] separated by spaces or commas (cap 1-3, gate mode 0-3, aging 0-64; "
    f'aging only matters in mode 3). Default: "{DEFAULT_SPACE}".'
)


@dataclass(frozen=True, order=True)
class Point:
    cap: int
    gate_mode: int
    aging: float = contract.DEFAULT_AGING

    def __post_init__(self):
        # compared as the scheduler logs it (%g, 6 significant digits)
        object.__setattr__(self, "aging", float(f"{float(self.aging):g}"))

    @property
    def name(self) -> str:
        aging = f" aging {self.aging:g}" if self.gate_mode == 3 else ""
        return f"cap {self.cap} mode {self.gate_mode}{aging}"

    @property
    def key(self) -> str:
        """For JSON and file names: 2:3:2."""
        return f"{self.cap}:{self.gate_mode}:{self.aging:g}"

    def values(self) -> dict[str, str]:
        """The live settings, by name, as an env file or the control file writes them."""
        return {
            contract.ENV_CAP: str(self.cap),
            contract.ENV_GATE_MODE: str(self.gate_mode),
            contract.ENV_AGING: f"{self.aging:g}",
        }

    @classmethod
    def of(cls, values: dict[str, str]) -> "Point":
        """The point a set of public values describes (the server's running settings)."""
        from dspark_launch.serve.reload import InForce

        force = InForce.of(values)
        return cls(int(force.cap), int(force.gate_mode), float(force.aging))


_POINT = re.compile(r"^(\d+):(\d+)(?::([0-9]*\.?[0-9]+))?$")


def parse_space(text: str, default_aging: float = contract.DEFAULT_AGING) -> list[Point]:
    """`--space`: one error line naming the bad point and what is allowed (exit 2)."""
    allowed = (
        f"allowed: CAP:MODE[:AGING] points, cap {contract.CAP_MIN}-{contract.CAP_MAX}, gate mode "
        f"{min(contract.GATE_MODES)}-{max(contract.GATE_MODES)}, aging {contract.AGING_MIN:g}-"
        f'{contract.AGING_MAX:g}, e.g. "{DEFAULT_SPACE}"'
    )
    points: list[Point] = []
    for item in (part for part in re.split(r"[\s,]+", text.strip()) if part):
        match = _POINT.match(item)
        if not match:
            raise ConfigError(f"--space={text!r}: {item!r} is not a point; {allowed}")
        cap, mode = int(match.group(1)), int(match.group(2))
        aging = float(match.group(3)) if match.group(3) else default_aging
        if not (
            contract.CAP_MIN <= cap <= contract.CAP_MAX
            and mode in contract.GATE_MODES
            and contract.AGING_MIN <= aging <= contract.AGING_MAX
        ):
            raise ConfigError(f"--space={text!r}: {item!r} is out of range; {allowed}")
        point = Point(cap, mode, aging if mode == 3 else default_aging)
        if point not in points:
            points.append(point)
    if len(points) < 2:
        raise ConfigError(f"--space={text!r}: {len(points)} point(s); allowed: at least 2 distinct points; {allowed}")
    return points
