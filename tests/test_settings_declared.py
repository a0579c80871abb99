"""Each setting is declared once (config/knobs.py, config/text_settings.py); the rest is generated or typed."""

from __future__ import annotations

import dataclasses

from dspark_launch.config.knobs import NumericKnobs, declared_aliases, declared_knobs
from dspark_launch.config.registry import load_registry
from dspark_launch.config.settings import resolve
from dspark_launch.config.text_settings import TextSettings
from tests.support.paths import REPO
from tools import generate
from tools.settings_docs import END


def _rule_of(knob):
    return (knob.name, knob.type, knob.default, knob.minimum, knob.maximum, knob.range_policy, knob.description,
            knob.group)


def test_generated_files_are_fresh():
    assert generate.stale() == [], "stale: run `python -m tools.generate`"


def test_the_bash_registry_parses_back_to_the_declarations():
    parsed = load_registry()
    assert [_rule_of(k) for k in parsed.knobs] == [_rule_of(k) for k in declared_knobs()]
    assert parsed.aliases == declared_aliases()


def test_the_packaged_registry_is_the_generated_one():
    packaged = REPO / "dspark_launch" / "config" / "dspark-numeric-knobs.sh"
    assert packaged.read_text() == (REPO / "dspark-numeric-knobs.sh").read_text()


def test_settings_are_typed_attributes(tmp_path, clean_environ):
    environ = {**clean_environ, "HEALTH_TIMEOUT_S": " 007 ", "GPU_MEMORY_UTILIZATION": "0.50",
               "DSPARK_TRUSTED_NETWORK": "1", "VLLM_EXTRA_ARGS": "--seed 3 --disable-log-stats",
               "DSPARK_MODEL_COPY_STREAMS": "8"}
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
    changed = tuple(dataclasses.replace(k, default="7") if k.name == "HEALTH_TIMEOUT_S" else k
                    for k in declared_knobs())
    monkeypatch.setattr(generate, "declared_knobs", lambda: changed)
    registry = generate.render_registry(generate.REGISTRY.read_text())
    assert any(line.split()[1:4] == ["HEALTH_TIMEOUT_S", "int", "7"] for line in registry.splitlines()
               if line.startswith("dspark_knob "))
    assert "\nHEALTH_TIMEOUT_S=7\n" in generate.render_example(generate.EXAMPLE.read_text())


def test_docs_block_is_rewritten_and_stray_end_markers_dropped():
    text = generate.DOCS.read_text()
    messy = text.replace(END, f"{END}\n\n{END}\n{END}", 1)
    assert generate.render_docs(messy) == text
    stale = text.replace("| `HEALTH_TIMEOUT_S` |", "| `HEALTH_TIMEOUT` |") + "\n## After the block\n"
    assert generate.render_docs(stale) == text + "\n## After the block\n"
