"""Gate mode 2 (the default) on the real vLLM 0.32
`Scheduler` and `AsyncScheduler`. Each test runs mode 1 (the step-bound gate, kept
as a mode) on the same load and asserts that it fails what mode 2 passes.

Each test runs in the toy configuration and in the recipe's, at full scale
(tests/support/sched_configs.py): token counts follow the threshold."""

from __future__ import annotations

import logging

import pytest

from dspark_launch.hotfix import contract
from tests.support import sched_configs as sc
from tests.support.sched_configs import CONFIGS, tokens
from tools import scheduler_harness as h

V2, V3 = 1, 2
SCHEDULERS = pytest.mark.parametrize("async_scheduling", [False, True], ids=["Scheduler", "AsyncScheduler"])


def spec(config, mode, async_scheduling, **kw) -> h.SchedulerSpec:
    return sc.spec(
        config, cap=1, async_scheduling=async_scheduling, extra_env=((contract.ENV_GATE_MODE, str(mode)),), **kw
    )


def bound(base: h.SchedulerSpec) -> int:
    """Cap 1's step bound."""
    return base.long_prefill_token_threshold + base.long_prefill_token_threshold // 2


def short_room(base: h.SchedulerSpec) -> int:
    return int(contract.SHORT_ROOM_SHARE * base.long_prefill_token_threshold)


def first_step(run: h.RunResult, rid: str) -> int:
    return min(s.step for s in run.steps if rid in s.scheduled)


def prefill_steps(run: h.RunResult, rid: str) -> list[int]:
    return [s.step for s in run.steps if rid in s.mid_prefill]


@CONFIGS
def test_mode_two_is_kept_beside_the_default_mode_three(model_dir, config):
    default = h.build_scheduler(sc.spec(config), model_dir)
    assert default._dspark_gate_mode == contract.DEFAULT_GATE_MODE == 3
    base = spec(config, V3, False)
    sched = h.build_scheduler(base, model_dir)
    assert sched._dspark_gate_mode == V3
    assert (sched._dspark_step_bound, sched._dspark_short_room) == (bound(base), short_room(base))


def stream(base: h.SchedulerSpec, steps: int) -> h.RequestSpec:
    """A decoding stream of at least `steps` steps."""
    return h.RequestSpec("stream-0", 0, tokens(base, 32), sc.outputs(base, steps))


def cached_turn_load(base: h.SchedulerSpec) -> list[h.RequestSpec]:
    """A conversation's second turn (1,200 of its 1,260 toy tokens cached, to
    whole blocks) arrives while a cold 4,000-token prompt is mid-prefill."""
    cached = sc.aligned(base, 1200)
    whole = cached + tokens(base, 60)
    turn1 = h.RequestSpec("turn-1", 0, cached, 4, prefix_group="conv", shared_prefix_len=cached)
    turn2 = h.RequestSpec("turn-2", 14, whole, 4, prefix_group="conv", shared_prefix_len=whole)
    return [stream(base, 80), turn1, h.RequestSpec("long", 8, tokens(base, 4000), 4), turn2]


@CONFIGS
@SCHEDULERS
def test_a_cached_turn_passes_while_a_cold_long_prompt_is_mid_prefill(model_dir, config, async_scheduling):
    base = sc.spec(config)
    runs = {
        mode: h.run_workload(
            spec(config, mode, async_scheduling, enable_prefix_caching=True), cached_turn_load(base), model_dir
        )
        for mode in (V2, V3)
    }
    for run in runs.values():
        assert not run.unfinished
    v3 = runs[V3]
    long_prefill = prefill_steps(v3, "long")
    arrived = v3.arrival["turn-2"]
    assert long_prefill[0] < arrived < long_prefill[-1]
    assert first_step(v3, "turn-2") == arrived
    assert v3.steps[arrived].scheduled["turn-2"] <= base.long_prefill_token_threshold  # only its uncached tail
    assert max(len(s.mid_prefill) for s in v3.steps) == 1
    # Patch v2's gate judged it by its whole prompt and held it behind the long one.
    assert first_step(runs[V2], "turn-2") > prefill_steps(runs[V2], "long")[-1]


