"""The gate modes (DSPARK_PREFILL_GATE_MODE) on the real vLLM scheduler.

Mode 0 is the plain count of patch v1. Mode 1 (the default) also bounds the
prefill tokens of every step at (cap + 1/2) x long_prefill_token_threshold,
lets prompts that finish within the step pass beside the in-flight ones, and
steps over long prompts blocked by the count (at most 8 per step) so that
short prompts queued behind them are not held back.

Each test that drives steps runs in the toy configuration and in the recipe's, at full scale
(tests/support/sched_configs.py): token counts follow the threshold.
"""

from __future__ import annotations

import logging

import pytest

from dspark_launch.hotfix import contract, injected
from tests.support import sched_configs as sc
from tests.support.live_rows import live_row
from tests.support.sched_configs import CONFIGS, TOY, tokens
from tools import scheduler_harness as h

MODE_ENV = h.GATE_MODE_ENV_VAR


def spec(cap, mode, config=TOY, **kw) -> h.SchedulerSpec:
    env = ((MODE_ENV, None if mode is None else str(mode)),)
    return sc.spec(config, cap=cap, extra_env=env, **kw)


def mixed(base: h.SchedulerSpec, shared_prefix_len: int = 0) -> list[h.RequestSpec]:
    """4 streams (fewer where the seats are few); at step 4 six long prompts
    (1,500 toy tokens) and, queued behind them, short ones (40 to 100 tokens,
    under half a chunk); more short ones arrive later."""
    load = h.wave_workload(
        n_streams=sc.stream_count(base, 4),
        stream_prompt=tokens(base, 48),
        stream_tokens=sc.outputs(base, 160),
        n_wave=6,
        wave_prompt=tokens(base, 1500),
        wave_tokens=16,
        shared_prefix_len=shared_prefix_len,
    )
    load += [h.RequestSpec(f"short-{i}", 4, tokens(base, 40 + 20 * i), 8) for i in range(4)]
    load += [h.RequestSpec(f"late-{i}", 10 + 3 * i, tokens(base, 60), 8) for i in range(4)]
    return load


def bound(cap: int, base: h.SchedulerSpec) -> int:
    threshold = base.long_prefill_token_threshold
    return cap * threshold + threshold // 2


def first_step(run: h.RunResult, rid: str) -> int:
    return min(s.step for s in run.steps if rid in s.scheduled)


def last_prefill_step(run: h.RunResult, rid: str) -> int:
    return max(s.step for s in run.steps if rid in s.mid_prefill) + 1


# ---------------------------------------------------------------------------
# Parsing, once in __init__
# ---------------------------------------------------------------------------

MODES = [
    (None, 3, 0),
    ("", 3, 0),
    ("  ", 3, 0),
    ("0", 0, 0),
    ("1", 1, 0),
    (" 0 ", 0, 0),
    ("+1", 1, 0),
    ("2", 2, 0),
    ("3", 3, 0),
    ("4", 4, 0),
    ("5", 3, 1),
    ("-1", 3, 1),
    ("one", 3, 1),
    ("1.0", 3, 1),
    ("0x1", 3, 1),
]


@pytest.mark.parametrize(("raw", "mode", "warns"), MODES, ids=[repr(m[0]) for m in MODES])
def test_gate_mode_parse_table(model_dir, caplog, raw, mode, warns):
    caplog.set_level(logging.INFO)
    sched = h.build_scheduler(spec(1, raw), model_dir)
    assert sched._dspark_gate_mode == mode
    assert injected._dspark_hotfix_parse(live_row(contract.ENV_GATE_MODE), raw) == (mode, bool(warns))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and MODE_ENV in r.getMessage()]
    assert len(warnings) == warns, warnings
    assert sched._dspark_step_bound == (bound(1, sc.spec(TOY)) if mode >= 1 else 0)


@CONFIGS
@pytest.mark.parametrize("mode", [1, 2])
def test_modes_with_a_bound_have_none_without_a_threshold(model_dir, mode, config):
    sched = h.build_scheduler(spec(1, mode, config, long_prefill_token_threshold=0), model_dir)
    assert sched._dspark_gate_mode == mode and sched._dspark_step_bound == 0


# ---------------------------------------------------------------------------
# Mode 1 on the real scheduler
# ---------------------------------------------------------------------------


