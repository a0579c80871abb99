"""Write the files generated from the setting declarations (config/knobs.py, config/text_settings.py).

    python -m tools.generate          # rewrite the stale ones
    python -m tools.generate --check  # exit 1 naming each stale file

- `dspark-numeric-knobs.sh`: the `dspark_knob` lines of `_dspark_registry` (the bash
  around them is written by hand: the number rules, shared with config/numbers.py);
- `.env.dspark.example`: each numeric knob's line, `NAME=default`, or `# NAME=value`
  for one the default profile gives; a knob without a line gets one, with its
  description, at the end of its group's section. Other lines are written by hand;
- `docs/configuration.md`: the reference block between its markers (tools/settings_docs.py).

The tests fail while any of them is stale. In a checkout only (tools/ is not in the wheel).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dspark_launch.config.knobs import declared_aliases, declared_knobs
from dspark_launch.config.registry import REGISTRY_FILENAME
from tools.settings_docs import BEGIN, END, settings_reference

REPO = Path(__file__).resolve().parents[1]
REGISTRY = REPO / REGISTRY_FILENAME
EXAMPLE = REPO / ".env.dspark.example"
DOCS = REPO / "docs" / "configuration.md"

_TABLE_START = "_dspark_registry() {"
_SECTION_OF_GROUP = {"serving": "serving knobs"}  # the example's section title, where it differs from the group
_MIN_WIDTHS = (30, 5, 8, 4, 8)  # the table's columns as first written: a new knob rewrites one line, not all
_UNSAFE_IN_BASH_QUOTES = re.compile(r'["$`\\!]')


def registry_lines() -> list[str]:
    """The `dspark_knob` lines, a `# Group` comment above each group, aligned."""
    knobs = declared_knobs()
    aliases = {name: alias for alias, name in declared_aliases().items()}
    columns = zip(("name", "type", "default", "minimum", "maximum"), _MIN_WIDTHS)
    widths = [max(least, *(len(getattr(k, column)) for k in knobs)) for column, least in columns]
    lines, group = [], None
    for k in knobs:
        if _UNSAFE_IN_BASH_QUOTES.search(k.description):
            raise ValueError(f'{k.name}: its description holds one of " $ ` \\ ! (it is written in bash quotes)')
        if k.group != group:
            group = k.group
            lines.append(f"# {group.capitalize()}")
        columns = [
            value.ljust(width) for value, width in zip((k.name, k.type, k.default, k.minimum, k.maximum), widths)
        ]
        lines.append(f'dspark_knob {" ".join(columns)} {k.range_policy} "{k.description}"')
        if k.name in aliases:
            lines.append(f"dspark_knob_alias {aliases[k.name]} {k.name}")
    return lines


def render_registry(text: str) -> str:
    lines = text.splitlines()
    start = lines.index(_TABLE_START) + 1
    end = lines.index("}", start)
    return "\n".join(lines[:start] + registry_lines() + lines[end:]) + "\n"


def _profile_values() -> dict[str, str]:
    from dspark_launch.config.profile_resolve import profile_value
    from dspark_launch.profiles.catalog import DEFAULT_PROFILE, profile_named

    profile = profile_named(DEFAULT_PROFILE)
    return {d.setting: profile_value(profile, d) for d in profile.settings}


def render_example(text: str) -> str:
    lines = text.splitlines()
    by_profile = _profile_values()
    for k in declared_knobs():
        wanted = f"# {k.name}={by_profile[k.name]}" if k.name in by_profile else f"{k.name}={k.default}"
        found = [i for i, line in enumerate(lines) if re.fullmatch(rf"(# )?{k.name}=.*", line)]
        if found:
            lines[found[0]] = wanted
            continue
        title = _SECTION_OF_GROUP.get(k.group, k.group)
        header = next(i for i, line in enumerate(lines) if line.startswith(f"# ---- {title} "))
        end = next((i for i in range(header + 1, len(lines)) if not lines[i].strip()), len(lines))
        lines[end:end] = [f"# {k.description}.", wanted]
    return "\n".join(lines) + "\n"


def render_docs(text: str) -> str:
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    after = re.sub(rf"\A(\s*{re.escape(END)})*", "", after)  # stray end markers left by earlier edits
    return before + settings_reference().rstrip("\n") + (after if after.strip() else "\n")


GENERATED = ((REGISTRY, render_registry), (EXAMPLE, render_example), (DOCS, render_docs))


def stale() -> list[Path]:
    return [
        path
        for path, render in GENERATED
        if path.read_text(encoding="utf-8") != render(path.read_text(encoding="utf-8"))
    ]


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        found = stale()
        for path in found:
            print(f"{path.relative_to(REPO)} is stale: python -m tools.generate", file=sys.stderr)
        return 1 if found else 0
    if argv:
        print("usage: python -m tools.generate [--check]", file=sys.stderr)
        return 2
    for path, render in GENERATED:
        text = path.read_text(encoding="utf-8")
        if render(text) != text:
            path.write_text(render(text), encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