@CONFIGS
@SCHEDULERS
def test_the_room_beyond_the_bound_is_for_uncached_prompts_only(model_dir, config, async_scheduling):
    """Beside a long prompt's chunk the bound leaves half a chunk (128 toy
    tokens): a fresh prompt an eighth of a chunk longer (160) passes on the
    short-prompt room, a cached turn with a tail that long (deeper tokens,
    each costlier) waits for the long one."""
    base = sc.spec(config)
    threshold = base.long_prefill_token_threshold
    tail = bound(base) - threshold + threshold // 8  # over what the bound leaves, within the room
    assert bound(base) - threshold < tail <= bound(base) - threshold + short_room(base)
    cached = sc.aligned(base, 1200)
    load = [
        stream(base, 80),
        h.RequestSpec("turn-1", 0, cached, 4, prefix_group="conv", shared_prefix_len=cached),
        h.RequestSpec("long", 8, tokens(base, 4000), 4),
        h.RequestSpec("fresh", 12, tail, 4),
        h.RequestSpec("turn-2", 14, cached + tail, 4, prefix_group="conv", shared_prefix_len=cached + tail),
    ]
    run = h.run_workload(spec(config, V3, async_scheduling, enable_prefix_caching=True), load, model_dir)
    assert not run.unfinished
    long_prefill = prefill_steps(run, "long")
    assert first_step(run, "fresh") == run.arrival["fresh"] < long_prefill[-1]
    assert long_prefill[0] < run.arrival["turn-2"] < long_prefill[-1]
    assert first_step(run, "turn-2") >= long_prefill[-1]
    # only its uncached tail (and the hit's last block where the drafter drops it)
    assert run.steps[first_step(run, "turn-2")].scheduled["turn-2"] == tail + h.dropped_tail(base)


def short_stream_load(base: h.SchedulerSpec) -> list[h.RequestSpec]:
    """A cold 4,000-token prompt (toy tokens), then a short prompt (160: over
    what patch v2's bound leaves beside the long chunk, within mode 2's room)
    every second step."""
    load = [stream(base, 80), h.RequestSpec("long", 2, tokens(base, 4000), 4)]
    load += [h.RequestSpec(f"short-{i}", 4 + 2 * i, tokens(base, 160), 4) for i in range(5)]
    return load


@CONFIGS
@SCHEDULERS
def test_short_prompts_are_not_held_below_the_steps_room(model_dir, config, async_scheduling):
    base = sc.spec(config)
    load = short_stream_load(base)
    runs = {mode: h.run_workload(spec(config, mode, async_scheduling), load, model_dir) for mode in (V2, V3)}
    for run in runs.values():
        assert not run.unfinished
    v3 = runs[V3]
    long_done = prefill_steps(v3, "long")[-1]
    shorts = [f"short-{i}" for i in range(5)]
    for rid in shorts:
        assert first_step(v3, rid) == v3.arrival[rid] < long_done, rid
        assert rid not in v3.steps[first_step(v3, rid)].mid_prefill  # whole prompt in one step
    # The long prompt keeps its chunk every step, and no step goes past the
    # bound plus the room for prompts that finish in it.
    assert all(
        s.scheduled.get("long") == base.long_prefill_token_threshold for s in v3.steps if "long" in s.mid_prefill
    )
    assert max(s.prefill_tokens for s in v3.steps) <= bound(base) + short_room(base)
    # Patch v2's gate held every one of them until the long prompt was done.
    v2_done = prefill_steps(runs[V2], "long")[-1]
    assert all(first_step(runs[V2], rid) >= v2_done for rid in shorts)


