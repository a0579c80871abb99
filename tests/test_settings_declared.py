"""Each setting is declared once (config/knobs.py, config/text_settings.py); the rest is generated or typed."""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
import subprocess

import pytest

from dspark_launch.config.declared import DECLARED
from dspark_launch.config.knobs import NumericKnobs, declared_aliases, declared_knobs
from dspark_launch.config.registry import load_registry
from dspark_launch.config.settings import recorded_value, resolve, setting_fields
from dspark_launch.config.text_settings import TextSettings
from tests.support.paths import REPO
from tools import generate
from tools.settings_docs import END


def _rule_of(knob):
    return (
        knob.name,
        knob.type,
        knob.default,
        knob.minimum,
        knob.maximum,
        knob.range_policy,
        knob.description,
        knob.group,
    )


def test_generated_files_are_fresh():
    assert generate.stale() == [], "stale: run `python -m tools.generate`"


def _bash_view(registry_file):
    """What bash itself holds after sourcing the registry (the start script's view): name -> rule, alias -> name."""
    script = (
        f"source {shlex.quote(str(registry_file))} || exit 9\n"
        'for k in "${!_DSPARK_KNOB_SPEC[@]}"; do printf "knob %s %s\\n" "$k" "${_DSPARK_KNOB_SPEC[$k]}"; done\n'
        'for a in "${!_DSPARK_KNOB_ALIAS[@]}"; do printf "alias %s %s\\n" "$a" "${_DSPARK_KNOB_ALIAS[$a]}"; done\n'
    )
    done = subprocess.run(
        ["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True
    )
    knobs, aliases = {}, {}
    for line in done.stdout.splitlines():
        kind, name, *rest = line.split()
        if kind == "knob":
            knobs[name] = tuple(rest)
        else:
            aliases[name] = rest[0]
    return knobs, aliases


def test_bash_holds_the_declared_knobs():
    knobs, aliases = _bash_view(REPO / "dspark-numeric-knobs.sh")
    declared = {k.name: (k.type, k.default, k.minimum, k.maximum, k.range_policy) for k in declared_knobs()}
    assert knobs == declared
    assert aliases == declared_aliases()
    assert load_registry().by_name() == {k.name: k for k in declared_knobs()}


def test_a_bound_edited_in_the_bash_file_fails_the_check(tmp_path):
    text = (REPO / "dspark-numeric-knobs.sh").read_text()
    edited = tmp_path / "dspark-numeric-knobs.sh"
    edited.write_text(re.sub(r"(dspark_knob DSPARK_PREFILL_AGING +float +\S+ +\S+ +)\S+", r"\g<1>100", text))
    knobs, _ = _bash_view(edited)
    assert knobs["DSPARK_PREFILL_AGING"][3] == "100"
    assert knobs["DSPARK_PREFILL_AGING"] != next(
        (k.type, k.default, k.minimum, k.maximum, k.range_policy)
        for k in declared_knobs()
        if k.name == "DSPARK_PREFILL_AGING"
    )
    assert generate.render_registry(edited.read_text()) == text


def test_the_packaged_registry_is_the_generated_one():
    packaged = REPO / "dspark_launch" / "config" / "dspark-numeric-knobs.sh"
    assert packaged.read_text() == (REPO / "dspark-numeric-knobs.sh").read_text()


def test_settings_are_typed_attributes(tmp_path, clean_environ):
    environ = {
        **clean_environ,
        "HEALTH_TIMEOUT_S": " 007 ",
        "GPU_MEMORY_UTILIZATION": "0.50",
        "DSPARK_TRUSTED_NETWORK": "1",
        "VLLM_EXTRA_ARGS": "--seed 3 --disable-log-stats",
        "DSPARK_MODEL_COPY_STREAMS": "8",
    }
    s = resolve(env_file="/dev/null", environ=environ, cwd=tmp_path)
    assert s.health_timeout_s == 7 and type(s.health_timeout_s) is int
    assert s.gpu_memory_utilization == 0.5 and type(s.gpu_memory_utilization) is float
    assert s.dspark_trusted_network is True and s.hf_hub_offline is False and s.enable_prefix_caching is True
    assert s.vllm_extra_args == ("--seed", "3", "--disable-log-stats")
    assert s.dspark_model_copy_streams == 8 and s.vllm_host == "127.0.0.1"
    assert s.entries["HEALTH_TIMEOUT_S"].value == "7" and s.entries["HEALTH_TIMEOUT_S"].source == "environment"


def test_every_declared_setting_is_resolved_and_nothing_else():
    declared = {f.name.upper() for f in dataclasses.fields(NumericKnobs) + dataclasses.fields(TextSettings)}
    assert set(resolve(env_file="/dev/null", environ={}).entries) == declared


def test_a_knob_missing_from_the_example_gets_its_line_in_its_section():
    text = generate.EXAMPLE.read_text()
    without = "\n".join(line for line in text.splitlines() if not line.startswith("HEALTH_TIMEOUT_S=")) + "\n"
    added = generate.render_example(without).splitlines()
    line = added.index("HEALTH_TIMEOUT_S=5")
    assert added[line - 1] == "# seconds one health or status probe may take."
    section = max(i for i, row in enumerate(added[:line]) if row.startswith("# ---- "))
    assert added[section].startswith("# ---- serving knobs ")
    assert generate.render_example("\n".join(added) + "\n") == "\n".join(added) + "\n"


def test_a_changed_default_reaches_every_generated_file(monkeypatch):
    changed = tuple(
        dataclasses.replace(k, default="7") if k.name == "HEALTH_TIMEOUT_S" else k for k in declared_knobs()
    )
    monkeypatch.setattr(generate, "declared_knobs", lambda: changed)
    registry = generate.render_registry(generate.REGISTRY.read_text())
    assert any(
        line.split()[1:4] == ["HEALTH_TIMEOUT_S", "int", "7"]
        for line in registry.splitlines()
        if line.startswith("dspark_knob ")
    )
    assert "\nHEALTH_TIMEOUT_S=7\n" in generate.render_example(generate.EXAMPLE.read_text())


def test_docs_block_is_rewritten_and_stray_end_markers_dropped():
    text = generate.DOCS.read_text()
    messy = text.replace(END, f"{END}\n\n{END}\n{END}", 1)
    assert generate.render_docs(messy) == text
    stale = text.replace("| `HEALTH_TIMEOUT_S` |", "| `HEALTH_TIMEOUT` |") + "\n## After the block\n"
    assert generate.render_docs(stale) == text + "\n## After the block\n"


def test_where_a_setting_came_from_is_read_by_its_attribute(tmp_path, clean_environ):
    path = tmp_path / "e.env"
    path.write_text("VLLM_EXTRA_ARGS=--enforce-eager\n")
    s = resolve(env_file=str(path), environ={"HEALTH_TIMEOUT_S": "7"})
    assert s.source_of("vllm_extra_args") == f"{path}:1" and s.source_of("health_timeout_s") == "environment"
    assert s.entry("vllm_port").source == "default" and s.entry("vllm_port").name == "VLLM_PORT"
    with pytest.raises(ValueError, match="no setting attribute"):
        s.source_of("VLLM_EXTRA_ARGS")  # the environment name is not the accessor's key
    recorded = s.public_values()
    assert recorded_value(recorded, "vllm_extra_args") == "--enforce-eager"
    assert recorded_value({}, "vllm_extra_args") == ""  # a record from before the setting existed
    with pytest.raises(ValueError):
        recorded_value(recorded, "VLLM_EXTRA_ARGS")


# Outside config/, a setting is read through `Settings` attributes and its accessors (`entry`, `source_of`,
# `every_entry`; `named` only for a name that arrives as data) and a record's values through `recorded_value`.
# An environment name in a child process's env dict (`env["HF_TOKEN"] = ...`) names another program's
# variable and is not a read of a setting: only receivers that hold settings are checked.
_ACCESSORS = ("entry", "source_of", "recorded_value", "placeholder")


def _settings_holder(node: ast.expr) -> bool:
    """`settings`, `x.settings`, `server.running_settings`: something holding settings by environment name."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name.endswith("settings")


def reads_by_environment_name(source: str) -> list[str]:
    """Each read of a setting by its environment name in `source`, as `line: code`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        const = None
        if isinstance(node, ast.Attribute) and node.attr == "entries":
            found.append(node)
            continue
        if isinstance(node, ast.Subscript) and _settings_holder(node.value):
            const = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "get" and _settings_holder(node.func.value) or node.func.attr == "named":
                const = node.args[0]
        if isinstance(const, ast.Constant) and const.value in DECLARED.names:
            found.append(node)
        if isinstance(node, ast.Call) and node.args:  # a typo in an accessor's key fails only on its error path
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            key = node.args[-1] if callee in ("recorded_value", "placeholder") else node.args[0]
            if callee in _ACCESSORS and isinstance(key, ast.Constant) and key.value not in setting_fields():
                found.append(node)
    return sorted(f"{node.lineno}: {ast.unparse(node)}" for node in found)


def test_no_setting_is_read_by_its_environment_name_outside_config():
    package = REPO / "dspark_launch"
    reads = {
        str(path.relative_to(REPO)): reads_by_environment_name(path.read_text())
        for path in sorted(package.rglob("*.py"))
        if path.parent.relative_to(package).parts[:1] != ("config",)
    }
    assert {path: found for path, found in reads.items() if found} == {}


def test_the_guard_finds_each_kind_of_read_and_leaves_child_environments():
    reads = reads_by_environment_name(
        'a = settings.entries["VLLM_EXTRA_ARGS"].source\n'
        'b = server.settings.get("VLLM_EXTRA_ARGS", "")\n'
        'c = server.running_settings["MAX_NUM_SEQS"]\n'
        'd = settings.named("DSPARK_IMAGE")\n'
        'e = settings.source_of("VLLM_EXTRA_ARGS")\n'
        'f = recorded_value(server.settings, "vllm_extra_arg")\n'
        'env["HF_TOKEN"] = settings.hf_token\n'
        'g = environ.get("HF_TOKEN", "")\n'
        'h = settings.source_of("vllm_extra_args") + recorded_value(server.settings, "vllm_extra_args")\n'
    )
    assert [r.split(":")[0] for r in reads] == ["1", "2", "3", "4", "5", "6"]
