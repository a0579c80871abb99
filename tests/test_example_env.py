"""The example env file documents every setting, with the registry's defaults."""

from __future__ import annotations

import re

from dspark_launch.config.envfile import read_env_file
from dspark_launch.config.profile_resolve import profile_value
from dspark_launch.config.registry import load_registry
from dspark_launch.config.text_settings import TEXT_SETTINGS
from dspark_launch.profiles.catalog import DEFAULT_PROFILE, profile_named
from tests.support.paths import REPO

EXAMPLE = REPO / ".env.dspark.example"
# Placeholders an operator must replace; everything else must equal its default.
PLACEHOLDERS = {"DSPARK_HEAD_IP", "DSPARK_WORKER_HOSTS", "DSPARK_FABRIC_IFNAME"}


# The settings the default profile gives: commented out in the example with the profile's value, so a copy of
# the example sets none of them and every line an operator writes is used as written.
BY_PROFILE = {
    d.setting: profile_value(profile_named(DEFAULT_PROFILE), d) for d in profile_named(DEFAULT_PROFILE).settings
}


def commented_out() -> dict[str, str]:
    found = {}
    for line in EXAMPLE.read_text().splitlines():
        match = re.fullmatch(r"# ([A-Z][A-Z0-9_]*)=(\S*)", line)
        if match:
            found[match[1]] = match[2]
    return found


def test_every_knob_is_in_the_example_with_its_default():
    values = read_env_file(EXAMPLE, True).values
    for knob in load_registry().knobs:
        if knob.name in BY_PROFILE:
            continue
        assert knob.name in values, f"{knob.name} missing from {EXAMPLE.name}"
        assert values[knob.name] == knob.default, (
            f"{knob.name}: example {values[knob.name]!r}, registry {knob.default!r}"
        )


def test_every_text_setting_is_in_the_example():
    values = read_env_file(EXAMPLE, True).values
    for spec in TEXT_SETTINGS:
        if spec.name in BY_PROFILE:
            continue
        assert spec.name in values, f"{spec.name} missing from {EXAMPLE.name}"
        if spec.name not in PLACEHOLDERS:
            assert values[spec.name] == spec.default, spec.name
    for name in PLACEHOLDERS:
        assert values[name], f"{name} needs a placeholder in the example"


def test_the_settings_the_profile_gives_are_commented_out_with_the_profiles_value():
    values, shown = read_env_file(EXAMPLE, True).values, commented_out()
    assert set(BY_PROFILE) <= set(shown) and not set(BY_PROFILE) & set(values)
    for name, value in BY_PROFILE.items():
        assert shown[name] == value, f"{name}: example shows {shown[name]!r}, the profile gives {value!r}"
    assert shown["DSPARK_MODEL"] == "deepseek-ai/DeepSeek-V4-Flash-0731"  # the checkpoint the profile serves


def test_example_sets_nothing_unknown():
    known = {k.name for k in load_registry().knobs} | {s.name for s in TEXT_SETTINGS}
    assert set(read_env_file(EXAMPLE, True).values) <= known


def test_example_groups_follow_the_registry_groups():
    text = EXAMPLE.read_text()
    for group in ("cluster", "fabric", "serving knobs", "hotfix", "security"):
        assert f"# ---- {group} " in text


def test_docs_reference_is_generated_from_the_registry():
    from tools.settings_docs import settings_reference

    assert settings_reference() in (REPO / "docs" / "configuration.md").read_text(), (
        "docs/configuration.md is stale: regenerate the block with `python -m tools.generate`"
    )
