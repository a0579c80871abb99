"""Reads `dspark-numeric-knobs.sh`, the single table of numeric knobs.

The file is parsed, never executed: each `dspark_knob` line becomes a `Knob`,
each `dspark_knob_alias` line an alias, and the `# Group` comment above a run of
knobs names their group.
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass
from pathlib import Path

from dspark_launch.config import numbers

REGISTRY_FILENAME = "dspark-numeric-knobs.sh"


@dataclass(frozen=True, kw_only=True)
class Knob:
    name: str
    type: str  # "int" or "float"
    default: str
    minimum: str
    maximum: str
    range_policy: str  # "hard": out of range is an error; "soft": warn and fall back
    description: str
    group: str
    line: int


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
def load_registry(path: Path | None = None) -> Registry:
    path = path or registry_path()
    knobs: list[Knob] = []
    aliases: dict[str, str] = {}
    group = "general"
    in_table = False
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if line.startswith("_dspark_registry()"):
            in_table = True
            continue
        if not in_table:
            continue
        if line == "}":
            break
        if line.startswith("#"):
            group = line.lstrip("#").strip().lower() or group
            continue
        words = shlex.split(line)
        if not words:
            continue
        if words[0] == "dspark_knob" and len(words) == 8:
            knobs.append(_make_knob(words[1:], group, path, number))
        elif words[0] == "dspark_knob_alias" and len(words) == 3:
            aliases[words[1]] = words[2]
        else:
            raise ValueError(f"{path}:{number}: not a registry line: {line!r}")
    known = {knob.name for knob in knobs}
    for alias, target in aliases.items():
        if target not in known:
            raise ValueError(f"{path}: alias {alias} names unknown knob {target}")
    return Registry(path=path, knobs=tuple(knobs), aliases=aliases)


def _make_knob(fields: list[str], group: str, path: Path, line: int) -> Knob:
    name, type_, default, minimum, maximum, policy, description = fields
    where = f"{path}:{line}"
    if type_ not in ("int", "float") or policy not in ("hard", "soft"):
        raise ValueError(f"{where}: bad type or range policy for {name}")
    canonical = [numbers.canonical(type_, text) for text in (default, minimum, maximum)]
    if None in canonical or canonical != [default, minimum, maximum]:
        raise ValueError(f"{where}: {name}: default/min/max must be written in canonical form")
    if numbers.compare(minimum, "0") < 0:
        raise ValueError(f"{where}: {name}: minimum must not be negative")
    if not numbers.compare(minimum, default) <= 0 <= numbers.compare(maximum, default):
        raise ValueError(f"{where}: {name}: default outside min..max")
    return Knob(
        name=name,
        type=type_,
        default=default,
        minimum=minimum,
        maximum=maximum,
        range_policy=policy,
        description=description,
        group=group,
        line=line,
    )
