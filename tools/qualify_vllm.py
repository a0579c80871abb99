"""Qualify a vLLM release for the launcher in one command (maintainers; not in the wheel).

    python -m tools.qualify_vllm 0.35.0 [--json FILE]

Fetches the release's CUDA wheel (`pip download --no-deps`, cached in $DSPARK_COMPAT_CACHE) and unpacks its
Python (tests/support/newest_vllm.py), then runs, on that release's own code on this CPU:

1. the hotfix's check and apply on its `scheduler.py` (a copy), then the compat tests (check, apply, compile,
   status, byte-identical revert, the padding guard on both first-chunk overrides, the step-aside and the
   unknown-padding refusals: tests/test_hotfix_releases_compat.py);
2. the randomized invariant check on its scheduler with the profile's drafter, the recipe-configuration
   tests and vLLM's own scheduler options beside the hotfix (tests/test_hotfix_on_newest_vllm.py);
3. the dry boot on its config code: every decision judged for every compute capability, `dspark plan`'s
   verdicts (tests/test_dry_boot_newest.py);
4. the memory rules against its own memory code (tests/test_memory_rules_vllm.py);

and prints one verdict table (exit 0 when every step passed). Steps 2 to 4 are the test modules `make test`
runs on the recommended release, pointed at the candidate (DSPARK_VLLM_UNDER_TEST). A release that passes
is added by moving `dspark_launch/node/vllm_releases.py` (RECOMMENDED, TESTED) and the hotfix's
SUPPORTED_RANGE where it lies outside it; the README's pin follows from vllm_releases.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]

#: (step, pytest arguments) run under the candidate; each is one row of the verdict.
TEST_STEPS = (
    (
        "compat tests (patch on the release's text)",
        ["-m", "compat", "tests/test_hotfix_releases_compat.py", "-k", "{version}"],
    ),
    ("randomized check, recipe tests, vLLM's options", ["-m", "not compat", "tests/test_hotfix_on_newest_vllm.py"]),
    ("dry boot (every decision judged)", ["-m", "not compat", "tests/test_dry_boot_newest.py"]),
    ("memory rules", ["-m", "not compat", "tests/test_memory_rules_vllm.py"]),
)


@dataclasses.dataclass(frozen=True)
class Verdict:
    step: str
    passed: bool
    seconds: float
    detail: str


def _patch_verdict(version: str) -> Verdict:
    from dspark_launch.hotfix import patch_tool
    from tests.support.newest_vllm import overlay_for

    started = time.monotonic()
    source = overlay_for(version) / "vllm"
    with tempfile.TemporaryDirectory(prefix="dspark-qualify-") as work:
        target = pathlib.Path(work) / "vllm" / "v1" / "core" / "sched" / "scheduler.py"
        target.parent.mkdir(parents=True)
        shutil.copyfile(source / "v1" / "core" / "sched" / "scheduler.py", target)
        shutil.copyfile(source / "_version.py", pathlib.Path(work) / "vllm" / "_version.py")
        checked = patch_tool.check(target)
        applied = patch_tool.apply(target) if checked.ok else checked
    detail = f"check {checked.code} ({checked.state}), apply {applied.code} ({applied.state}): {applied.message}"
    return Verdict("hotfix check + apply", checked.ok and applied.ok, time.monotonic() - started, detail)


def _pytest_verdict(version: str, step: str, args: list[str]) -> Verdict:
    from tests.support.newest_vllm import UNDER_TEST_ENV

    started = time.monotonic()
    env = dict(os.environ, **{UNDER_TEST_ENV: version})
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        "-o",
        "addopts=",
        *[a.format(version=version) for a in args],
    ]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in proc.stdout.strip().splitlines() if line.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-300:]
    return Verdict(step, proc.returncode == 0, time.monotonic() - started, summary)


def qualify(version: str) -> list[Verdict]:
    from tests.support.newest_vllm import overlay_for

    started = time.monotonic()
    try:
        root = overlay_for(version)
    except Exception as exc:  # noqa: BLE001 - the verdict names it; nothing else can run
        return [Verdict("wheel", False, time.monotonic() - started, f"{type(exc).__name__}: {exc}")]
    verdicts = [Verdict("wheel", True, time.monotonic() - started, str(root)), _patch_verdict(version)]
    for step, args in TEST_STEPS:
        verdicts.append(_pytest_verdict(version, step, args))
    return verdicts


def table(version: str, verdicts: list[Verdict]) -> str:
    width = max(len(v.step) for v in verdicts)
    rows = [
        f"vLLM {version}: {'QUALIFIED' if all(v.passed for v in verdicts) else 'NOT QUALIFIED'}",
        f"  {'step'.ljust(width)}  verdict  seconds  detail",
    ]
    for v in verdicts:
        rows.append(f"  {v.step.ljust(width)}  {'pass' if v.passed else 'FAIL':7}  {v.seconds:7.1f}  {v.detail}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.qualify_vllm", description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the vLLM release to qualify, e.g. 0.35.0")
    parser.add_argument("--json", dest="json_file", type=pathlib.Path, help="also write the verdicts here")
    args = parser.parse_args(argv)
    verdicts = qualify(args.version)
    print(table(args.version, verdicts))
    if args.json_file:
        args.json_file.write_text(
            json.dumps({"vllm": args.version, "verdicts": [dataclasses.asdict(v) for v in verdicts]}, indent=2) + "\n"
        )
    return 0 if all(v.passed for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
