"""The README's sample start output (written by `python -m tools.readme_sample` from a real `make demo` run)
holds every phase line a healthy start prints: each `reporter.phase(...)` of the start's modules, read from
their source as a pattern, matches a line of the sample, unless it is listed below as a line a healthy
host-mode start never prints. A new phase line fails here until the sample is written again."""

from __future__ import annotations

import ast
import re

import pytest

from tests.support.paths import REPO
from tools.readme_sample import sample_lines

#: The modules a start runs through (host runtime, the demo's and the default).
START_MODULES = (
    "dspark_launch/serve/start.py",
    "dspark_launch/serve/warm_start.py",
    "dspark_launch/cluster/ray_cluster.py",
    "dspark_launch/cluster/hotfix_rollout.py",
)
#: Phase lines of those modules a healthy first start does not print, by a piece of their text, with why.
NOT_IN_A_HEALTHY_START = {
    "the Ray cluster is already up; reusing it": "a second start with Ray still up",
    "serving vLLM's own scheduler": "DSPARK_HOTFIX=off",
}
_TIMESTAMP = re.compile(r"^\[\s*[\d.]+s\] ")


def _pattern(node: ast.expr) -> str:
    """A regex for the text a phase argument produces: literal parts as they are, anything computed as `.*`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_pattern(part) if isinstance(part, ast.Constant) else ".*" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _pattern(node.left) + _pattern(node.right)
    return ".*"


def phase_patterns() -> list[tuple[str, str]]:
    found = []
    for module in START_MODULES:
        tree = ast.parse((REPO / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "phase"
                and node.args
            ):
                found.append((f"{module}:{node.lineno}", _pattern(node.args[0])))
    return found


def test_the_start_modules_report_phases():
    assert len(phase_patterns()) >= 15


@pytest.mark.parametrize(("where", "pattern"), phase_patterns(), ids=[w for w, _ in phase_patterns()])
def test_every_phase_line_of_a_healthy_start_is_in_the_readme_sample(where, pattern):
    if any(re.escape(piece) in pattern for piece in NOT_IN_A_HEALTHY_START):
        return
    lines = [_TIMESTAMP.sub("", line) for line in sample_lines((REPO / "README.md").read_text(encoding="utf-8"))]
    assert lines, "README.md has no generated start sample: python -m tools.readme_sample"
    assert any(re.fullmatch(pattern, line) for line in lines), (
        f"{where} prints a phase line the README's sample does not show ({pattern}): python -m tools.readme_sample"
    )
