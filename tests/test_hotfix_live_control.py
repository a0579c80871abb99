"""The control file changes the hotfix's values while the real vLLM 0.32
`Scheduler` / `AsyncScheduler` runs (a patched copy of the installed scheduler.py).

The patched module's clock is replaced by one the test advances per step, so "at most one stat a
period" is exercised without waiting for real seconds.

Each test that drives steps runs in the toy configuration and in the recipe's, at full scale
(tests/support/sched_configs.py): token counts follow the threshold.
"""

from __future__ import annotations

import logging
import os
import sys

import pytest

from dspark_launch.hotfix import contract
from tests.support import sched_configs as sc
from tests.support.sched_configs import CONFIGS, TOY, tokens
from tools import scheduler_harness as h

SCHEDULERS = pytest.mark.parametrize("async_scheduling", [False, True], ids=["Scheduler", "AsyncScheduler"])
STEP_S = 0.25  # modelled seconds per schedule() call: a period is 4 steps


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class CountingOs:
    """The patched module's `os`, counting `stat` calls."""

    def __init__(self):
        self.stats = 0

    def stat(self, *args, **kwargs):
        self.stats += 1
        return os.stat(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(os, name)


@pytest.fixture
def clock(monkeypatch, model_dir):
    h.patched_scheduler_classes()  # loads the patched module
    fake = Clock()
    monkeypatch.setattr(sys.modules[h.PATCHED_MODULE_NAME], "_dspark_hotfix_time", fake)
    return fake


def spec(control, async_scheduling=False, cap=1, config=TOY, **kw) -> h.SchedulerSpec:
    return sc.spec(
        config,
        cap=cap,
        async_scheduling=async_scheduling,
        extra_env=((contract.ENV_CONTROL, None if control is None else str(control)),),
        **kw,
    )


def bound(base: h.SchedulerSpec, cap: int) -> int:
    return cap * base.long_prefill_token_threshold + base.long_prefill_token_threshold // 2


def write(path, **values: str) -> None:
    """As `dspark reload` does: a new 0600 file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(contract.control_text(values))
    tmp.chmod(0o600)
    os.replace(tmp, path)


def wave(base: h.SchedulerSpec, n_wave=8) -> list[h.RequestSpec]:
    return h.wave_workload(
        n_streams=sc.stream_count(base, 4),
        stream_prompt=tokens(base, 48),
        stream_tokens=sc.outputs(base, 160),
        n_wave=n_wave,
        wave_prompt=tokens(base, 1500),
        wave_tokens=16,
    )


def live_lines(caplog) -> list[contract.LiveLine]:
    return contract.parse_live_lines("\n".join(r.getMessage() for r in caplog.records))


def control_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and contract.LIVE_WARNING_RE.search(r.getMessage())
    ]


@CONFIGS
@SCHEDULERS
def test_the_control_file_changes_the_cap_between_steps(model_dir, clock, tmp_path, caplog, async_scheduling, config):
    caplog.set_level(logging.INFO)
    control = tmp_path / "control"
    written_at = {}

    def step(sched, index):
        clock.now += STEP_S
        if index == 12:
            write(control, DSPARK_MAX_INFLIGHT_PREFILLS="2")
            written_at["step"] = index

    base = spec(control, async_scheduling, config=config)
    sched = h.build_scheduler(base, model_dir)
    run = h.run_workload(base, wave(base), model_dir, scheduler=sched, before_schedule=step)

    assert not run.unfinished
    per_step = [len(s.mid_prefill) for s in run.steps]
    assert max(per_step[:12]) == 1  # the start value, binding
    changed = next(i for i, n in enumerate(per_step) if n == 2)
    # Read at the first check after the write: within one period (4 steps) of it.
    assert written_at["step"] <= changed <= written_at["step"] + int(contract.LIVE_CHECK_PERIOD_S / STEP_S)
    assert max(per_step) == 2
    assert sched._dspark_max_inflight_prefills == 2
    lines = live_lines(caplog)
    assert [(line.changes, line.cap) for line in lines] == [("cap 1 -> 2", 2)], lines
    assert any("cap 1 -> 2 (live)" in r.getMessage() for r in caplog.records)
    # Mode 2's step bound follows the cap.
    assert sched._dspark_step_bound == lines[0].step_bound == bound(base, 2)
    assert control_warnings(caplog) == []


@CONFIGS
@SCHEDULERS
def test_a_malformed_value_is_ignored_with_one_warning(model_dir, clock, tmp_path, caplog, async_scheduling, config):
    caplog.set_level(logging.INFO)
    control = tmp_path / "control"

    def step(sched, index):
        clock.now += STEP_S
        if index == 4:
            write(control, DSPARK_MAX_INFLIGHT_PREFILLS="two", DSPARK_PREFILL_GATE_MODE="1")
        if index in (12, 20):  # the same content again: a new file, no second warning
            write(control, DSPARK_MAX_INFLIGHT_PREFILLS="two", DSPARK_PREFILL_GATE_MODE="1")

    base = spec(control, async_scheduling, config=config)
    sched = h.build_scheduler(base, model_dir)
    run = h.run_workload(base, wave(base), model_dir, scheduler=sched, before_schedule=step)

    assert not run.unfinished
    assert run.max_concurrent_partial_prefills() == 1
    # Nothing of the file applied: not even its valid gate mode.
    assert (sched._dspark_max_inflight_prefills, sched._dspark_gate_mode) == (1, contract.DEFAULT_GATE_MODE)
    warnings = control_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "DSPARK_MAX_INFLIGHT_PREFILLS='two'" in warnings[0] and "keeping cap 1," in warnings[0]
    assert live_lines(caplog) == []

    write(control, DSPARK_MAX_INFLIGHT_PREFILLS="3")  # a good file afterwards applies
    clock.now += contract.LIVE_CHECK_PERIOD_S
    sched.schedule()
    assert sched._dspark_max_inflight_prefills == 3
    assert [line.changes for line in live_lines(caplog)] == ["cap 1 -> 3"]


@pytest.mark.parametrize(
    "content",
    [
        "DSPARK_MAX_INFLIGHT_PREFILLS=2\nVLLM_PORT=9000\n",  # not a live name
        "DSPARK_MAX_INFLIGHT_PREFILLS 2\n",  # not NAME=VALUE
        "DSPARK_PREFILL_GATE_MODE=7\n",  # not a mode
        "DSPARK_PREFILL_AGING=-1\n",  # not an aging factor
        "x" * (contract.CONTROL_MAX_BYTES + 1),
    ],
)
def test_a_file_it_does_not_accept_keeps_every_value(model_dir, clock, tmp_path, caplog, content):
    caplog.set_level(logging.INFO)
    control = tmp_path / "control"
    control.write_text(content)
    control.chmod(0o600)
    sched = h.build_scheduler(spec(control), model_dir)
    assert (sched._dspark_max_inflight_prefills, sched._dspark_gate_mode) == (1, contract.DEFAULT_GATE_MODE)
    assert len(control_warnings(caplog)) == 1 and live_lines(caplog) == []


@CONFIGS
def test_a_file_others_can_write_or_a_link_is_refused(model_dir, clock, tmp_path, caplog, config):
    caplog.set_level(logging.INFO)
    control = tmp_path / "control"
    control.write_text("DSPARK_MAX_INFLIGHT_PREFILLS=2\n")
    control.chmod(0o622)
    sched = h.build_scheduler(spec(control, config=config), model_dir)
    assert sched._dspark_max_inflight_prefills == 1
    assert "only it can write" in control_warnings(caplog)[0]

    real = tmp_path / "elsewhere"
    real.write_text("DSPARK_MAX_INFLIGHT_PREFILLS=3\n")
    real.chmod(0o600)
    control.unlink()
    control.symlink_to(real)
    clock.now += contract.LIVE_CHECK_PERIOD_S
    sched.schedule()
    assert sched._dspark_max_inflight_prefills == 1
    assert "cannot open it" in control_warnings(caplog)[-1]


@CONFIGS
def test_no_file_means_the_start_values(model_dir, clock, tmp_path, caplog, config):
    """No file at start: the environment's values; a file removed later: back to them."""
    caplog.set_level(logging.INFO)
    control = tmp_path / "control"
    base = spec(control, cap=2, config=config)
    sched = h.build_scheduler(base, model_dir)
    assert (sched._dspark_max_inflight_prefills, sched._dspark_gate_mode, sched._dspark_diag) == (
        2,
        contract.DEFAULT_GATE_MODE,
        False,
    )
    write(control, DSPARK_MAX_INFLIGHT_PREFILLS="1", DSPARK_PREFILL_GATE_MODE="1", DSPARK_ISSUE43_SCHED_DIAG="1")
    clock.now += contract.LIVE_CHECK_PERIOD_S
    sched.schedule()
    assert (sched._dspark_max_inflight_prefills, sched._dspark_gate_mode, sched._dspark_diag) == (1, 1, True)
    assert sched._dspark_step_bound == bound(base, 1)
    control.unlink()
    clock.now += contract.LIVE_CHECK_PERIOD_S
    sched.schedule()
    assert (sched._dspark_max_inflight_prefills, sched._dspark_gate_mode, sched._dspark_diag) == (
        2,
        contract.DEFAULT_GATE_MODE,
        False,
    )
    assert [line.changes for line in live_lines(caplog)] == [
        f"cap 2 -> 1, gate mode {contract.DEFAULT_GATE_MODE} -> 1, diagnostics off -> on",
        f"cap 1 -> 2, gate mode 1 -> {contract.DEFAULT_GATE_MODE}, diagnostics on -> off",
    ]
    assert control_warnings(caplog) == []


def test_a_name_the_file_leaves_out_keeps_its_start_value(model_dir, clock, tmp_path):
    control = tmp_path / "control"
    write(control, DSPARK_PREFILL_GATE_MODE="0")
    sched = h.build_scheduler(spec(control, cap=3), model_dir)  # a file already there applies at once
    assert (sched._dspark_max_inflight_prefills, sched._dspark_gate_mode, sched._dspark_step_bound) == (3, 0, 0)


@CONFIGS
def test_mode_3s_aging_changes_live_and_goes_back_without_the_file(model_dir, clock, tmp_path, caplog, config):
    """DSPARK_PREFILL_AGING is live too: parsed as at start, in the log line, the start value again when the
    file goes."""
    caplog.set_level(logging.INFO)
    control = tmp_path / "control"
    sched = h.build_scheduler(spec(control, config=config), model_dir)
    assert sched._dspark_aging == contract.DEFAULT_AGING
    write(control, DSPARK_PREFILL_AGING="4.5")
    clock.now += contract.LIVE_CHECK_PERIOD_S
    sched.schedule()
    assert sched._dspark_aging == 4.5
    control.unlink()
    clock.now += contract.LIVE_CHECK_PERIOD_S
    sched.schedule()
    assert sched._dspark_aging == contract.DEFAULT_AGING
    lines = live_lines(caplog)
    assert [line.changes for line in lines] == [
        f"aging {contract.DEFAULT_AGING:g} -> 4.5",
        f"aging 4.5 -> {contract.DEFAULT_AGING:g}",
    ]
    assert [line.aging for line in lines] == [4.5, contract.DEFAULT_AGING]
    assert control_warnings(caplog) == []


@CONFIGS
def test_at_most_one_stat_per_period(model_dir, clock, tmp_path, monkeypatch, config):
    control = tmp_path / "control"
    base = spec(control, config=config)
    sched = h.build_scheduler(base, model_dir)
    counting = CountingOs()
    monkeypatch.setattr(sys.modules[h.PATCHED_MODULE_NAME], "_dspark_hotfix_os", counting)
    steps = 0

    def step(_sched, _index):
        nonlocal steps
        steps += 1
        clock.now += 0.05

    run = h.run_workload(base, wave(base, n_wave=4), model_dir, scheduler=sched, before_schedule=step)
    assert not run.unfinished and steps > 100
    assert 0 < counting.stats <= steps * 0.05 / contract.LIVE_CHECK_PERIOD_S + 1


@CONFIGS
def test_without_the_variable_no_file_is_ever_looked_at(model_dir, clock, monkeypatch, config):
    unset = spec(None, config=config)
    sched = h.build_scheduler(unset, model_dir)
    counting = CountingOs()
    monkeypatch.setattr(sys.modules[h.PATCHED_MODULE_NAME], "_dspark_hotfix_os", counting)
    clock.now += 10
    h.run_workload(unset, wave(unset, n_wave=2), model_dir, scheduler=sched)
    assert counting.stats == 0