@CONFIGS
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["nocache", "prefixcache"])
@pytest.mark.parametrize("cap", [1, 2, 3])
def test_mode_one_never_exceeds_its_bounds(model_dir, cap, prefix_caching, async_scheduling, config):
    base = spec(cap, 1, config, async_scheduling=async_scheduling, enable_prefix_caching=prefix_caching)
    load = mixed(base, shared_prefix_len=sc.aligned(base, 512) if prefix_caching else 0)
    run = h.run_workload(base, load, model_dir)
    assert not run.unfinished, f"deadlock or starvation: {sorted(run.unfinished)}"
    assert run.effective_cap == cap
    # At most `cap` prompts mid-prefill after any step, and it is reached.
    assert max(len(s.mid_prefill) for s in run.steps) == cap
    # Every step's prefill tokens (partial chunks, last chunks and short
    # prompts together) stay within (cap + 1/2) x threshold.
    over = [(s.step, s.prefill_tokens) for s in run.steps if s.prefill_tokens > bound(cap, base)]
    assert not over, f"steps over the bound {bound(cap, base)}: {over}"
    assert max(s.partial_prefill_tokens for s in run.steps) <= cap * base.long_prefill_token_threshold


@CONFIGS
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_mode_one_lets_short_prompts_pass_a_blocked_long_one(model_dir, async_scheduling, config):
    """Mode 0 holds the short prompts behind the queued long ones; mode 1
    starts them while the first long prompt is still prefilling, and still
    admits the long prompts in their arrival order."""
    load = mixed(spec(1, 0, config))
    m0 = h.run_workload(spec(1, 0, config, async_scheduling=async_scheduling), load, model_dir)
    m1 = h.run_workload(spec(1, 1, config, async_scheduling=async_scheduling), load, model_dir)
    assert not m0.unfinished and not m1.unfinished
    wave_done_m0 = last_prefill_step(m0, "wave-0")
    assert first_step(m0, "short-0") >= last_prefill_step(m0, "wave-5")  # behind every long one
    assert first_step(m1, "short-0") < wave_done_m0
    ttft0, ttft1 = m0.ttft_steps(), m1.ttft_steps()
    shorts = [r.req_id for r in load if r.req_id.startswith(("short-", "late-"))]
    assert sum(ttft1[r] for r in shorts) < sum(ttft0[r] for r in shorts) / 2
    # FCFS among the long prompts: stepping over keeps their order.
    starts = [first_step(m1, f"wave-{i}") for i in range(6)]
    assert starts == sorted(starts)
    # ... and at most one of them is mid-prefill at a time, as in mode 0.
    assert max(len(s.mid_prefill) for s in m1.steps) == 1


@CONFIGS
def test_mode_zero_is_the_plain_count_of_patch_v1(model_dir, config):
    """Mode 0: with one long prompt in flight nothing else is admitted, and a
    new prompt may start in the step that carries the previous one's last
    chunk (so a step can hold up to two chunks' worth of prefill)."""
    base = spec(1, 0, config)
    run = h.run_workload(base, mixed(base), model_dir)
    assert not run.unfinished
    assert max(len(s.mid_prefill) for s in run.steps) == 1
    assert max(s.prefill_tokens for s in run.steps if s.decode_tokens) > bound(1, base)


@CONFIGS
def test_mode_one_bypass_for_kv_holding_requests_still_holds(model_dir, config):
    """The step bound and the stepping-over never block a request that holds
    KV blocks (a streaming-input session's next turn), as in mode 0."""
    base = spec(1, 1, config)
    session = h.RequestSpec("session", 0, tokens(base, 64), 4, resumable=True)
    load = [
        h.RequestSpec("stream-0", 0, tokens(base, 32), sc.outputs(base, 60)),
        session,
        h.RequestSpec("long", 1, tokens(base, 4000), 4),
        h.RequestSpec("fresh", 2, tokens(base, 600), 4),
    ]
    next_chunk = h.RequestSpec("session", 0, tokens(base, 700), 4, resumable=True)

    def feed(sched, step):
        if step == 2:
            sched.add_request(h.make_request(next_chunk))
        if step == 40:
            sched.add_request(h.make_request(h.RequestSpec("session", 0, 1, 1)))

    run = h.run_workload(base, load, model_dir, before_schedule=feed)
    long_steps = [s.step for s in run.steps if "long" in s.mid_prefill]
    turn2 = [
        s.step for s in run.steps if s.scheduled.get("session", 0) > 1 and s.step > min(run.token_steps["session"])
    ]
    assert long_steps and turn2 and turn2[0] < long_steps[-1]
    assert first_step(run, "fresh") > long_steps[-1]
    assert {"stream-0", "long", "fresh"} <= run.finished
