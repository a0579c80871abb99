"""Gate mode 4: mode 3's prefill room sized in time. The controller is driven by the harness's modelled clock
(`scheduler_harness.ModelledClock`): the fake model runner advances it by the benchmark's step cost, so what the
controller measures between two `schedule()` calls is deterministic. Sync and async scheduling (two steps in
flight), the recipe's scale with MTP and 1/16; a cost that doubles mid-run, noisy step times, a target below
one block's cost, no decoder, an implausible fit, the diagnostics line, and the same on the newest vLLM
release's own scheduler (a child process)."""

from __future__ import annotations

import inspect
import json
import logging
import re
from fractions import Fraction

import pytest

from dspark_launch.hotfix import contract, injected
from tests.support import time_bound as tb
from tools import scheduler_harness as h

TARGET = 250.0
#: Scale, async scheduling, MTP: the recipe as served, and 1/16 sync without drafts.
CASES = [(Fraction(1), True, True), (Fraction(1, 16), False, False)]
IDS = ["recipe-async-mtp", "sixteenth-sync"]


@pytest.fixture(scope="module")
def runs(model_dir) -> dict:
    """The plain runs, once per case (the recipe's scale costs about 20 s a run here)."""
    return {case: tb.run(*case, TARGET, model_dir) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_mixed_steps_stay_within_the_target_once_the_fit_holds(runs, case):
    report = runs[case]
    assert report["finished"] == report["requests"]
    fitted = tb.fitted_from(report)
    # The first fit (every term but decode tokens) from a few samples, one a step (async: from the second call on).
    assert fitted <= contract.TIME_FIT_FIRST_SAMPLES + 4
    steps = tb.mixed(report, fitted)
    assert len(steps) > 20
    assert max(s["ms"] for s in steps) <= 1.02 * TARGET  # the modelled cost is linear in the fit's features
    # The time bound lets more prefill through than mode 3's token bound where the target allows it...
    assert max(s["prefill"] for s in steps) > report["bound"]
    # ...and the steps are not left half empty: the median mixed step with a full room is near the target.
    full = [s["ms"] for s in steps if s["room"] is not None and s["prefill"] >= s["room"]]
    assert full and h.percentile(full, 50) >= 0.9 * TARGET


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_until_the_fit_holds_mode_3s_bound_applies(runs, case):
    report = runs[case]
    before = [s for s in report["steps"] if s["step"] < tb.fitted_from(report) and s["decoders"]]
    assert before and all(s["prefill"] <= report["bound"] for s in before)
    assert all(s["samples"] < contract.TIME_FIT_FIRST_SAMPLES or s["fitted"] for s in report["steps"])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_fit_follows_a_cost_that_doubles_mid_run(model_dir, case):
    scale = case[0]
    load = tb.load(scale) + [
        h.RequestSpec(f"late-{i}", 0, max(2, int(2000 * scale)), 8, arrival_ms=9000.0 + 500 * i) for i in range(30)
    ]
    change = 60
    report = tb.run(*case, TARGET, model_dir, factor_from=change, factor=2.0, workload=load)
    assert report["finished"] == report["requests"]
    after = tb.mixed(report, change + contract.TIME_FIT_WINDOW + 2)
    assert len(after) > 10 and max(s["ms"] for s in after) <= 1.02 * TARGET
    plain = tb.run(*case, TARGET, model_dir, workload=load)
    # Every cost doubled: the fit over the new window explains the new step times exactly.
    assert float(re.search(r"err=([0-9.]+)", report["note"]).group(1)) <= 0.01
    # The room shrinks to fit: half the prefill of the plain run's steps in the same place of the load.
    rooms = [s["room"] for s in after if s["room"]]
    assert max(rooms) < max(s["room"] or 0 for s in tb.mixed(plain, change + contract.TIME_FIT_WINDOW + 2))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_noisy_step_times_keep_the_mean_step_at_the_target(model_dir, case):
    report = tb.run(*case, TARGET, model_dir, noise=0.15, seed=3)
    assert report["finished"] == report["requests"]
    steps = tb.mixed(report, tb.fitted_from(report))
    costs = [s["ms"] for s in steps]  # the noise-free cost of what the controller chose
    assert h.percentile(costs, 99) <= 1.12 * TARGET
    assert "err=" in report["note"] and report["fit"]  # still a plausible fit under 15 % noise


def test_async_steps_are_attributed_two_calls_back(model_dir):
    """With two steps in flight the interval that ends at a call is the step scheduled two calls before it;
    taken for the previous step's, the fit is off and the steps overshoot."""
    case = CASES[0]
    right = tb.run(*case, TARGET, model_dir)
    assert right["lag"] == 2
    wrong = tb.run(*case, TARGET, model_dir, lag=1)
    err = [float(re.search(r"err=([0-9.]+)", r["note"]).group(1)) for r in (right, wrong)]
    assert err[0] <= 0.01 < err[1]
    over = [s["ms"] for s in tb.mixed(wrong, tb.fitted_from(wrong))]
    assert max(over) > 1.02 * TARGET


def test_sync_steps_are_attributed_to_the_previous_call(model_dir):
    report = tb.run(Fraction(1, 16), False, False, TARGET, model_dir)
    assert report["lag"] == 1
    assert float(re.search(r"err=([0-9.]+)", report["note"]).group(1)) <= 0.01


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_target_below_one_block_still_gives_a_block_a_step(model_dir, case):
    """Every step then carries one block: a window of one prefill size cannot tell the prefill cost from the
    constant, and the last fit stands (it fell back to mode 3's bound before)."""
    report = tb.run(*case, 20.0, model_dir)
    assert report["finished"] == report["requests"]  # every prompt progressed
    rooms = [s["room"] for s in report["steps"] if s["room"] is not None]
    assert rooms and min(rooms) == report["block"]
    late = tb.mixed(report, tb.fitted_from(report))
    assert late and all(s["prefill"] <= report["block"] for s in late)


def test_with_no_decoder_a_prompt_runs_at_vllms_own_speed(model_dir):
    scale = Fraction(1, 16)
    load = [h.RequestSpec("doc", 0, int(20000 * scale), 4)]
    report = tb.run(scale, False, False, TARGET, model_dir, workload=load)
    assert [s["prefill"] for s in report["steps"][:2]] == [report["budget"], report["budget"]]


def test_an_implausible_fit_falls_back_to_mode_3s_bound(model_dir):
    """A step time that does not grow with prefill: no prefill cost to fit, mode 3's bound stays."""
    report = tb.run(Fraction(1, 16), False, False, TARGET, model_dir, cost=lambda record, scale: 30.0)
    assert report["finished"] == report["requests"]
    assert "implausible n=" in report["note"] and not report["fit"]
    assert all(s["prefill"] <= report["bound"] for s in report["steps"] if s["decoders"])


def test_the_diagnostics_line_shows_the_target_room_and_fit(model_dir, caplog):
    caplog.set_level(logging.INFO)
    report = tb.run(Fraction(1, 16), False, False, TARGET, model_dir, diag=True)
    lines = [r.getMessage() for r in caplog.records if "dspark-issue27 step=" in r.getMessage()]
    assert lines and all(" target_ms=250 " in line for line in lines)
    # period_ms: with sync scheduling the time between two lines is the step scheduled in between
    periods = [re.search(r" period_ms=(\S+)$", line).group(1) for line in lines]
    assert periods[0] == "-" and len(periods) == len(report["steps"])
    steps_ms = [step["ms"] for step in report["steps"]]
    matched = sum(abs(float(p) - ms) <= 0.06 for p, ms in zip(periods[1:], steps_ms))
    assert matched >= 0.9 * (len(periods) - 1), list(zip(periods[1:], steps_ms))[:20]
    assert any(
        re.search(r" room=\d+ target_ms=250 fit=\[n=\d+ base=[0-9.]+ms prefill=[0-9.e-]+ms/tok .* err=", line)
        for line in lines
    )
    assert "fit=[warming 0/%d]" % contract.TIME_FIT_FIRST_SAMPLES in lines[0]
    first = " fit=[n=%d/%d base=" % (contract.TIME_FIT_FIRST_SAMPLES, contract.TIME_FIT_MIN_SAMPLES)
    assert any(first in line for line in lines)  # the first fit says how far the full fit is


def test_the_controller_reads_time_through_one_function():
    body = inspect.getsource(injected).split("# ---- INJECTED BODY")[1]
    timed = [
        name
        for name, fn in vars(injected).items()
        if name.startswith("_dspark_hotfix_")
        and name != "_dspark_hotfix_now"
        and callable(fn)
        and "_dspark_hotfix_now()" in inspect.getsource(fn)
    ]
    assert sorted(timed) == ["_dspark_hotfix_diag", "_dspark_hotfix_tick"]
    assert body.count("_dspark_hotfix_time.monotonic()") == 2  # the clock function and the control file's period
    assert "return _dspark_hotfix_time.monotonic()" in inspect.getsource(injected._dspark_hotfix_now)


def test_the_newest_release_holds_the_target(tmp_path):
    """The same controller on the newest vLLM release's scheduler (its own waiting loop), sync and async, and the
    slot lent to a turn that finishes within two steps."""
    from tests.support import newest_vllm

    release = newest_vllm.newest()
    cases = [{"scale": "1/16", "async_scheduling": asy, "mtp": False, "target_ms": TARGET} for asy in (False, True)]
    # The slot lent to a turn, in the recipe's configuration (async scheduling, MTP 5, the recipe's scale).
    cases.append({"scale": "1", "async_scheduling": True, "mtp": True, "target_ms": 80.0, "workload": "turns"})
    proc = newest_vllm.run_python(
        release,
        "from tests.support.time_bound import main; main()",
        json.dumps({"workdir": str(tmp_path), "cases": cases}),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 3
    lending = reports.pop()
    assert lending["vllm"] == release and lending["finished"] == lending["requests"]
    assert max(len(s["mid"]) for s in lending["steps"]) == 2  # the slot a document mid-prefill lends a turn
    turns = tb.borrowed(lending)
    assert len(turns) >= 3 and all(steps <= 2 and first for _, steps, first in turns), turns
    for report in reports:
        assert report["vllm"] == release and report["finished"] == report["requests"]
        steps = tb.mixed(report, tb.fitted_from(report))
        assert steps and max(s["ms"] for s in steps) <= 1.02 * TARGET
        assert max(s["prefill"] for s in steps) > report["bound"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_prompt_that_finishes_within_two_steps_borrows_the_slot_of_a_longer_one(model_dir, case):
    """Cap 1, a document mid-prefill, and a conversation's turns whose uncached part is more than one step's
    room at 80 ms but within two: each turn starts beside the document in the slot it lends (two prompts
    mid-prefill, never three) and has its first token within two steps, not once the document is done."""
    report = tb.run(*case, 80.0, model_dir, workload=tb.turns_load(case[0]))
    assert report["cap"] == 1 and report["finished"] == report["requests"]
    assert max(len(s["mid"]) for s in report["steps"]) == 2
    turns = tb.borrowed(report)
    assert len(turns) >= 3 and all(steps <= 2 and first for _, steps, first in turns), turns
