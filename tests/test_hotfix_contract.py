"""The hotfix's contract module, its injected helpers tested directly, the
standalone script built from them, and the knob registry kept equal to them."""

from __future__ import annotations

import ast
import builtins
import json
import subprocess
import sys

import pytest

from dspark_launch.config.registry import load_registry
from dspark_launch.errors import EXIT_BAD_CONFIG
from dspark_launch.hotfix import contract, injected, layout
from dspark_launch.hotfix.injected_source import injected_body
from dspark_launch.serve import logscan
from tests.support.live_rows import live_row
from tools import hotfix_bundle as bundle


def test_registry_knob_bounds_are_the_contracts():
    knobs = load_registry().by_name()
    cap, mode, diag = knobs[contract.ENV_CAP], knobs[contract.ENV_GATE_MODE], knobs[contract.ENV_DIAG]
    assert (int(cap.minimum), int(cap.maximum), int(cap.default)) == (
        contract.CAP_MIN,
        contract.CAP_MAX,
        contract.DEFAULT_CAP,
    )
    assert (int(mode.minimum), int(mode.maximum)) == (min(contract.GATE_MODES), max(contract.GATE_MODES))
    assert list(range(int(mode.minimum), int(mode.maximum) + 1)) == list(contract.GATE_MODES)
    assert int(mode.default) == contract.DEFAULT_GATE_MODE
    assert (int(diag.minimum), int(diag.maximum), int(diag.default)) == (0, 1, 0)


def test_unsupported_exit_is_not_the_launchers_bad_configuration():
    assert contract.EXIT_UNSUPPORTED != EXIT_BAD_CONFIG
    assert set(contract.EXIT_MEANINGS) == {
        contract.EXIT_OK,
        contract.EXIT_NOT_APPLIED,
        contract.EXIT_OUTDATED,
        contract.EXIT_UNSUPPORTED,
    }


def test_active_line_round_trips_through_the_log_scanner():
    line = contract.active_line(contract.PATCH_VERSION, 2, 1, 2560)
    log = "INFO noise\n" + contract.active_line(2, 1, 0, None) + "\n(EngineCore) INFO " + line + "\n"
    assert contract.parse_active_lines(log) == [
        contract.ActiveLine(2, 1, 0, None),
        contract.ActiveLine(contract.PATCH_VERSION, 2, 1, 2560),
    ]
    assert logscan.hotfix_cap(log) == 2
    assert logscan.hotfix_cap("no hotfix here") is None


CAPS = [
    (None, 1, (1, False)),
    ("", 1, (1, False)),
    (" 2 ", 1, (2, False)),
    ("+2", 1, (2, False)),
    ("4", 1, (3, False)),
    ("0", 2, (2, False)),
    ("-1", 1, (1, False)),
    ("two", 2, (2, True)),
    ("2.0", 1, (1, True)),
    ("\u0663", 1, (1, True)),
    (None, 7, (3, False)),
]


@pytest.mark.parametrize(("raw", "fallback", "expected"), CAPS)
def test_injected_cap_parser(raw, fallback, expected):
    assert injected._dspark_hotfix_parse(live_row(contract.ENV_CAP), raw, fallback) == expected


