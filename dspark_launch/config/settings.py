"""Resolving every setting once: precedence, aliases, validation, clamping, provenance.

Precedence, highest first: CLI option, process environment, env file, default.
The result is a frozen `Settings`; nothing downstream re-parses a value.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import ipaddress
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

from dspark_launch.config import numbers
from dspark_launch.config.checks import Refused, hidden_character, looks_secret, shell_words
from dspark_launch.config.envfile import EnvFile, choose_env_file, group_or_world_readable, read_env_file
from dspark_launch.config.knobs import Knob, NumericKnobs
from dspark_launch.config.registry import Registry, load_registry
from dspark_launch.config.serve_flags import check_extra_args
from dspark_launch.config.text_settings import META_NAMES, TEXT_SETTINGS, TextSetting, TextSettings
from dspark_launch.errors import ConfigError

REDACTED = "<redacted>"
NO_ENV_FILE = (
    "no env file (no --env-file, DSPARK_ENV_FILE or ./.env.dspark): using the built-in defaults "
    "and the environment; run `dspark config init` to make .env.dspark"
)


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    source: str  # "default", "environment", "CLI --port", or "path:line"
    group: str
    description: str
    secret: bool = False
    notes: tuple[str, ...] = ()

    @property
    def shown(self) -> str:
        if self.secret:
            return "set" if self.value else "unset"
        return self.value


@dataclass(frozen=True, kw_only=True)
class Settings(NumericKnobs, TextSettings):
    """Every setting resolved once, as typed attributes (`settings.health_timeout_s: int`); the fields and their
    meaning are declared in `NumericKnobs` (config/knobs.py) and `TextSettings` (config/text_settings.py).
    `entries` keeps each setting's canonical text and where it came from, by environment name: what
    `config show` prints and error lines cite."""

    entries: Mapping[str, Setting]
    env_file: Path | None
    from_example: bool
    warnings: tuple[str, ...] = ()
    env_file_sha256: str = ""  # the env file's bytes as read (config/env_write.py refuses a file changed since)

    @property
    def env_file_shown(self) -> str:
        return str(self.env_file) if self.env_file else "none (built-in defaults and the environment)"

    def entry(self, field: str) -> Setting:
        """The canonical text and origin of the setting held in attribute `field` (`settings.entry("vllm_port")`);
        ValueError for a name that is no setting attribute (an environment name among them)."""
        return self.entries[env_name(field)]

    def source_of(self, field: str) -> str:
        """Where the setting held in attribute `field` came from: "default", "environment", "CLI --port" or
        "path:line"."""
        return self.entry(field).source

    def named(self, name: str) -> Setting | None:
        """The entry of the setting whose environment name is `name`, None when none is: for a name that arrives
        as data (typed by the operator, recorded, in a level table), never one spelled in the code."""
        return self.entries.get(name)

    def every_entry(self) -> tuple[Setting, ...]:
        """Every setting's entry, in declaration order (what `config show` lists)."""
        return tuple(self.entries.values())

    def public_values(self) -> dict[str, str]:
        """Every setting's value, secrets as set/unset: safe to print, store and compare."""
        return {name: entry.shown for name, entry in self.entries.items()}

    def digest(self) -> str:
        blob = json.dumps(self.public_values(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def setting_fields() -> frozenset[str]:
    """The attribute names of the declared settings (`vllm_extra_args`, ...)."""
    return _FIELDS


_FIELDS = frozenset(f.name for f in dataclasses.fields(NumericKnobs) + dataclasses.fields(TextSettings))


def env_name(field: str) -> str:
    """The environment name of the setting held in attribute `field`; ValueError for any other name."""
    if field not in _FIELDS:
        raise ValueError(f"{field!r} is no setting attribute; allowed: a field of NumericKnobs or TextSettings")
    return field.upper()


def recorded_value(values: Mapping[str, str], field: str, default: str = "") -> str:
    """A setting's public value in a recorded mapping by environment name (`ServerRecord.settings`, from
    `Settings.public_values`), read by its attribute name: `recorded_value(server.settings, "vllm_extra_args")`."""
    return values.get(env_name(field), default)


_TYPED: dict[str, Callable[[str], object]] = {
    "int": int,
    "float": float,
    "bool": lambda text: text == "1",
    "str": str,
    "tuple[str, ...]": lambda text: tuple(shlex.split(text)),  # checked when resolved: it splits
}


def _typed_values(entries: Mapping[str, Setting]) -> dict[str, object]:
    """Each declared setting's canonical text as the type its field declares."""
    fields = dataclasses.fields(NumericKnobs) + dataclasses.fields(TextSettings)
    return {field.name: _TYPED[str(field.type)](entries[field.name.upper()].value) for field in fields}


@dataclass(frozen=True)
class _Raw:
    value: str
    source: str
    alias: str | None = None


def _shown(value: str, secret: bool) -> str:
    """A raw value as an error line shows it: secrets redacted, odd whitespace made visible."""
    if secret:
        return REDACTED
    return repr(value) if numbers.trim(value) != value or not value or not value.isprintable() else value


def check_knob(knob: Knob, raw: str, source: str, label: str | None = None) -> tuple[str, list[str]]:
    """The canonical value of `raw` for `knob`, and warnings; ConfigError when not allowed."""
    label = label or knob.name
    allowed = f"allowed: {knob.minimum}..{knob.maximum}"
    value = numbers.trim(raw)
    if not value:
        return knob.default, []
    canonical = numbers.canonical(knob.type, value)
    if canonical is None:
        kind = "integer" if knob.type == "int" else "decimal number"
        raise ConfigError(f"{label}={_shown(raw, False)} from {source} is not a base-10 {kind}; {allowed}")
    if numbers.compare(canonical, knob.minimum) < 0:
        if knob.range_policy == "soft":
            return knob.default, [
                f"{label}={canonical} from {source} is below {knob.minimum}; using the default {knob.default}"
            ]
        raise ConfigError(f"{label}={canonical} from {source} is below the minimum; {allowed}")
    if numbers.compare(canonical, knob.maximum) > 0:
        if knob.range_policy == "soft":
            return knob.maximum, [
                f"{label}={canonical} from {source} is above {knob.maximum}; the scheduler caps it at {knob.maximum}"
            ]
        raise ConfigError(f"{label}={canonical} from {source} is above the maximum; {allowed}")
    return canonical, []


def _check_text(spec: TextSetting, raw: str, source: str) -> str:
    value = raw.strip()
    if not value:
        return spec.default
    hidden = hidden_character(value)
    if hidden:
        raise ConfigError(
            f"{spec.name}={_shown(raw, spec.secret or spec.quiet)} from {source} holds the control "
            f"or invisible character {hidden}; allowed: printable text"
        )
    try:
        value = spec.check(value)
        if spec.vllm_flags:
            check_extra_args(shell_words(value))
        return value
    except Refused as exc:
        clause = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(exc))  # a U+00A0 in a word, shown
        raise ConfigError(f"{spec.name} from {source} {clause}") from None
    except ValueError as exc:
        raise ConfigError(
            f"{spec.name}={_shown(raw, spec.secret or spec.quiet)} from {source} is not allowed; allowed: {exc}"
        ) from None


class _Resolver:
    def __init__(
        self, registry: Registry, env_file: EnvFile, environ: Mapping[str, str], cli: Mapping[str, tuple[str, str]]
    ):
        self.registry = registry
        self.env_file = env_file
        self.environ = environ
        self.cli = cli
        self.warnings: list[str] = []
        self.aliases_of: dict[str, list[str]] = {}
        for alias, target in registry.aliases.items():
            self.aliases_of.setdefault(target, []).append(alias)

    def layers(self, name: str) -> list[_Raw | None]:
        """The value each layer gives `name` (CLI, environment, file), aliases folded in."""
        cli = self.cli.get(name)
        result: list[_Raw | None] = [_Raw(cli[0], f"CLI {cli[1]}") if cli else None]
        for values, where in ((self.environ, lambda n: "environment"), (self.env_file.values, self.env_file.where)):
            found = [
                _Raw(values[n], where(n), None if n == name else n)
                for n in [name, *self.aliases_of.get(name, [])]
                if n in values
            ]
            result.append(self._one_of(name, found))
        return result

    def _one_of(self, name: str, found: list[_Raw]) -> _Raw | None:
        if len(found) < 2:
            return found[0] if found else None
        knob = self.registry.by_name()[name]
        values = {check_knob(knob, raw.value, raw.source, raw.alias or name)[0] for raw in found}
        if len(values) > 1:
            listed = " and ".join(f"{raw.alias or name}={raw.value.strip()} ({raw.source})" for raw in found)
            raise ConfigError(f"{listed} disagree; set only {name}")
        return found[0]

    def pick(self, name: str, secret: bool, canonical: Callable[[_Raw], object]) -> tuple[_Raw | None, list[str]]:
        cli, env, file = self.layers(name)
        notes: list[str] = []
        if env is not None and file is not None:
            env_value, file_value = env.value.strip(), file.value.strip()
            if env_value != file_value and canonical(env) != canonical(file):
                notes.append(f"environment overrides {file.source}")
                shown = "" if secret else f" ({file_value} -> {env_value})"
                self.warnings.append(f"{name} from the environment overrides {file.source}{shown}")
        chosen = cli or env or file
        if cli is not None and (overridden := env or file) is not None:
            notes.append(f"CLI overrides {overridden.source}")
        if chosen is not None and chosen.alias:
            notes.append(f"alias {chosen.alias} used")
            self.warnings.append(f"{chosen.alias} is an alias; spell it {name} ({chosen.source})")
        return chosen, notes

    def knob_setting(self, knob: Knob) -> Setting:
        def canonical(raw: _Raw) -> str | None:
            try:
                return check_knob(knob, raw.value, raw.source)[0]
            except ConfigError:
                return None

        chosen, notes = self.pick(knob.name, False, canonical)
        if chosen is None:
            return Setting(knob.name, knob.default, "default", knob.group, knob.description)
        value, warnings = check_knob(knob, chosen.value, chosen.source, chosen.alias or knob.name)
        self.warnings.extend(warnings)
        if warnings:
            notes.append("clamped" if value == knob.maximum else "fell back to the default")
        return Setting(knob.name, value, chosen.source, knob.group, knob.description, False, tuple(notes))

    def text_setting(self, spec: TextSetting) -> Setting:
        chosen, notes = self.pick(spec.name, spec.secret or spec.quiet, lambda raw: raw.value.strip())
        if chosen is None:
            return Setting(spec.name, spec.default, "default", spec.group, spec.description, spec.secret)
        value = _check_text(spec, chosen.value, chosen.source)
        return Setting(spec.name, value, chosen.source, spec.group, spec.description, spec.secret, tuple(notes))


def is_secret(name: str) -> bool:
    """Declared secrets, and unknown names that look like one (keys, tokens, passwords)."""
    declared = {spec.name: spec.secret for spec in TEXT_SETTINGS}
    if name in declared:
        return declared[name]
    return name not in load_registry().by_name() and looks_secret(name)


def known_names(registry: Registry) -> set[str]:
    return {k.name for k in registry.knobs} | set(registry.aliases) | {s.name for s in TEXT_SETTINGS} | META_NAMES


def _unknown_key_warnings(
    names: Iterable[str], where: Callable[[str], str], known: set[str], any_close: bool
) -> list[str]:
    warnings = []
    for name in names:
        if name in known or name.startswith("DSPARK_TEST"):  # test hooks: DSPARK_TEST_*, DSPARK_TESTBED_*
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        if name.startswith("DSPARK") or (any_close and close):
            hint = f"; did you mean {close[0]}?" if close else ""
            warnings.append(f"unknown setting {name} ({where(name)}){hint}")
    return warnings


def _cross_checks(entries: Mapping[str, Setting], warnings: list[str]) -> None:
    def src(name: str) -> str:
        return entries[name].source

    budget = int(entries["MAX_NUM_BATCHED_TOKENS"].value)
    threshold = int(entries["LONG_PREFILL_TOKEN_THRESHOLD"].value)
    if threshold == 0 or threshold >= budget:
        warnings.append(
            f"LONG_PREFILL_TOKEN_THRESHOLD={threshold} ({src('LONG_PREFILL_TOKEN_THRESHOLD')}) with "
            f"MAX_NUM_BATCHED_TOKENS={budget}: one prefill can take the whole step budget and starve decode; "
            f"use a threshold below the budget, e.g. {max(1, budget // 8)}"
        )
    seqs = int(entries["MAX_NUM_SEQS"].value)
    if budget < seqs:
        raise ConfigError(
            f"MAX_NUM_BATCHED_TOKENS={budget} from {src('MAX_NUM_BATCHED_TOKENS')} is below "
            f"MAX_NUM_SEQS={seqs} ({src('MAX_NUM_SEQS')}); allowed: a budget of at least one token per sequence"
        )
    ports = {name: entries[name].value for name in ("VLLM_PORT", "RAY_PORT")}
    if ports["VLLM_PORT"] == ports["RAY_PORT"]:
        raise ConfigError(
            f"VLLM_PORT={ports['VLLM_PORT']} from {src('VLLM_PORT')} collides with RAY_PORT from "
            f"{src('RAY_PORT')}; allowed: two different ports"
        )
    if entries["VLLM_API_KEY"].value and entries["DSPARK_API_KEYS"].value:
        raise ConfigError(
            f"VLLM_API_KEY ({src('VLLM_API_KEY')}) and DSPARK_API_KEYS ({src('DSPARK_API_KEYS')}) are both set; "
            "allowed: one of them"
        )
    _check_exposure(entries, warnings)
    hosts = entries["DSPARK_WORKER_HOSTS"].value.split()
    ips = entries["DSPARK_WORKER_IPS"].value.split()
    if ips and len(ips) != len(hosts):
        raise ConfigError(
            f"DSPARK_WORKER_IPS has {len(ips)} address(es) from {src('DSPARK_WORKER_IPS')} but "
            f"DSPARK_WORKER_HOSTS has {len(hosts)}; allowed: one fabric IP per worker, same order"
        )
    copy_hosts = entries["DSPARK_MODEL_COPY_HOSTS"].value.split()
    if copy_hosts and len(copy_hosts) != len(hosts):
        raise ConfigError(
            f"DSPARK_MODEL_COPY_HOSTS has {len(copy_hosts)} address(es) from {src('DSPARK_MODEL_COPY_HOSTS')} but "
            f"DSPARK_WORKER_HOSTS has {len(hosts)}; allowed: one copy address per worker, same order"
        )


def _check_exposure(entries: Mapping[str, Setting], warnings: list[str]) -> None:
    """An API bound beyond loopback needs a key, unless the operator says the network is trusted."""
    host = entries["VLLM_HOST"]
    if host.value == "localhost" or ipaddress.ip_address(host.value).is_loopback:
        return
    if entries["VLLM_API_KEY"].value or entries["DSPARK_API_KEYS"].value:
        return
    trusted = entries["DSPARK_TRUSTED_NETWORK"]
    if trusted.value == "1":
        warnings.append(
            f"VLLM_HOST={host.value} ({host.source}) without an API key: anyone who reaches "
            f"{host.value} can use the API (DSPARK_TRUSTED_NETWORK=1 from {trusted.source})"
        )
        return
    raise ConfigError(
        f"VLLM_HOST={host.value} from {host.source} opens the API beyond this machine without an API key; "
        "allowed: set VLLM_API_KEY or DSPARK_API_KEYS, or DSPARK_TRUSTED_NETWORK=1 on a network you trust, "
        "or VLLM_HOST=127.0.0.1"
    )


def resolve(
    *,
    env_file: str | None = None,
    environ: Mapping[str, str] | None = None,
    cli: Mapping[str, tuple[str, str]] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Resolve every setting once. `cli` maps a setting name to (raw value, option spelling)."""
    environ = dict(os.environ if environ is None else environ)
    registry = load_registry()
    path, is_example = choose_env_file(env_file, environ, cwd or Path.cwd())
    loaded = EnvFile.none() if path is None else read_env_file(path, is_example)
    resolver = _Resolver(registry, loaded, environ, cli or {})
    warnings = resolver.warnings
    if path is None:
        warnings.append(NO_ENV_FILE)
    elif is_example:
        warnings.append(f"using the example settings {path}; run `dspark config init` to make your own .env.dspark")
    entries: dict[str, Setting] = {}
    for knob in registry.knobs:
        entries[knob.name] = resolver.knob_setting(knob)
    for spec in TEXT_SETTINGS:
        entries[spec.name] = resolver.text_setting(spec)
    known = known_names(registry)
    warnings.extend(_unknown_key_warnings(loaded.values, loaded.where, known, any_close=True))
    warnings.extend(_unknown_key_warnings(environ, lambda n: "environment", known, any_close=False))
    _cross_checks(entries, warnings)
    secret_in_file = any(value.strip() and is_secret(name) for name, value in loaded.values.items())
    if path is not None and secret_in_file and group_or_world_readable(path):
        warnings.append(f"{path} holds a secret and is readable by group or others; run: chmod 600 {path}")
    return Settings(
        **_typed_values(entries),  # type: ignore[arg-type]
        entries=MappingProxyType(entries),
        env_file=path,
        from_example=is_example,
        warnings=tuple(dict.fromkeys(warnings)),
        env_file_sha256=loaded.sha256,
    )
