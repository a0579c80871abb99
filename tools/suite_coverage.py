"""Line coverage of `dspark_launch/` by the whole suite, every process counted (issue 31).

    python -m tools.suite_coverage run [--root TREE] [-- PYTEST_ARGS...]  # make test's pytest, under coverage
    python -m tools.suite_coverage report [--root TREE] [--json OUT]      # combine and report
    python -m tools.suite_coverage compare BEFORE AFTER [--json OUT]      # lines the suite no longer runs

TREE (default: this checkout) is the checkout whose suite runs and whose `dspark_launch/` is measured, with
its own venv (`TREE/.venv`): a before/after pair measures two commits with one tool.

Most of what the suite exercises runs outside pytest's process: the node agents (local children and over
SSH inside the testbed's namespaces, each with a clean environment), `vllm serve` and its EngineCore, the
CLI in subprocesses. `COVERAGE_PROCESS_START` does not survive those clean environments, so `run` puts a
`.pth` file in the venv that starts coverage in every interpreter of the venv while the run's rc file
exists (the testbed's nodes see the venv through an overlay, so theirs too), and removes both afterwards.
Processes inside the node containers (another interpreter) are not counted. Dev only: coverage.py is
installed into the venv on first use, never a dependency of the product or of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PTH_NAME = "zz_dspark_suite_coverage.pth"
STARTER_NAME = "_dspark_suite_coverage.py"

_STARTER = """# Written by tools/suite_coverage.py for one run; removed after it.
import os
_RC = {rc!r}
if os.path.exists(_RC):
    try:
        import coverage
        _cov = coverage.Coverage(config_file=_RC, data_suffix=True)
        _cov._warn_no_data = _cov._warn_unimported_source = _cov._warn_preimported_source = False
        _cov._auto_save = True  # saved at exit (and on SIGTERM: the rc's sigterm)
        _cov.start()
    except Exception:
        pass
