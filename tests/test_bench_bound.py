"""The lower bounds (`bench/scheduler_bound.py`) hold for real schedules:
no run of the real vLLM 0.32 `Scheduler`, under any policy, gives a prompt of
the bounded class a first token sooner than the bound allows with that run's
own long-prompt times as the deadlines. Modelled time, deterministic; CI size."""

from __future__ import annotations

import functools
from fractions import Fraction

import pytest

from bench import scheduler_bound as bound  # bench/, outside the package
from bench.scheduler import metrics, policies, workloads
from tools import scheduler_harness as h

SCALE = Fraction(1, 64)
POLICIES = (
    policies.stock_policies()[1],
    policies.hotfix(1, policies.V2_MODE),
    policies.hotfix(1, 2),
    policies.hotfix(2, 2),
)
LOADS = [load for load in workloads.suite(SCALE, "ci") if load.kind in bound.BOUNDED_CLASS]


def measured(load: workloads.Workload, policy: policies.Policy, model_dir) -> dict[str, float]:
    step_time = functools.partial(metrics.MIXED_FIT.record_ms, scale=float(load.scale))
    run = h.run_workload(
        policy.spec(**load.scheduler_kwargs()), load.requests, model_dir, max_steps=50_000, step_time=step_time
    )
    assert not run.unfinished
    return metrics.ttft_ms_by_request(run, load)


@pytest.mark.parametrize("load", LOADS, ids=[load.name for load in LOADS])
def test_no_schedule_beats_the_bounds(load, model_dir):
    cls = bound.BOUNDED_CLASS[load.kind]
    ids = dict(load.classes)
    machine, jobs = bound.relaxed_jobs(load)
    alone = sum(machine.ideal(j) for j in jobs if j.cls == cls) / len(ids[cls])
    for policy in POLICIES:
        ttft = measured(load, policy, model_dir)
        long_ttft = {rid: ttft[rid] for rid in ids["long"]}
        per_prompt = bound.class_ttft_with_long_deadlines(load, cls, long_ttft)
        for rid in ids[cls]:
            assert ttft[rid] >= per_prompt[rid] - 1e-6, (policy.name, rid)
        mean = sum(ttft[rid] for rid in ids[cls]) / len(ids[cls])
        long_mean = sum(long_ttft.values()) / len(long_ttft)
        assert mean >= bound.class_mean_lower_bound(load, cls, long_mean) - 1e-6, policy.name
        if len(long_ttft) == 1:
            window = bound.short_mean_lower_bound(load, long_mean)
            assert mean >= window - 1e-6, policy.name
            if policy.name == policies.hotfix_name(1, policies.V2_MODE):
                assert window > alone  # the long prompt's window binds the short prompts
        # Deadlines no schedule can meet leave nothing to bound.
        assert bound.class_mean_with_long_deadlines(load, cls, long_ttft, 0.1) == float("inf")
