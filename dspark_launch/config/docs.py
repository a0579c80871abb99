"""Renders the settings reference for docs/configuration.md from the registry and the text settings."""

from __future__ import annotations

from dspark_launch.config.registry import load_registry
from dspark_launch.config.text_settings import TEXT_SETTINGS

BEGIN = "<!-- BEGIN GENERATED: dspark config docs -->"
END = "<!-- END GENERATED -->"


def settings_reference() -> str:
    registry = load_registry()
    aliases = {target: alias for alias, target in registry.aliases.items()}
    lines = [BEGIN, "", "### Numeric knobs (`dspark-numeric-knobs.sh`)", "",
             "| name | type | default | allowed | out of range | group | meaning |",
             "|---|---|---|---|---|---|---|"]
    for k in registry.knobs:
        policy = "error" if k.range_policy == "hard" else f"below: default; above: {k.maximum}"
        alias = f" (alias `{aliases[k.name]}`)" if k.name in aliases else ""
        lines.append(f"| `{k.name}`{alias} | {k.type} | `{k.default}` | {k.minimum}..{k.maximum} | {policy} "
                     f"| {k.group} | {k.description} |")
    lines += ["", "### Other settings", "", "| name | default | group | meaning |", "|---|---|---|---|"]
    for s in TEXT_SETTINGS:
        default = f"`{s.default}`" if s.default else "(empty)"
        secret = " Secret: never printed." if s.secret else ""
        lines.append(f"| `{s.name}` | {default} | {s.group} | {s.description}.{secret} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"