"""


def _python(root: Path) -> str:
    return str(root / ".venv" / "bin" / "python")


def _site_packages(root: Path) -> Path:
    where = subprocess.run(
        [_python(root), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(where.stdout.strip())


def _parallel_args(python: str) -> list[str]:
    """make test's xdist arguments where the tree's venv has xdist; none (serial, as that tree's make test ran)
    for a tree from before the suite ran on two workers."""
    if subprocess.run([python, "-c", "import xdist"], capture_output=True).returncode:
        return []
    return ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]


def run(root: Path, pytest_args: list[str]) -> int:
    python, work = _python(root), root / ".coverage-run"
    rc = work / "rc"
    if subprocess.run([python, "-c", "import coverage"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "coverage>=7.4"], check=True)
    shutil.rmtree(work, ignore_errors=True)
    (work / "data").mkdir(parents=True)
    os.chmod(work / "data", 0o1777)  # processes of every node (all this machine's users) write their file
    rc.write_text(
        f"[run]\nparallel = True\ndata_file = {work / 'data' / 'cov'}\nsource = {root / 'dspark_launch'}\n"
        "sigterm = True\n"
    )
    site = _site_packages(root)
    (site / STARTER_NAME).write_text(_STARTER.format(rc=str(rc)))
    (site / PTH_NAME).write_text(f"import {STARTER_NAME[:-3]}\n")
    try:
        return subprocess.run(
            [python, "-m", "pytest", "-m", "not compat", *_parallel_args(python), *pytest_args], cwd=root
        ).returncode
    finally:
        rc.unlink(missing_ok=True)  # new interpreters stop measuring at once
        (site / PTH_NAME).unlink(missing_ok=True)
        (site / STARTER_NAME).unlink(missing_ok=True)


def report(root: Path, json_out: str | None) -> int:
    import coverage

    work, package_root = root / ".coverage-run", root / "dspark_launch"
    data_files = sorted(str(path) for path in (work / "data").glob("cov.*"))
    cov = coverage.Coverage(data_file=str(work / "combined"), source=[str(package_root)])
    cov.combine(data_files, keep=True)
    cov.save()
    total = cov.report(show_missing=False, skip_empty=True, file=open(os.devnull, "w"))
    packages: dict[str, list[int]] = {}
    data = cov.get_data()
    for path in data.measured_files():
        _, statements, _, missing, _ = cov.analysis2(path)
        package = Path(path).relative_to(package_root).parts[0].removesuffix(".py")
        counts = packages.setdefault(package, [0, 0])
        counts[0] += len(statements)
        counts[1] += len(statements) - len(missing)
    result = {
        "commit": _commit(root),
        "processes": len(data_files),
        "percent": round(total, 1),
        "packages": {
            name: {"statements": s, "covered": c, "percent": round(100 * c / s, 1) if s else 100.0}
            for name, (s, c) in sorted(packages.items())
        },
    }
    print(json.dumps(result, indent=2))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


Executed = dict[str, tuple[list[str], set[int], set[int]]]


def _executed(root: Path) -> Executed:
    """path under dspark_launch/ -> (its lines, its statements, the statements the suite ran), from `report`'s
    combined data of TREE's last run."""
    import coverage

    package_root = root / "dspark_launch"
    cov = coverage.Coverage(data_file=str(root / ".coverage-run" / "combined"), source=[str(package_root)])
    cov.load()
    files = {}
    for path in cov.get_data().measured_files():
        _, statements, _, missing, _ = cov.analysis2(path)
        files[str(Path(path).relative_to(package_root))] = (
            Path(path).read_text().splitlines(),
            set(statements),
            set(statements) - set(missing),
        )
    return files


@dataclass(frozen=True)
class LineChanges:
    compared: int  # statements run before whose line is unchanged and still a statement
    lost: dict[str, list[str]]  # module (after's name) -> "line: text" run before, not after
    gained: int  # unchanged statements run after and not before
    moved: dict[str, str]  # before's module -> after's module of the same file name


def line_changes(before: Executed, after: Executed) -> LineChanges:
    """Unchanged lines only (difflib's matching blocks map a line of BEFORE's module to AFTER's): a module in both
    trees, or moved (the module of the same file name elsewhere most like it, at least half the same). A line
    edited, or moved to another module, is not compared (the module totals are `report`'s)."""
    import difflib

    lost: dict[str, list[str]] = {}
    compared = gained = 0
    moved: dict[str, str] = {}
    for name, (old_lines, old_statements, old_ran) in sorted(before.items()):
        candidates = (
            [name]
            if name in after
            else [new_name for new_name in after if new_name not in before and Path(new_name).name == Path(name).name]
        )
        matchers = {
            new_name: difflib.SequenceMatcher(None, old_lines, after[new_name][0], autojunk=False)
            for new_name in candidates
        }
        if not matchers:
            continue
        target = max(matchers, key=lambda new_name: matchers[new_name].ratio())
        if target != name:
            if matchers[target].ratio() < 0.5:
                continue
            moved[name] = target
        new_lines, new_statements, new_ran = after[target]
        for block in matchers[target].get_matching_blocks():
            for offset in range(block.size):
                old_no, new_no = block.a + offset + 1, block.b + offset + 1
                if old_no in old_ran and new_no in new_statements:
                    compared += 1
                    if new_no not in new_ran:
                        lost.setdefault(target, []).append(f"{new_no}: {new_lines[new_no - 1].strip()}")
                elif new_no in new_ran and old_no in old_statements:
                    gained += 1
    return LineChanges(compared, lost, gained, moved)


def compare(before_root: Path, after_root: Path, json_out: str | None) -> int:
    """The statements BEFORE's suite ran that AFTER's does not, where the code is the same (`line_changes`)."""
    before, after = _executed(before_root), _executed(after_root)
    changes = line_changes(before, after)
    result = {
        "before": _commit(before_root),
        "after": _commit(after_root),
        "compared_statements": changes.compared,
        "lost": sum(len(lines) for lines in changes.lost.values()),
        "gained": changes.gained,
        "moved": changes.moved,
        "modules_only_before": sorted(set(before) - set(after) - set(changes.moved)),
        "lost_by_module": changes.lost,
    }
    print(json.dumps(result, indent=2))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _commit(root: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.suite_coverage")
    commands = parser.add_subparsers(dest="command", required=True)
    here = Path(__file__).resolve().parent.parent
    run_parser = commands.add_parser("run")
    run_parser.add_argument("--root", type=Path, default=here)
    run_parser.add_argument("pytest_args", nargs="*")
    report_parser = commands.add_parser("report")
    report_parser.add_argument("--root", type=Path, default=here)
    report_parser.add_argument("--json")
    compare_parser = commands.add_parser("compare")
    compare_parser.add_argument("before", type=Path)
    compare_parser.add_argument("after", type=Path)
    compare_parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.command == "compare":
        return compare(args.before.resolve(), args.after.resolve(), args.json)
    root = args.root.resolve()
    return run(root, args.pytest_args) if args.command == "run" else report(root, args.json)


if __name__ == "__main__":
    sys.exit(main())
