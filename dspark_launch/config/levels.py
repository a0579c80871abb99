"""What a setting's change needs and which `vllm serve` flag it sets, as its declaration says.

Each field of `NumericKnobs` (config/knobs.py) and `TextSettings` (config/text_settings.py) carries a `Nature`:
its level and, where it maps to one, its `vllm serve` flag. Every table that depends on them is derived here,
as a function of the declared fields, so that nothing else names a setting again:
- the serve-level and live names (`serve/restart_kind.py`: `dspark restart`, `dspark reload`);
- the flags the serve spec passes as `FLAG VALUE` (`config/profile_resolve.py`);
- the flags refused in `VLLM_EXTRA_ARGS` with the setting to use instead (`config/serve_flags.py`);
- the level and flag columns of the settings reference (tools/settings_docs.py).

Levels, the cheapest restart that applies a change:
- `cluster` (the default: a setting nobody classed costs a full restart, never a stale Ray): Ray goes down on
  every node too;
- `serve`: only `vllm serve` reads it (its flags, its environment, the launcher's own waits); Ray and the node
  containers stay up;
- `live`: the patched scheduler reads it again from its control file while it runs (`dspark reload`, no
  restart); a restart applies it too, so a live setting is serve-level as well.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Literal, Sequence

Level = Literal["cluster", "serve", "live"]
LEVELS: tuple[Level, ...] = ("cluster", "serve", "live")


@dataclass(frozen=True)
class ServeFlag:
    """A `vllm serve` flag a setting sets: the launcher owns it, so `VLLM_EXTRA_ARGS` may not give it."""

    spellings: tuple[str, ...]
    """As `vllm serve --help` lists them: the long flag first, then its other spellings and short aliases."""
    verbatim: bool = True
    """True: the serve spec passes `FLAG VALUE`, the setting's value as resolved (the profile's when the operator gave
    none), in declaration order after the model's own flags; False: the launcher writes this flag its own way."""
    why: str = ""
    """Shown beside the setting in the refusal table, where the value passed is not the setting's as written."""

    @property
    def flag(self) -> str:
        return self.spellings[0]


def owned(*spellings: str, why: str = "") -> ServeFlag:
    """A flag the launcher writes itself from the setting (not as `FLAG VALUE` in the serve spec's settings run)."""
    return ServeFlag(spellings, verbatim=False, why=why)


@dataclass(frozen=True)
class Nature:
    """A declaration's level and flag (field metadata `nature`)."""

    level: Level = "cluster"
    flag: ServeFlag | None = None


NATURE = "nature"  # the metadata key of a declared field


def nature_metadata(level: Level, flag: str | ServeFlag | None) -> dict[str, Nature]:
    """The `nature` metadata of a declared field; `flag` as a string: one spelling, passed verbatim."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r}: allowed {', '.join(LEVELS)}")
    return {NATURE: Nature(level, ServeFlag((flag,)) if isinstance(flag, str) else flag)}


@dataclass(frozen=True)
class DeclaredSetting:
    """One declared setting: its environment name, level and flag."""

    name: str
    level: Level
    flag: ServeFlag | None


def declared_settings(*classes: type) -> tuple[DeclaredSetting, ...]:
    """Every field of these declaration classes (inherited ones included), in declaration order; a field
    without a nature is cluster-level with no flag (fail closed)."""
    found: list[DeclaredSetting] = []
    for cls in classes:
        for field in dataclasses.fields(cls):
            nature: Nature = field.metadata.get(NATURE, Nature())
            found.append(DeclaredSetting(field.name.upper(), nature.level, nature.flag))
    names = [s.name for s in found]
    if len(set(names)) != len(names):
        raise ValueError(f"declared twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    return tuple(found)


@dataclass(frozen=True)
class OwnedFlag:
    """A `vllm serve` flag the settings own: refused in `VLLM_EXTRA_ARGS`, naming the setting(s)."""

    spellings: tuple[str, ...]
    settings: tuple[str, ...]  # several when any of them sets it (VLLM_API_KEY or DSPARK_API_KEYS)
    why: str


@dataclass(frozen=True)
class Levels:
    """The tables derived from a list of declared settings."""

    settings: tuple[DeclaredSetting, ...]

    @classmethod
    def of(cls, settings: Sequence[DeclaredSetting]) -> Levels:
        return cls(tuple(settings))

    @functools.cached_property
    def names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.settings)

    def level(self, name: str) -> Level:
        """A name nobody declared is cluster-level."""
        return next((s.level for s in self.settings if s.name == name), "cluster")

    @functools.cached_property
    def serve(self) -> frozenset[str]:
        """Serve-level or live: a restart of `vllm serve` alone applies them."""
        return frozenset(s.name for s in self.settings if s.level != "cluster")

    @functools.cached_property
    def live(self) -> tuple[str, ...]:
        """Live (`dspark reload`), in declaration order."""
        return tuple(s.name for s in self.settings if s.level == "live")

    @functools.cached_property
    def setting_flags(self) -> tuple[tuple[str, str], ...]:
        """(setting, flag) the serve spec passes as `FLAG VALUE`, in declaration order."""
        return tuple((s.name, s.flag.flag) for s in self.settings if s.flag is not None and s.flag.verbatim)

    @functools.cached_property
    def owned_flags(self) -> tuple[OwnedFlag, ...]:
        """Each flag a setting sets, once, in the order its first setting is declared."""
        by_flag: dict[str, OwnedFlag] = {}
        for s in self.settings:
            if s.flag is None:
                continue
            seen = by_flag.get(s.flag.flag)
            if seen is None:
                by_flag[s.flag.flag] = OwnedFlag(s.flag.spellings, (s.name,), s.flag.why)
            elif seen.spellings != s.flag.spellings or (seen.why and s.flag.why and seen.why != s.flag.why):
                raise ValueError(f"{s.name} and {', '.join(seen.settings)} declare {s.flag.flag} differently")
            else:
                by_flag[s.flag.flag] = OwnedFlag(seen.spellings, (*seen.settings, s.name), seen.why or s.flag.why)
        return tuple(by_flag.values())

    def flag_of(self, name: str) -> str:
        """The `vllm serve` flag a setting sets; "" when none."""
        return next((s.flag.flag for s in self.settings if s.name == name and s.flag is not None), "")
