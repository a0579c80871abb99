"""Where things live, as a newcomer reads the checkout: test modules import the product and
tests/support only, never each other; tests/ holds tests and their support; the installed
package holds no benchmark and imports nothing of bench/ or tests/."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.support.paths import REPO

TESTS = REPO / "tests"


def imported_modules(source: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"), str(source))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_test_module_imports_another():
    offenders = {}
    for source in [*TESTS.glob("*.py"), *(TESTS / "support").rglob("*.py")]:
        wrong = sorted(
            m
            for m in imported_modules(source)
            if m.startswith("tests.test_") or m.startswith("test_") or m.startswith("conftest")
        )
        if wrong:
            offenders[str(source.relative_to(REPO))] = wrong
    assert not offenders, offenders


def test_tests_holds_only_tests_and_their_support():
    others = [p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py"]
    assert not others, f"not tests: {others} (support code goes to tests/support/, scripts to demo/ or bench/)"


def test_the_package_holds_no_benchmark_and_imports_nothing_of_the_checkout():
    package = REPO / "dspark_launch"
    assert not list(package.glob("bench/*.py"))
    offenders = {}
    for source in package.rglob("*.py"):
        wrong = sorted(m for m in imported_modules(source) if m.split(".")[0] in ("bench", "tests", "demo"))
        if wrong:
            offenders[str(source.relative_to(REPO))] = wrong
    assert not offenders, offenders
    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert found["include"] == ["dspark_launch*"]


def test_modules_run_loopback_then_serving_then_testbed_then_the_rest_each_kept_together():
    from types import SimpleNamespace

    from tests.support.suite_order import heavy_first

    def item(nodeid: str, *marks: str):
        return SimpleNamespace(nodeid=nodeid, iter_markers=lambda: [SimpleNamespace(name=m) for m in marks])

    items = [
        item("a.py::t1"),
        item("b.py::t1", "testbed"),
        item("c.py::t1"),
        item("c.py::t2", "testbed", "serving"),
        item("d.py::t1", "loopback"),
        item("b.py::t2"),
        item("e.py::t1", "testbed"),
    ]
    heavy_first(items)
    assert [i.nodeid for i in items] == [
        "d.py::t1",
        "c.py::t1",
        "c.py::t2",
        "b.py::t1",
        "b.py::t2",
        "e.py::t1",
        "a.py::t1",
    ]


def test_make_test_runs_a_module_at_a_time_in_the_suites_order():
    recipe = (REPO / "Makefile").read_text()
    line = next(l for l in recipe.splitlines() if '-m pytest -m "not compat and not stack"' in l)
    assert "--dist loadfile" in line and "--no-loadscope-reorder" in line and "-n $(PYTEST_WORKERS)" in line
