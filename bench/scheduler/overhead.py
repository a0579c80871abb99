"""Wall time of `schedule()` with and without the hotfix, interleaved in one run.

Each scenario builds one scheduler per policy in the same state: `running`
requests decoding (max_num_seqs = `running`, so vLLM's own admission guard
stops the waiting section) and `waiting` long prompts queued. Every policy
then makes the same decisions each step, so the difference in `schedule()`
time is the hotfix's own per-step work (counting in-flight prefills over
`running`, the step bound, the diagnostics test). The policies are stepped
round-robin, rotating which goes first, so drift on a shared machine hits all
of them alike; only `schedule()` is timed (`update_from_output` is not), with
the garbage collector off during the timed calls.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Sequence

from bench.scheduler.policies import Policy
from tools import scheduler_harness as h


def _trimmed_mean(values: Sequence[float], trim: float = 0.1) -> float:
    ordered = sorted(values)
    k = int(len(ordered) * trim)
    kept = ordered[k : len(ordered) - k] or ordered
    return sum(kept) / len(kept)


def _step(sched, timed: list[float] | None) -> None:
    gc.disable()
    try:
        started = time.perf_counter_ns()
        out = sched.schedule()
        elapsed = time.perf_counter_ns() - started
    finally:
        gc.enable()
    if timed is not None:
        timed.append(elapsed / 1000.0)  # microseconds
    still = {r.request_id for r in sched.running if r.is_prefill_chunk}
    sampled = {rid: [] if rid in still else [h.SAMPLED_TOKEN] for rid in out.num_scheduled_tokens}
    sched.update_from_output(out, h._model_output(out, sampled))


def _build(model_dir, pol: Policy, running: int, waiting: int, horizon: int, scheduling_policy: str = "fcfs"):
    """Under the priority policy the streams run at priority 0 and the waiting prompts take 1 to 3 in
    turn (a heap of several levels, none of which may preempt a stream)."""
    stream_prompt, prompt = 32, 4096
    blocks = running * (stream_prompt + horizon) // 16 + running + 256
    spec = pol.spec(
        max_num_seqs=running,
        max_num_batched_tokens=8192,
        long_prefill_token_threshold=1024,
        num_blocks=blocks,
        block_size=16,
        max_model_len=8192,
        scheduling_policy=scheduling_policy,
    )
    sched = h.build_scheduler(spec, model_dir)
    for i in range(running):
        sched.add_request(h.make_request(h.RequestSpec(f"run-{i}", 0, stream_prompt, horizon)))
    for _ in range(8):  # prefill the streams; they decode from here on
        _step(sched, None)
    assert all(not r.is_prefill_chunk for r in sched.running) and len(sched.running) == running
    for i in range(waiting):
        level = 1 + i % 3 if scheduling_policy == "priority" else 0
        sched.add_request(h.make_request(h.RequestSpec(f"wait-{i}", 0, prompt, 8, priority=level)))
    return sched


def scenario(
    model_dir,
    pols: Sequence[Policy],
    running: int,
    waiting: int,
    reps: int,
    instances: int = 2,
    scheduling_policy: str = "fcfs",
) -> dict:
    """Median / trimmed-mean `schedule()` time per policy (microseconds) and
    each policy's ratio to the first one (stock).

    Each policy gets `instances` schedulers, built in a palindromic order
    (p1..pn, pn..p1, ...); a policy's time in a repetition is the mean over
    its instances. Two schedulers of the same code still differ by a few
    percent at 256 running on a shared machine: the controls in the result
    (a second stock policy, and stock loaded from a copy) show how much.
    """
    horizon = reps + 64
    order: list[int] = []
    for k in range(instances):
        order += list(range(len(pols))) if k % 2 == 0 else list(reversed(range(len(pols))))
    scheds = [(i, _build(model_dir, pols[i], running, waiting, horizon, scheduling_policy)) for i in order]
    per_instance: list[list[float]] = [[] for _ in scheds]
    slots = list(range(len(scheds)))
    for rep in range(reps):
        shift = rep % len(slots)
        for k in slots[shift:] + slots[:shift]:
            _step(scheds[k][1], per_instance[k])
    for _, sched in scheds:
        assert len(sched.running) == running, "the scenario must not admit anything"
    times: list[list[float]] = []
    for i in range(len(pols)):
        mine = [per_instance[k] for k, (j, _) in enumerate(scheds) if j == i]
        times.append([sum(ts) / len(ts) for ts in zip(*mine)])
    base = times[0]
    base_median = statistics.median(base)
    base_mean = _trimmed_mean(base)
    rows = []
    for i, (pol, ts) in enumerate(zip(pols, times)):
        med, mean = statistics.median(ts), _trimmed_mean(ts)
        # Paired: each repetition stepped every scheduler once, in the same state.
        paired = statistics.median(t / b for t, b in zip(ts, base))
        row = {
            "policy": pol.name,
            "schedule_us_median": round(med, 2),
            "schedule_us_trimmed_mean": round(mean, 2),
            "ratio_median": round(med / base_median, 4),
            "ratio_trimmed_mean": round(mean / base_mean, 4),
            "ratio_paired_median": round(paired, 4),
        }
        sched = next(s for j, s in scheds if j == i)
        helper = _helper_us(sched)
        if helper is not None:
            row["injected_count_us"] = round(helper, 3)
            row["injected_count_share"] = round(helper / base_median, 4)
        rows.append(row)
    return {
        "running": running,
        "waiting": waiting,
        "reps": reps,
        "instances": instances,
        "scheduling_policy": scheduling_policy,
        "policies": rows,
    }


def _helper_us(sched, calls: int = 2000) -> float | None:
    """Microseconds per call of the hotfix's per-step count over `running`
    (the injected code's only O(running) work), timed directly."""
    module = sys.modules.get(type(sched).__module__)
    for klass in type(sched).__mro__:
        module = sys.modules.get(klass.__module__)
        if module is not None and hasattr(module, "_dspark_hotfix_running_partials"):
            break
    else:
        return None
    count = module._dspark_hotfix_running_partials
    scheduled = {r.request_id: 1 for r in sched.running}
    gc.disable()
    try:
        started = time.perf_counter_ns()
        for _ in range(calls):
            count(sched, scheduled)
        elapsed = time.perf_counter_ns() - started
    finally:
        gc.enable()
    return elapsed / calls / 1000.0


def measure(
    model_dir,
    pols: Sequence[Policy],
    reps_small: int = 2000,
    reps_large: int = 400,
    scheduling_policies: Sequence[str] = ("fcfs", "priority"),
) -> dict:
    """Both sizes under each of vLLM's scheduling policies (`--scheduling-policy`; FCFS first); the
    first policy is the baseline (stock), a second stock policy is worth including as an A/A
    control of the noise."""
    return {
        "method": "interleaved round-robin, rotating order; schedule() only; gc off while timed; "
        "max_num_seqs = running so every policy makes the same decisions; two schedulers per "
        "policy built in palindromic order (build order alone shifts schedule() time); "
        "ratio_paired_median = median over repetitions of t(policy) / t(stock) in the "
        "same repetition; injected_count_us = the hotfix's per-step count over running, "
        "timed directly",
        "scenarios": [
            scenario(model_dir, pols, running=running, waiting=waiting, reps=reps, scheduling_policy=policy)
            for policy in scheduling_policies
            for running, waiting, reps in ((6, 16, reps_small), (256, 1024, reps_large))
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.scheduler.overhead [--out FILE]`: only the overhead scenarios (stock, its
    controls and the shipped hotfix; FCFS and priority), as JSON."""
    import argparse
    import json
    import pathlib
    import tempfile

    from bench.scheduler import policies

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0] if main.__doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/schedule-overhead.json"))
    parser.add_argument("--reps-small", type=int, default=2000, help="repetitions at 6 running")
    parser.add_argument("--reps-large", type=int, default=400, help="repetitions at 256 running / 1,024 waiting")
    args = parser.parse_args(argv)
    policies.register()
    model_dir = h.prepare_environment(tempfile.mkdtemp(prefix="dspark-overhead-"))
    result = measure(model_dir, policies.overhead_policies(), args.reps_small, args.reps_large)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
