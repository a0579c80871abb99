"""DSPARK_ADMISSION_CLOSED on the real vLLM 0.32 `Scheduler` / `AsyncScheduler` (a patched copy of the installed
scheduler.py): put in force through the control file as `dspark reload` and the memory guard do, admission closed
keeps every new prompt waiting while the running streams decode every step, and opening it again admits them.
In the toy configuration and the recipe's at full scale (tests/support/sched_configs.py)."""

from __future__ import annotations

import logging
import os
import sys

import pytest

from dspark_launch.hotfix import contract
from tests.support import sched_configs as sc
from tests.support.sched_configs import CONFIGS, tokens
from tools import scheduler_harness as h

SCHEDULERS = pytest.mark.parametrize("async_scheduling", [False, True], ids=["Scheduler", "AsyncScheduler"])
STEP_S = 0.25  # modelled seconds per schedule() call: the control file is looked at every 4 steps
CLOSE_AT, OPEN_AT = 2, 40


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch, model_dir):
    h.patched_scheduler_classes()  # loads the patched module
    fake = Clock()
    monkeypatch.setattr(sys.modules[h.PATCHED_MODULE_NAME], "_dspark_hotfix_time", fake)
    return fake


def write(path, **values: str) -> None:
    """As `dspark reload` and the memory guard do: a new 0600 file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(contract.control_text(values))
    tmp.chmod(0o600)
    os.replace(tmp, path)


@CONFIGS
@SCHEDULERS
def test_admission_closed_holds_new_prompts_while_streams_decode(model_dir, clock, tmp_path, caplog,
                                                                 async_scheduling, config):
    caplog.set_level(logging.INFO)
    control = tmp_path / "control"

    def step(sched, index):
        clock.now += STEP_S
        if index == CLOSE_AT:
            write(control, DSPARK_ADMISSION_CLOSED="1")
        if index == OPEN_AT:
            write(control, DSPARK_ADMISSION_CLOSED="0")

    base = sc.spec(config, cap=1, async_scheduling=async_scheduling,
                   extra_env=((contract.ENV_CONTROL, str(control)),))
    streams = sc.stream_count(base, 4)
    workload = h.wave_workload(n_streams=streams, stream_prompt=tokens(base, 48), stream_tokens=sc.outputs(base, 160),
                               n_wave=4, wave_prompt=tokens(base, 600), wave_tokens=8, wave_step=8)
    sched = h.build_scheduler(base, model_dir)
    run = h.run_workload(base, workload, model_dir, scheduler=sched, before_schedule=step)

    assert not run.unfinished
    waves = {r.req_id for r in workload if r.req_id.startswith("wave-")}
    held = [s for s in run.steps if 8 <= s.step < OPEN_AT]
    assert held and not any(waves & s.scheduled.keys() for s in held), "a new prompt was admitted while closed"
    # The streams decode every step while admission is closed (each running one is scheduled every step).
    done: set[str] = set().union(*(s.finished for s in run.steps if s.step < 8))
    for record in held:
        assert set(h.stream_ids(workload)) - done <= record.scheduled.keys(), record
        done |= record.finished
    admitted = min(s.step for s in run.steps if waves & s.scheduled.keys())
    assert OPEN_AT <= admitted <= OPEN_AT + int(contract.LIVE_CHECK_PERIOD_S / STEP_S) + 1
    changes = [line.changes for line in contract.parse_live_lines("\n".join(r.getMessage() for r in caplog.records))]
    assert changes == ["admission closed off -> on", "admission closed on -> off"], changes
