"""The numeric knobs' table (`Registry` of `Knob` records, config/knobs.py).

Declared once in config/knobs.py; `dspark-numeric-knobs.sh` is generated from the
same declarations for the start script's shell-side check and never read back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from dspark_launch.config import numbers
from dspark_launch.config.knobs import Knob, declared_aliases, declared_knobs

REGISTRY_FILENAME = "dspark-numeric-knobs.sh"


@dataclass(frozen=True)
class Registry:
    path: Path
    knobs: tuple[Knob, ...]
    aliases: dict[str, str]  # alias -> canonical name

    def by_name(self) -> dict[str, Knob]:
        return {knob.name: knob for knob in self.knobs}


def registry_path() -> Path:
    """The registry file: the checkout's copy, or the one packaged beside this module."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent.parent / REGISTRY_FILENAME, here / REGISTRY_FILENAME):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{REGISTRY_FILENAME} not found beside {here}")


@functools.lru_cache(maxsize=None)
def load_registry() -> Registry:
    """The knob table as Python uses it: straight from the declarations (config/knobs.py). The bash file is
    generated from the same declarations for bash alone; Python never parses it back (tools.generate writes it,
    tests/test_settings_declared.py compares bash's own view of it with the declarations)."""
    knobs = declared_knobs()
    for knob in knobs:
        _check_rule(knob)
    aliases = declared_aliases()
    return Registry(path=registry_path(), knobs=knobs, aliases=aliases)


def _check_rule(knob: Knob) -> None:
    """A declaration bash's number rules can hold: canonical, non-negative, the default within its bounds."""
    if knob.type not in ("int", "float") or knob.range_policy not in ("hard", "soft"):
        raise ValueError(f"{knob.name}: bad type or range policy")
    values = (knob.default, knob.minimum, knob.maximum)
    if [numbers.canonical(knob.type, text) for text in values] != list(values):
        raise ValueError(f"{knob.name}: default/min/max must be written in canonical form")
    if numbers.compare(knob.minimum, "0") < 0:
        raise ValueError(f"{knob.name}: minimum must not be negative")
    if not numbers.compare(knob.minimum, knob.default) <= 0 <= numbers.compare(knob.maximum, knob.default):
        raise ValueError(f"{knob.name}: default outside min..max")
