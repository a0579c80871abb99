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
        wrong = sorted(m for m in imported_modules(source)
                       if m.startswith("tests.test_") or m.startswith("test_") or m.startswith("conftest"))
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
