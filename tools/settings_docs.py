"""Renders the settings reference for docs/configuration.md from the registry, the text settings and their levels.

python -m tools.settings_docs   # print the block (`python -m tools.generate` writes it into the page)
"""

from __future__ import annotations

import sys
from typing import Sequence

from dspark_launch.config import forward_env, serve_flags, ssh_options
from dspark_launch.config.checks import SECRET_WORDS
from dspark_launch.config.declared import DECLARED
from dspark_launch.config.knobs import Knob
from dspark_launch.config.levels import Levels
from dspark_launch.config.registry import load_registry
from dspark_launch.config.text_settings import RAY_TOKEN_MIN_LENGTH, TEXT_SETTINGS, TextSetting

BEGIN = "<!-- BEGIN GENERATED: python -m tools.generate -->"
END = "<!-- END GENERATED -->"


LEVEL_KEY = (
    "level: what a change needs. cluster: `dspark restart` takes Ray down on every node too; serve: only "
    "vllm serve restarts (Ray and the nodes kept up); live: `dspark reload` hands it to the running "
    "scheduler, no restart. flag: the `vllm serve` flag the setting sets (refused in `VLLM_EXTRA_ARGS`)."
)


def settings_reference(
    levels: Levels = DECLARED, knobs: Sequence[Knob] | None = None, text_settings: Sequence[TextSetting] = TEXT_SETTINGS
) -> str:
    """The block; `levels`, `knobs` and `text_settings` from the declarations (the registry file's knobs), or from
    a declaration class that extends them (the tests' fake settings)."""
    registry = load_registry()
    aliases = {target: alias for alias, target in registry.aliases.items()}
    lines = [
        BEGIN,
        "",
        LEVEL_KEY,
        "",
        "### Numeric knobs (`dspark-numeric-knobs.sh`)",
        "",
        "| name | type | default | allowed | out of range | group | level | flag | meaning |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k in registry.knobs if knobs is None else knobs:
        policy = "error" if k.range_policy == "hard" else f"below: default; above: {k.maximum}"
        alias = f" (alias `{aliases[k.name]}`)" if k.name in aliases else ""
        lines.append(
            f"| `{k.name}`{alias} | {k.type} | `{k.default}` | {k.minimum}..{k.maximum} | {policy} "
            f"| {k.group} | {_nature(levels, k.name)} | {k.description} |"
        )
    lines += [
        "",
        "### Other settings",
        "",
        "| name | default | group | level | flag | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for s in text_settings:
        default = f"`{s.default}`" if s.default else "(empty)"
        secret = " Secret: never printed." if s.secret else ""
        lines.append(f"| `{s.name}` | {default} | {s.group} | {_nature(levels, s.name)} | {s.description}.{secret} |")
    lines += _refusal_tables(levels)
    lines += ["", END]
    return "\n".join(lines) + "\n"


def _nature(levels: Levels, name: str) -> str:
    """The level and flag cells of a setting's row."""
    flag = levels.flag_of(name)
    return f"{levels.level(name)} | " + (f"`{flag}`" if flag else "")


def _refusal_tables(levels: Levels) -> list[str]:
    lines = [
        "",
        "### ssh options allowed in `DSPARK_SSH_OPTIONS`",
        "",
        "Anything else is refused (exit 2); each is passed to ssh as `-o Keyword=value`.",
        "",
        "| option | short form | value | meaning |",
        "|---|---|---|---|",
    ]
    for o in ssh_options.ALLOWED:
        short = f"`{o.short} {o.value}`" if o.short else ""
        lines.append(f"| `-o {o.keyword}=` | {short} | `{o.value}` | {o.meaning} |")
    owned = "; ".join(
        f"`{key}`: {use}" if key.startswith("-") else f"`-o {key}=`: {use}" for key, use in ssh_options.OWNED.items()
    )
    lines += ["", f"Set by the launcher, refused with the setting to use: {owned}."]
    lines += [
        "",
        "### `vllm serve` flags the launcher sets (refused in `VLLM_EXTRA_ARGS`)",
        "",
        "Also refused: their underscore spellings (`--api_key`), unambiguous prefixes (`--hos`), "
        "`-t`/`-n2` forms of the short aliases, and a positional model at the start.",
        "",
        "| flag | set instead |",
        "|---|---|",
    ]
    for flag in serve_flags.launcher_flags(levels):
        spelled = ", ".join(f"`{s}`" for s in flag.spellings)
        instead = (
            f"`{flag.setting}`" + (f" ({flag.why})" if flag.why else "") if flag.setting else f"(none: {flag.why})"
        )
        lines.append(f"| {spelled} | {instead} |")
    secret = ", ".join(f"`{s}` ({flag.why})" for flag in serve_flags.SECRET_FLAGS for s in flag.spellings)
    lines += ["", f"Refused too, in the same spellings, because their value is a secret: {secret}."]
    lines += [
        "",
        "### Names DSPARK_FORWARD_ENV accepts",
        "",
        "Only these (an allow-list, by family; the name exactly, case included); every other name is refused "
        "with one line, exit 2, nothing started:",
        "",
        "| family | names | why each is safe |",
        "|---|---|---|",
    ]
    for family in forward_env.ALLOWED:
        names = ", ".join(f"`{name}`" for name in family.shown.split(", "))
        lines.append(f"| {family.title} | {names} | {family.why} |")
    lines += [
        "",
        "### Names refused in `DSPARK_FORWARD_ENV`, and why",
        "",
        "Not on the list above, and never added to it: any name that looks like a secret (contains "
        f"{', '.join(SECRET_WORDS)}, in any case), and every name matching one of these patterns (checked "
        "first: the error names the reason):",
        "",
        "| pattern (whole name, in upper case) | why |",
        "|---|---|",
    ]
    for pattern, why in forward_env.REFUSED_NAMES:
        escaped = pattern.replace("|", "\\|")  # a pipe inside a table cell
        lines.append(f"| `{escaped}` | {why} |")
    names = ", ".join(f"`{name}`" for name in sorted(forward_env.profile_env_names()))
    lines += ["", f"Also refused: {forward_env.PROFILE_ENV_WHY}: {names}."]
    lines += ["", f"`RAY_AUTH_TOKEN`, when set, has at least {RAY_TOKEN_MIN_LENGTH} characters."]
    return lines


if __name__ == "__main__":
    sys.stdout.write(settings_reference())