def sessions_load(base: h.SchedulerSpec):
    load = [
        stream(base, 80),
        h.RequestSpec("s1", 0, tokens(base, 64), 4, resumable=True),
        h.RequestSpec("s2", 0, tokens(base, 64), 4, resumable=True),
        h.RequestSpec("long", 3, tokens(base, 4000), 4),
        h.RequestSpec("fresh", 5, tokens(base, 600), 4),
    ]

    def feed(sched, step):
        if step == 6:  # both sessions' next turns (700 toy tokens each) while the long one is mid-prefill
            for sid in ("s1", "s2"):
                sched.add_request(h.make_request(h.RequestSpec(sid, 0, tokens(base, 700), 4, resumable=True)))
        if step == 60:
            for sid in ("s1", "s2"):
                sched.add_request(h.make_request(h.RequestSpec(sid, 0, 1, 1)))

    return load, feed


def diag_inflight(caplog) -> list[int]:
    return [
        int(r.getMessage().split(" inflight=")[1].split()[0])
        for r in caplog.records
        if r.getMessage().startswith("dspark-issue27 step=")
    ]


@CONFIGS
@SCHEDULERS
def test_requests_holding_kv_blocks_are_counted_and_never_starved(model_dir, caplog, config, async_scheduling):
    caplog.set_level(logging.INFO)
    runs = {}
    for mode in (V2, V3):
        caplog.clear()
        load, feed = sessions_load(sc.spec(config))
        runs[mode] = h.run_workload(
            spec(config, mode, async_scheduling, diag=True), load, model_dir, before_schedule=feed
        )
        assert {"stream-0", "long", "fresh"} <= runs[mode].finished
        counts = diag_inflight(caplog)
        # The gate's count after each step is vLLM's own: bypassing requests included.
        assert counts == [len(s.mid_prefill) for s in runs[mode].steps]
    v3 = runs[V3]
    resumed = [s.step for s in v3.steps if s.scheduled.get("s1", 0) > 1 and s.step >= 6]
    both = [s.step for s in v3.steps if s.step >= 6 and s.scheduled.get("s1", 0) > 1 and s.scheduled.get("s2", 0) > 1]
    assert resumed[0] == 6 and both and both[0] == 6  # both sessions start in the step they resume
    assert max(len(s.mid_prefill) for s in v3.steps) == 3  # long + s1 + s2: bypass can pass the cap ...
    assert first_step(v3, "fresh") > prefill_steps(v3, "long")[-1]  # ... and fresh prompts wait on the count
    # Patch v2 cut the waiting section's budget to the step bound, sessions included:
    # the second session did not start in that step.
    v2_both = [
        s.step for s in runs[V2].steps if s.step >= 6 and s.scheduled.get("s1", 0) > 1 and s.scheduled.get("s2", 0) > 1
    ]
    assert not v2_both or v2_both[0] > 6


@CONFIGS
@SCHEDULERS
def test_a_prompt_the_gate_holds_shows_as_deferred(model_dir, config, async_scheduling):
    """Decided: a prompt mode 2 holds back goes through vLLM's own
    `skip_request`, so it is in `deferred_waiting` (vLLM's "deferred" waiting
    reason) while held, and leaves it when admitted."""
    base = sc.spec(config)
    load = [
        stream(base, 60),
        h.RequestSpec("long-0", 2, tokens(base, 2000), 4),
        h.RequestSpec("long-1", 3, tokens(base, 2000), 4),
    ]
    deferred: dict[int, set[str]] = {}

    def watch(sched, step):
        deferred[step] = {r.request_id for r in sched.deferred_waiting}

    run = h.run_workload(spec(config, V3, async_scheduling), load, model_dir, before_schedule=watch)
    assert not run.unfinished
    held = [step for step in range(4, prefill_steps(run, "long-0")[-1]) if "long-1" not in run.steps[step].scheduled]
    assert held and all("long-1" in deferred[step + 1] for step in held)
    assert all("long-1" not in ids for step, ids in deferred.items() if step > first_step(run, "long-1") + 1)
