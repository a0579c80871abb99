"""Gate mode 3 in the recipe's configuration (derived
from the default profile, `scheduler_harness.recipe_spec`) and at 1/16 of its
token counts, on the real vLLM 0.32 `Scheduler` and `AsyncScheduler`: a lone
prompt runs at vLLM's own speed, and under KV pressure mode 3 is never slower
than mode 2 (room admission does not take goes back the same step)."""

from __future__ import annotations

import dataclasses

import pytest

from dspark_launch.hotfix import contract
from tools import scheduler_harness as h

CONFIGS = [
    pytest.param(scale, asy, id=f"{h.scale_label(scale)}-{'AsyncScheduler' if asy else 'Scheduler'}")
    for scale in h.RECIPE_SCALES
    for asy in (False, True)
]


def mode(spec: h.SchedulerSpec, gate_mode: int) -> h.SchedulerSpec:
    return dataclasses.replace(spec, extra_env=((contract.ENV_GATE_MODE, str(gate_mode)),))


def prefill_steps(run: h.RunResult, rid: str, prompt: int) -> int:
    return sum(1 for s in run.steps if rid in s.scheduled and s.start[rid] < prompt)


@pytest.fixture(scope="module")
def patch_v5(tmp_path_factory) -> str:
    return h.released_patch(5, tmp_path_factory.mktemp("v5"))


@pytest.mark.parametrize(("scale", "async_scheduling"), CONFIGS)
def test_a_lone_prompt_runs_at_vllms_own_speed(model_dir, patch_v5, scale, async_scheduling):
    """20K tokens (x scale), nothing else running: stock takes budget-sized
    steps (vLLM lifts its threshold for a lone request); v5 took threshold-sized ones."""
    base = h.recipe_spec(scale, async_scheduling=async_scheduling)
    prompt = int(20000 * scale)
    load = [h.RequestSpec("lone", 0, prompt, 4)]
    steps = {
        name: prefill_steps(h.run_workload(spec, load, model_dir), "lone", prompt)
        for name, spec in (
            ("stock", dataclasses.replace(base, policy="stock")),
            ("v6", base),
            ("v5", dataclasses.replace(base, patch_script=patch_v5)),
        )
    }
    assert steps["v6"] == steps["stock"] == -(-prompt // base.max_num_batched_tokens)
    assert steps["v5"] >= -(-prompt // (base.long_prefill_token_threshold * 3 // 2))


def kv_pressure_load(scale) -> list[h.RequestSpec]:
    """Three decoding streams, a 4,000-token prompt (x scale), then short
    prompts each step that the KV pool cannot all take."""

    def n(tokens):
        return max(2, int(tokens * scale))

    load = [h.RequestSpec(f"stream-{i}", 0, n(300), 60) for i in range(3)]
    load.append(h.RequestSpec("long", 2, n(4000), 4))
    load += [h.RequestSpec(f"short-{i}", 3 + i, n(900), 30) for i in range(8)]
    return load


@pytest.mark.parametrize(("scale", "async_scheduling"), CONFIGS)
def test_under_kv_pressure_mode_three_is_never_slower_than_mode_two(model_dir, scale, async_scheduling):
    """A pool of 7,000 tokens (x scale): the shorts cannot all be admitted.
    Mean first-token time over every prompt and over the shorts is no worse
    than mode 2's (the long prompt itself may finish a step or two later:
    shortest work first), and the last prompt's first token no later."""
    base = h.recipe_spec(scale, async_scheduling=async_scheduling)
    base = dataclasses.replace(base, num_blocks=-(-int(7000 * scale) // base.block_size))
    load = kv_pressure_load(scale)
    runs = {m: h.run_workload(mode(base, m), load, model_dir) for m in (2, 3)}
    for run in runs.values():
        assert not run.unfinished
    prompts = [r.req_id for r in load if not r.req_id.startswith("stream-")]
    shorts = [r for r in prompts if r.startswith("short-")]
    ttft = {m: runs[m].ttft_steps() for m in runs}
    assert sum(ttft[3][r] for r in prompts) <= sum(ttft[2][r] for r in prompts)
    assert sum(ttft[3][r] for r in shorts) < sum(ttft[2][r] for r in shorts)
    last = {m: max(runs[m].token_steps[r][0] for r in prompts) for m in runs}
    assert last[3] <= last[2] + 1


@pytest.mark.parametrize(("scale", "async_scheduling"), CONFIGS)
def test_the_plan_orders_within_the_priority_policy(model_dir, scale, async_scheduling):
    """Under `--scheduling-policy priority` a long prompt of a higher priority
    (lower value) is not passed by shorter prompts of a lower one: mode 3's
    shortest-first orders within the policy's own order."""
    base = h.recipe_spec(scale, async_scheduling=async_scheduling, scheduling_policy="priority")
    t = base.long_prefill_token_threshold
    load = [h.RequestSpec("stream-0", 0, t // 8, 60, priority=0), h.RequestSpec("urgent", 2, 4 * t, 4, priority=0)]
    load += [h.RequestSpec(f"later-{i}", 3 + i, t, 4, priority=1) for i in range(4)]
    run = h.run_workload(base, load, model_dir)
    assert not run.unfinished
    urgent_done = run.token_steps["urgent"][0]
    assert all(run.token_steps[f"later-{i}"][0] > urgent_done for i in range(4))
    fcfs = h.run_workload(dataclasses.replace(base, scheduling_policy="fcfs"), load, model_dir)
    assert fcfs.token_steps["later-0"][0] < fcfs.token_steps["urgent"][0]  # FCFS shortest-first lets them pass
