"""DSPARK_ADMISSION_CLOSED on the real vLLM 0.32 `Scheduler` / `AsyncScheduler` (a patched copy of the installed
scheduler.py) and on the newest release's own scheduler (a child process): put in force through the control file as
`dspark reload` and the memory guard do, admission closed keeps every new prompt waiting while the running streams
decode every step, and opening it again admits them. The toy configuration and the recipe's at full scale
(tests/support/sched_configs.py); the scenario is tests/support/admission.py."""

from __future__ import annotations

import json

import pytest

from dspark_launch.hotfix import contract
from tests.support import admission
from tests.support.sched_configs import CONFIGS, TOY

SCHEDULERS = pytest.mark.parametrize("async_scheduling", [False, True], ids=["Scheduler", "AsyncScheduler"])
CHANGES = ["admission closed off -> on", "admission closed on -> off"]
# The file is looked at once a period: admitted within one period (and a step) of opening.
LATEST_ADMISSION = admission.OPEN_AT + int(contract.LIVE_CHECK_PERIOD_S / admission.STEP_S) + 1


def check(report: dict) -> None:
    assert report["unfinished"] == [] and report["held_steps"] > 20
    assert report["admitted_while_closed"] == [], "a new prompt was admitted while admission was closed"
    assert report["starved"] == [], "a running stream went without its token while admission was closed"
    assert admission.OPEN_AT <= report["admitted_at"] <= LATEST_ADMISSION
    assert report["changes"] == CHANGES


@CONFIGS
@SCHEDULERS
def test_admission_closed_holds_new_prompts_while_streams_decode(model_dir, tmp_path, async_scheduling, config):
    check(admission.run(config, async_scheduling, model_dir, tmp_path))


def test_the_newest_release_holds_new_prompts_the_same(tmp_path):
    from tests.support import newest_vllm

    release = newest_vllm.newest()
    cases = [{"config": TOY, "async_scheduling": asy} for asy in (False, True)]
    proc = newest_vllm.run_python(
        release,
        "from tests.support.admission import main; main()",
        json.dumps({"workdir": str(tmp_path), "cases": cases}),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 2 and all(r["vllm"] == release for r in reports), proc.stdout[-2000:]
    for report in reports:
        check(report)
