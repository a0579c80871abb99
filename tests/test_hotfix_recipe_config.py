"""The hotfix's structural tests (tests/test_hotfix_shortest_first.py,
tests/test_issue27_inflight_cap.py) again in the recipe's scheduler
configuration, derived from the default profile (`recipe_spec`: speculative
decoding with the MTP margins, block 256, prefix caching, budget 8192,
threshold 1024, 6 sequences) and at 1/16 of it, on the real `Scheduler` and
`AsyncScheduler`. Token counts of the loads follow the threshold."""

from __future__ import annotations

import dataclasses

import pytest

from dspark_launch.hotfix import contract
from tests.support.sched_configs import tokens
from tools import scheduler_harness as h

CONFIGS = [
    pytest.param(scale, asy, id=f"{h.scale_label(scale)}-{'AsyncScheduler' if asy else 'Scheduler'}")
    for scale in h.RECIPE_SCALES
    for asy in (False, True)
]


def spec(scale, async_scheduling, cap, gate_mode=contract.DEFAULT_GATE_MODE) -> h.SchedulerSpec:
    return h.recipe_spec(
        scale, async_scheduling=async_scheduling, cap=cap, extra_env=((contract.ENV_GATE_MODE, str(gate_mode)),)
    )


@pytest.mark.parametrize(("scale", "async_scheduling"), CONFIGS)
@pytest.mark.parametrize("gate_mode", [1, 2, 3])
@pytest.mark.parametrize("cap", [1, 2, 3])
def test_caps_and_step_bounds_hold_in_the_recipes_configuration(model_dir, scale, async_scheduling, cap, gate_mode):
    base = spec(scale, async_scheduling, cap, gate_mode)
    threshold = base.long_prefill_token_threshold
    load = h.wave_workload(
        n_streams=2,
        stream_prompt=tokens(base, 48),
        stream_tokens=60,  # 4 of 6 seats free
        wave_prompt=tokens(base, 1500),
        n_wave=6,
        wave_tokens=8,
    )
    load += [h.RequestSpec(f"short-{i}", 6 + 3 * i, tokens(base, 200), 4) for i in range(6)]
    run = h.run_workload(base, load, model_dir)
    assert not run.unfinished
    assert run.effective_cap == cap
    assert run.max_concurrent_partial_prefills() == cap
    decode_steps = [s for s in run.steps if s.decode_active]
    bound = cap * threshold + threshold // 2
    extra = int(contract.SHORT_ROOM_SHARE * threshold) if gate_mode == 2 else 0
    assert max(s.prefill_tokens for s in decode_steps) <= bound + extra
    streams = h.stream_ids(load)
    assert run.longest_decode_gap(streams) == 1  # no decoding stream ever skipped


@pytest.mark.parametrize(("scale", "async_scheduling"), CONFIGS)
def test_a_short_prompt_goes_ahead_of_a_long_prompts_chunk(model_dir, scale, async_scheduling):
    base = spec(scale, async_scheduling, 1)
    load = [
        h.RequestSpec("stream-0", 0, tokens(base, 32), 80),
        h.RequestSpec("long", 2, tokens(base, 4000), 4),
        h.RequestSpec("short", 6, tokens(base, 300), 4),
    ]
    run = h.run_workload(base, load, model_dir)
    assert not run.unfinished
    first = min(s.step for s in run.steps if "short" in s.scheduled)
    long_done = max(s.step for s in run.steps if "long" in s.mid_prefill) + 1
    assert first == run.arrival["short"] < long_done and "short" not in run.steps[first].mid_prefill
    assert run.token_steps["short"][0] < long_done
    stock = h.run_workload(dataclasses.replace(base, policy="stock"), load, model_dir)
    assert run.ttft_steps()["short"] <= stock.ttft_steps()["short"]
