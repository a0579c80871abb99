"""bash and Python read the same registry and must agree on every value."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_launch.config.registry import load_registry
from dspark_launch.config.settings import check_knob
from dspark_launch.errors import ConfigError
from tests.support.paths import REGISTRY_SH


class _Unset:
    def __repr__(self) -> str:  # a stable test id: pytest-xdist workers must collect the same names
        return "unset"


UNSET = _Unset()
CORPUS = [
    UNSET,
    "",
    "   ",
    " 2 ",
    "010",
    "+2",
    "-1",
    "0",
    "1",
    "3",
    "4",
    "2.0",
    "two",
    "1x",
    "0x10",
    "2\r",
    "123456789012345678901234567890",
    "-123456789012345678901234567890",
    "\u0663",
    "2\u0663",
    "\uff12",
    "-0",
    "+",
    "-",
    "1 2",
    "\t3\n",
    "0002",
    "1e3",
    " +0 ",
]
FLOAT_CORPUS = [
    UNSET,
    "",
    "0.835",
    ".9",
    "1",
    "0.90",
    "00.5000",
    "-0.5",
    "0.95",
    "0.950000",
    "0.9500001",
    "0.05",
    "0.0499",
    "1e-1",
    ".",
    "2.",
    "0.5.1",
    "\u0660.5",
    " 0.7\r",
    "+0.3",
    "nan",
    "inf",
]

BASH = r"""
set -euo pipefail
if [[ $1 == set ]]; then export "$2=$3"; else unset "$2"; fi
source "$4" 2>/dev/null
echo "${!2-__unset__}"
"""


def bash_result(name: str, value) -> tuple[str, str | None]:
    args = [
        "bash",
        "-c",
        BASH,
        "bash",
        "unset" if value is UNSET else "set",
        name,
        "" if value is UNSET else value,
        str(REGISTRY_SH),
    ]
    proc = subprocess.run(args, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    if proc.returncode == 2:
        return "reject", None
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.rstrip("\n")
    return ("unset", None) if out == "__unset__" else ("accept", out)


def python_result(name: str, value) -> tuple[str, str | None]:
    if value is UNSET:
        return "unset", None
    knob = load_registry().by_name()[name]
    try:
        return "accept", check_knob(knob, value, "environment")[0]
    except ConfigError:
        return "reject", None


@pytest.mark.parametrize("value", CORPUS, ids=repr)
def test_cap_knob_agrees(value):
    assert bash_result("DSPARK_MAX_INFLIGHT_PREFILLS", value) == python_result("DSPARK_MAX_INFLIGHT_PREFILLS", value)


@pytest.mark.parametrize("value", FLOAT_CORPUS, ids=repr)
def test_float_knob_agrees(value):
    assert bash_result("GPU_MEMORY_UTILIZATION", value) == python_result("GPU_MEMORY_UTILIZATION", value)


@pytest.mark.parametrize("value", ["65535", "65536", "0", "08888", "-8888"], ids=repr)
def test_hard_range_knob_agrees(value):
    assert bash_result("VLLM_PORT", value) == python_result("VLLM_PORT", value)


def test_cap_rules_expected_values():
    """The rules themselves, not just agreement: default 1, <=0 -> 1, >3 -> 3, malformed rejected."""
    expected = {
        "": "1",
        "   ": "1",
        " 2 ": "2",
        "010": "3",
        "+2": "2",
        "-1": "1",
        "0": "1",
        "4": "3",
        "2\r": "2",
        "123456789012345678901234567890": "3",
    }
    for value, canonical in expected.items():
        assert python_result("DSPARK_MAX_INFLIGHT_PREFILLS", value) == ("accept", canonical), value
    for value in ("2.0", "two", "1x", "0x10", "\u0663"):
        assert python_result("DSPARK_MAX_INFLIGHT_PREFILLS", value) == ("reject", None), value


def test_decimal_not_octal():
    assert python_result("MAX_NUM_SEQS", "010") == ("accept", "10")
    assert bash_result("MAX_NUM_SEQS", "010") == ("accept", "10")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=" \t\r+-.0123456789x\u0663e", max_size=8))
def test_random_values_agree(value):
    for name in ("DSPARK_MAX_INFLIGHT_PREFILLS", "GPU_MEMORY_UTILIZATION"):
        assert bash_result(name, value) == python_result(name, value)


def _source(env: dict[str, str], script: str = "") -> subprocess.CompletedProcess:
    code = f'set -euo pipefail\nsource "{REGISTRY_SH}"\necho "ok ${{DSPARK_MAX_INFLIGHT_PREFILLS-}}"\n{script}'
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env})


def test_alias_accepted_with_warning():
    proc = _source({"DSPARKMAXINFLIGHTPREFILLS": " 2"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok 2"
    assert "spell it DSPARK_MAX_INFLIGHT_PREFILLS" in proc.stderr


def test_alias_conflict_rejected_in_bash():
    proc = _source({"DSPARKMAXINFLIGHTPREFILLS": "2", "DSPARK_MAX_INFLIGHT_PREFILLS": "3"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "disagree" in proc.stderr


def test_alias_agreeing_values_accepted_in_bash():
    proc = _source({"DSPARKMAXINFLIGHTPREFILLS": "02", "DSPARK_MAX_INFLIGHT_PREFILLS": "2"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok 2"


def test_bash_error_is_one_line_naming_variable_value_and_range():
    proc = _source({"DSPARK_MAX_INFLIGHT_PREFILLS": "two"})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "DSPARK_MAX_INFLIGHT_PREFILLS=two" in lines[0] and "1..3" in lines[0] and "environment" in lines[0]


def test_sourcing_without_set_e_returns_2():
    code = f'source "{REGISTRY_SH}"; echo "rc=$?"'
    proc = subprocess.run(
        ["bash", "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "VLLM_PORT": "x"}
    )
    assert proc.stdout.strip() == "rc=2"


def test_bash_exports_canonical_values_for_children():
    proc = _source(
        {"MAX_NUM_SEQS": " 008 ", "GPU_MEMORY_UTILIZATION": "0.80"}, "printenv MAX_NUM_SEQS GPU_MEMORY_UTILIZATION"
    )
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[-2:] == ["8", "0.8"]


def test_every_knob_is_parsed_by_python():
    registry = load_registry()
    names = {k.name for k in registry.knobs}
    text = REGISTRY_SH.read_text()
    assert names == {line.split()[1] for line in text.splitlines() if line.startswith("dspark_knob ")}
    assert registry.aliases == {"DSPARKMAXINFLIGHTPREFILLS": "DSPARK_MAX_INFLIGHT_PREFILLS"}
    cap = registry.by_name()["DSPARK_MAX_INFLIGHT_PREFILLS"]
    assert (cap.default, cap.minimum, cap.maximum, cap.range_policy) == ("1", "1", "3", "soft")
    assert json.dumps([k.name for k in registry.knobs])
