"""Deliberate breaks: each one a small edit that breaks a promise the suite must keep, run against the tests that
should catch it, in a copy of the tree (the checkout is never edited).

    python -m tools.deliberate_breaks [--json PATH] [--only NAME ...]
    python -m tools.deliberate_breaks --root TREE --before [--json PATH]   # the same breaks in BEFORE's suite

A break is caught when its tests fail; the unbroken copy must pass the same tests first, so a break counted as
caught is not a test that fails anyway. The tests named are the fast ones (no testbed): the suite's testbed
lives catch some of these again, at minutes each. Exit 1 if a break is missed or a control run fails.

`--before` runs each break against `before_tests`, its catchers in the suite issue 31 started from (BEFORE, a
checkout of that commit with its own venv as TREE): the code each break edits is the same there; the tests that
catch it were partly testbed lives then (the rollback one needs that tree's testbed: run nothing beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "2e6a4f9"  # the suite before issue 31 (977 tests, about 42 minutes)


@dataclass(frozen=True)
class Break:
    name: str
    promise: str  # what an operator relies on that the edit breaks
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    before_tests: tuple[str, ...]


BREAKS: tuple[Break, ...] = (
    Break(
        "refused-flag-accepted",
        "a launcher-owned vllm serve flag in VLLM_EXTRA_ARGS is refused (exit 2)",
        "dspark_launch/config/serve_flags.py",
        "        owner = _owner(word)\n",
        "        owner = None\n",
        ("tests/test_security_config.py", "tests/test_config_settings.py"),
        ("tests/test_security_config.py", "tests/test_config_settings.py"),
    ),
    Break(
        "drift-missed",
        "status and restart see a setting changed since the server started",
        "dspark_launch/serve/status.py",
        "if started_with.get(name) != value\n",
        "if False and started_with.get(name) != value\n",
        ("tests/test_secret_digest.py", "tests/test_reload.py", "tests/test_restart_kind.py"),
        ("tests/test_reload.py", "tests/test_restart_kind.py"),
    ),
    Break(
        "rollback-skipped",
        "a bring-up that fails stops every process it started, on every node",
        "dspark_launch/cluster/ray_cluster.py",
        "        results = on_each([self.spec.node(name) for name in self.records], stop_one)\n",
        "        results = {}\n",
        ("tests/test_bringup_decisions.py",),
        ("tests/test_cluster.py::test_hotfix_refused_rolls_back_both_nodes",),
    ),
    Break(
        "secret-printed",
        "plan shows a secret as set/unset, never its value",
        "dspark_launch/serve/plan_report.py",
        '("set" if value else "unset") if secret else value',
        "value",
        ("tests/test_operator_tools.py", "tests/test_profiles_plan.py", "tests/test_secret_digest.py"),
        ("tests/test_operator_tools.py", "tests/test_profiles_plan.py"),
    ),
)


@dataclass(frozen=True)
class Outcome:
    name: str
    promise: str
    control_passed: bool
    caught: bool
    failed_tests: tuple[str, ...]
    seconds: float


def _copy_tree(root: Path, into: Path) -> Path:
    tree = into / "tree"
    shutil.copytree(
        root,
        tree,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".demo", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache", ".coverage-run", "bench"
        ),
    )
    return tree


def _run_tests(python: str, tree: Path, tests: tuple[str, ...]) -> tuple[int, tuple[str, ...]]:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'tests' / 'vllm_ray_cpu_plugin'}")
    proc = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not compat", "-rf", *tests],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    failed = tuple(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED "))
    return proc.returncode, failed


def _try(brk: Break, root: Path, before: bool, workdir: Path) -> Outcome:
    started = time.monotonic()
    tree = _copy_tree(root, workdir / brk.name)
    venv_python = root / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.exists() else sys.executable
    tests = brk.before_tests if before else brk.tests
    control_rc, _ = _run_tests(python, tree, tests)
    target = tree / brk.path
    text = target.read_text()
    if text.count(brk.old) != 1:
        raise SystemExit(
            f"deliberate_breaks: {brk.name}: the text to break occurs {text.count(brk.old)} times in "
            f"{brk.path}; allowed: exactly once (update the break)"
        )
    target.write_text(text.replace(brk.old, brk.new))
    broken_rc, failed = _run_tests(python, tree, tests)
    return Outcome(
        brk.name,
        brk.promise,
        control_rc == 0,
        broken_rc != 0 and bool(failed),
        failed,
        round(time.monotonic() - started, 1),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the outcomes here")
    parser.add_argument("--only", nargs="*", default=(), help="break names to run (default: all)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to break (a copy of it; default: this)")
    parser.add_argument(
        "--before",
        action="store_true",
        help=f"run each break's catchers as they were in {BEFORE}'s suite (with --root: a checkout of "
        "it; without: the same tests in this checkout)",
    )
    args = parser.parse_args(argv)
    chosen = [b for b in BREAKS if not args.only or b.name in args.only]
    with tempfile.TemporaryDirectory(prefix="dspark-breaks-") as tmp:
        outcomes = [_try(brk, args.root.resolve(), args.before, Path(tmp)) for brk in chosen]
    for o in outcomes:
        verdict = "caught" if o.caught else "MISSED"
        control = "" if o.control_passed else " (control run FAILED: the verdict means nothing)"
        print(f"{o.name}: {verdict} by {len(o.failed_tests)} test(s) in {o.seconds} s{control}")
        for test in o.failed_tests[:5]:
            print(f"    {test}")
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    return 0 if all(o.caught and o.control_passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