def test_injected_body_names_are_all_defined_in_the_patched_module():
    """A lint of the injected text as it lands in scheduler.py: every global it
    reads is its own, one of the rendered constants, a builtin, or `logger`
    (the scheduler module's)."""
    tree = ast.parse(injected_body())
    defined = set(contract.injected_constants()) | {"logger"} | set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.alias):
            defined.add(node.asname or node.name)
    loaded = set()
    for func in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        local = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
        local |= {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        local |= {n.name for n in ast.walk(func) if isinstance(n, ast.ExceptHandler) and n.name}
        loaded |= {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - local
    assert loaded <= defined, sorted(loaded - defined)


def test_module_header_constants_are_the_rendered_ones():
    for name, value in contract.injected_constants().items():
        assert getattr(injected, name) == value, name
    rendered = layout.helpers_source()
    for name, value in contract.injected_constants().items():
        assert f"{name} = {value!r}\n" in rendered


def test_standalone_script_is_built_from_the_modules():
    assert bundle.SCRIPT.read_text(encoding="utf-8") == bundle.render(), (
        "patches/ script is stale: python -m tools.hotfix_bundle"
    )


BLOCK_DSPARK = (
    "import sys, runpy\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'dspark_launch':\n"
    "            raise ImportError('dspark_launch blocked')\n"
    "sys.meta_path.insert(0, Block())\n"
    "sys.argv = [sys.argv[1], *sys.argv[2:]]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def test_standalone_script_runs_where_dspark_launch_cannot_be_imported(tmp_path):
    """vLLM importable (the default target is found), dspark_launch not."""
    probe = subprocess.run(
        [sys.executable, "-c", BLOCK_DSPARK.replace("runpy.run_path", "import dspark_launch #"), "x"],
        capture_output=True,
        text=True,
    )
    assert "dspark_launch blocked" in probe.stderr
    copy = tmp_path / "hotfix.py"
    copy.write_bytes(bundle.SCRIPT.read_bytes())
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_DSPARK, str(copy), "status", "--json"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode in (contract.EXIT_OK, contract.EXIT_NOT_APPLIED, contract.EXIT_OUTDATED), proc.stderr
    out = json.loads(proc.stdout)
    assert out["vllm_version"] == "0.32.0" and out["patch_version"] == contract.PATCH_VERSION


def test_docs_claim_only_what_holds():
    """Issue 14.13: the step bound is the waiting section's, the count has the
    bypass exception, and the deferred marking is stated."""
    doc = (bundle.REPO / "docs" / "hotfix.md").read_text(encoding="utf-8")
    assert "at most `cap` running requests have `is_prefill_chunk` set." not in doc
    assert "never more than `(cap + ½) × threshold` in all" not in doc
    holds = doc[doc.index("## What holds") :]
    holds = holds[: holds.index("\n## ", 5)]
    for needed in ("waiting section", "bypass", "adaptive threshold", "deferred"):
        assert needed in holds, needed


def _sched(chunk=256, cap=1, short_room=64):
    from types import SimpleNamespace

    bound = cap * chunk + chunk // 2 if chunk else 0
    return SimpleNamespace(
        _dspark_chunk=chunk, _dspark_step_bound=bound, _dspark_max_inflight_prefills=cap, _dspark_short_room=short_room
    )


def _request(num_tokens, computed=0):
    from types import SimpleNamespace

    return SimpleNamespace(num_tokens=num_tokens, num_computed_tokens=computed, status=SimpleNamespace(name="WAITING"))


@pytest.mark.parametrize(
    ("num_tokens", "hit", "partial", "spent", "expected"),
    [
        (1260, 1200, 1, 256, 0),  # a cached turn: 60 tokens left, fits beside the long chunk
        (1260, 0, 1, 256, -1),  # the same prompt cold: stays mid-prefill, the count is full
        (1328, 1200, 1, 256, 0),  # a cached tail of 128: exactly what the bound leaves
        (1360, 1200, 1, 256, -1),  # a cached tail of 160: the room is not for cached tails
        (160, 0, 1, 256, 0),  # short: 256 + 160 <= 384 + 64
        (200, 0, 1, 256, -1),  # short but over the room, count full
        (4000, 0, 0, 256, 128),  # long, slot free: what is left of the bound
        (4000, 0, 0, 384, -1),  # long, bound used up
        (200, 0, 0, 0, 0),  # finishes within the step on an empty step
        (300, 0, 0, 0, 384),  # one chunk too long to finish: a slot, the whole bound (vLLM clamps to 256)
    ],
)
def test_injected_mode_two_admission_rule(num_tokens, hit, partial, spent, expected):
    assert injected._dspark_hotfix_admit(_sched(), _request(num_tokens), hit, 2048, partial, spent) == expected


def test_injected_mode_two_never_holds_a_request_with_kv_blocks():
    assert injected._dspark_hotfix_admit(_sched(), _request(4000, computed=100), 100, 2048, 3, 10_000) == 0
