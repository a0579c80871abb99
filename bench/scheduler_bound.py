#!/usr/bin/env python3
"""Issue 15's targets against what any admission rule could reach: lower bounds, from measured runs.

For each workload with a cached or short class (the agent workload, the two
short-stream workloads) the script asks: if no long prompt's time to first
token is worse than under patch v2 (target "long prompts no worse than v2"),
how low can the class's mean time to first token be, under ANY admission rule
that keeps vLLM's threshold? Everything is in the benchmark's step-time model
(`bench.scheduler.metrics.MIXED_FIT`), arrivals in modelled time, token
counts at full size. Every bound is a relaxation in the rule's favour; the
relaxations each one makes are listed with it. None of them uses the
inter-token target (a rule is not asked to keep p99 inter-token time).

1. Single window (`short_mean_lower_bound`; one long prompt, short class).
   The long prompt (P tokens, arriving at `a`, first token at `a + L`) needs at
   least ceil(P / threshold) steps (the streams keep more than one request
   eligible, and the benchmark leaves vLLM's adaptive threshold off, so no
   step gives it more), each costing at least the fixed part plus the
   always-decoding streams; its own tokens cost alpha*P + beta*P^2/2 however
   they are chunked. That is `base`. A short prompt arriving in [a, a + L)
   either gets its first token by a + L, and then its whole prefill ran inside
   the window (L >= base + the cost of every such prompt), or it waits at
   least until a + L plus one more step. Any prompt's time to first token is
   at least its prefill alone beside the streams. For each L up to v2's value
   the best split is a fractional knapsack. Relaxed: fractional service,
   decode steps of admitted prompts left out.

2. Per-prompt deadlines (`class_mean_with_long_deadlines`; any number of long
   prompts). Each long prompt's first token no later than under v2 is a
   deadline. In any schedule, an interval [r, d] lasts at least what every
   prompt released at or after r and answered by d costs (`Machine.need`):
   their tokens' cost, plus the fixed part (11 ms + 3.3 ms per stream) of at
   least as many steps as the longest of them needs and as their tokens fill
   (a step carries at most `budget - streams` prefill tokens). A prompt of
   the class answered at t must fit every interval [r <= its arrival, d >= t]
   beside the long prompts due in it; where it cannot, it is answered after d
   (`earliest_first_token`). A cached turn also cannot be answered before its
   prefix exists: its previous turn's tokens computed, bounded the same way
   (a long first turn against the other long prompts' deadlines). Relaxed:
   the condition is necessary, not sufficient (Horn's condition, exact only
   for one machine without chunk limits); prompts of the class are bounded
   one at a time (they do not compete with each other); a cached turn's work
   is its tail alone (its prefix computed once, by whoever); the fixed part
   shared by a full budget of tokens (as many prompts in one step as the
   budget holds); decode steps of answered prompts and the wait for the step
   running at arrival left out.

3. Mean busy time (`class_mean_lower_bound`; the long target read as the
   class mean, as the benchmark's check reads it). Lagrangian over the mean
   busy time relaxation of one machine with release dates and preemption
   (each job's completion at least its mean busy time plus half its work),
   which the preemptive WSPT schedule solves exactly, maximised over the
   multiplier. Relaxed: as 2, plus no chunk limit and no step count per
   prompt (each prompt's work is its cost plus its tokens' share of the
   fixed part), and no precedence between a session's turns.

Per workload the script reports the highest bound with every long prompt at
v2's value, against 1.2 x stock+thr's measured mean, and the smallest factor
on v2's long TTFTs at which no bound excludes the target (1.0 or less: the
bounds leave the target open at v2's long TTFTs, which shows no exclusion,
not that a rule reaches it).

    python bench/scheduler_bound.py [--scale 1] [--out bench/results/scheduler-bound.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import json
import math
import pathlib
import sys
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scheduler import metrics, policies, report, scheduler_bench, workloads  # noqa: E402
from tools import scheduler_harness as h  # noqa: E402

MODEL = metrics.MIXED_FIT


def _prefill_ms(n: float, start: float = 0.0) -> float:
    return n * (MODEL.alpha_ms + MODEL.beta_ms * (start + n / 2))


def short_mean_lower_bound(load: workloads.Workload, long_ttft_ms: float) -> float:
    """Lowest mean TTFT (modelled ms) of the short prompts any rule could reach
    while the long prompt's TTFT is at most `long_ttft_ms`."""
    inv = 1.0 / float(load.scale)
    thr = load.threshold * inv
    step_floor = MODEL.t0_ms + MODEL.t_decode_ms * load.n_streams
    by_id = {r.req_id: r for r in load.requests}
    (long_id,) = dict(load.classes)["long"]
    long = by_id[long_id]
    size = long.prompt_len * inv
    base = math.ceil(size / thr) * step_floor + _prefill_ms(size)
    shorts = [by_id[rid] for rid in dict(load.classes)["short"]]
    ideal = {
        r.req_id: math.ceil(r.prompt_len * inv / thr) * step_floor + _prefill_ms(r.prompt_len * inv) for r in shorts
    }
    best = math.inf
    steps = 400
    for k in range(steps + 1):
        length = base + (long_ttft_ms - base) * k / steps
        if length < base:
            continue
        end = long.arrival_ms + length
        total = sum(ideal.values())
        # Prompts arriving in the window: serving one costs window time,
        # deferring one costs (end - arrival + a step) of its TTFT.
        window = [r for r in shorts if long.arrival_ms <= r.arrival_ms < end]
        items = sorted(
            (
                (max(0.0, end - r.arrival_ms + step_floor - ideal[r.req_id]), _prefill_ms(r.prompt_len * inv))
                for r in window
            ),
            key=lambda item: item[0] / item[1],
            reverse=True,
        )
        room = length - base
        for gain, cost in items:
            served = min(1.0, room / cost) if cost else 1.0
            room -= served * cost
            total += (1.0 - served) * gain
        best = min(best, total / len(shorts))
    return best


@dataclasses.dataclass(frozen=True)
class Job:
    """One classed prompt of the relaxations: released at `arrival` (modelled
    ms); `tokens` to compute, whose own cost is `cost` ms, in at least `steps`
    steps (chunks of the threshold); `after`: the prompt whose tokens are its
    cached prefix (a session's previous turn), if any."""

    req_id: str
    cls: str
    arrival: float
    tokens: float
    cost: float
    steps: int
    after: str | None


@dataclasses.dataclass(frozen=True)
class Machine:
    """What every step costs at least: `step_floor` (the fixed part with the
    always-decoding streams), and the most prefill tokens one step carries."""

    step_floor: float
    step_tokens: float

    def ideal(self, job: Job) -> float:
        """The job alone: its steps' fixed parts plus its own cost."""
        return job.steps * self.step_floor + job.cost

    def work(self, job: Job) -> float:
        """Machine time the job needs at the least: its cost plus its tokens'
        share of the fixed part, shared by as many tokens as a step carries."""
        return job.cost + job.tokens * self.step_floor / self.step_tokens

    def need(self, jobs: Sequence[Job]) -> float:
        """Least time an interval takes that holds every step of `jobs`: their
        cost, and a fixed part for at least as many steps as the longest of
        them needs and as their tokens fill."""
        tokens = sum(j.tokens for j in jobs)
        steps = max(max(j.steps for j in jobs), math.ceil(tokens / self.step_tokens - 1e-9))
        return sum(j.cost for j in jobs) + steps * self.step_floor


def relaxed_jobs(load: workloads.Workload) -> tuple[Machine, list[Job]]:
    """The workload's classed prompts as jobs (full-size token counts).

    A cached turn's job is only its tail beyond the previous turn of its
    session, at the tail's depth: its prefix is taken as cached, and whoever
    computed it (the previous turn, or the turn itself at the cost of
    computing it twice) is accounted by `after`."""
    inv = 1.0 / float(load.scale)
    thr = load.threshold * inv
    machine = Machine(MODEL.t0_ms + MODEL.t_decode_ms * load.n_streams, (load.budget - load.n_streams) * inv)
    previous: dict[str, h.RequestSpec] = {}  # session -> its latest turn so far
    after: dict[str, h.RequestSpec] = {}
    for r in sorted(load.requests, key=lambda r: (r.arrival_ms or 0.0, r.req_id)):
        if r.prefix_group:
            if r.prefix_group in previous:
                after[r.req_id] = previous[r.prefix_group]
            previous[r.prefix_group] = r
    by_id = {r.req_id: r for r in load.requests}
    jobs = []
    for cls, ids in load.classes:
        for rid in ids:
            r, before = by_id[rid], after.get(rid)
            depth = before.prompt_len * inv if before else 0.0
            tokens = r.prompt_len * inv - depth
            jobs.append(
                Job(
                    rid,
                    cls,
                    float(r.arrival_ms or 0.0),
                    tokens,
                    _prefill_ms(tokens, depth),
                    math.ceil(tokens / thr),
                    before.req_id if before else None,
                )
            )
    return machine, jobs


def earliest_first_token(
    machine: Machine, job: Job, deadlines: Sequence[tuple[Job, float]], not_before: float = 0.0
) -> float:
    """Least completion time of `job` (released at its arrival) in any schedule
    where each job of `deadlines` completes by its deadline, and not before
    `not_before`.

    A necessary condition on any schedule: every interval [r, d] holds every
    step of the jobs released at or after r and completed by d, so it lasts at
    least `machine.need` of them (Horn's condition for one machine with
    release dates and deadlines, with the steps' fixed part). `job` completed
    by t must fit every interval [r <= its arrival, d >= t] beside the jobs
    due in it; where it cannot, it completes after d."""
    t = max(job.arrival + machine.ideal(job), not_before)
    starts = sorted({o.arrival for o, _ in deadlines if o.arrival <= job.arrival} | {job.arrival})
    moved = True
    while moved:
        moved = False
        for r in starts:
            for d in [t] + sorted(dl for _, dl in deadlines if dl > t):
                inside = [o for o, dl in deadlines if o.arrival >= r and dl <= d] + [job]
                need = machine.need(inside)
                if need > d - r + 1e-9:
                    t, moved = (r + need if d == t else d), True
                    break
            if moved:
                break
    return t


def deadlines_feasible(machine: Machine, deadlines: Sequence[tuple[Job, float]]) -> bool:
    """The interval condition of `earliest_first_token` for the jobs alone."""
    return all(
        machine.need(inside) <= d - r + 1e-9
        for r in {o.arrival for o, _ in deadlines}
        for d in {dl for _, dl in deadlines}
        if (inside := [o for o, dl in deadlines if o.arrival >= r and dl <= d])
    )


def class_ttft_with_long_deadlines(
    load: workloads.Workload, cls: str, long_ttft: dict[str, float], factor: float = 1.0
) -> dict[str, float]:
    """Per prompt of class `cls`: the lowest TTFT (modelled ms) any rule could
    give it while every long prompt's TTFT is at most `factor` times
    `long_ttft` (per prompt); infinite where those deadlines cannot all hold.

    Each prompt of the class is bounded on its own (so prompts of the class
    competing with each other are left out, in the rule's favour): by the
    interval condition of `earliest_first_token` against the long prompts'
    deadlines, and not before its prefix can exist: the previous turn's tokens
    computed, itself bounded the same way (a long first turn against the other
    long prompts' deadlines)."""
    machine, jobs = relaxed_jobs(load)
    by_id = {j.req_id: j for j in jobs}
    longs = [(j, j.arrival + factor * long_ttft[j.req_id]) for j in jobs if j.cls == "long"]
    mine = [j for j in jobs if j.cls == cls]
    if not deadlines_feasible(machine, longs):
        return {j.req_id: math.inf for j in mine}
    memo: dict[str, float] = {}

    def earliest(job: Job) -> float:
        if job.req_id not in memo:
            prefix = earliest(by_id[job.after]) if job.after else 0.0
            others = [(o, dl) for o, dl in longs if o.req_id != job.req_id]
            memo[job.req_id] = earliest_first_token(machine, job, others, prefix)
        return memo[job.req_id]

    return {j.req_id: earliest(j) - j.arrival for j in mine}


def class_mean_with_long_deadlines(
    load: workloads.Workload, cls: str, long_ttft: dict[str, float], factor: float = 1.0
) -> float:
    """The mean of `class_ttft_with_long_deadlines`."""
    bounds = class_ttft_with_long_deadlines(load, cls, long_ttft, factor)
    return sum(bounds.values()) / len(bounds)


def weighted_mean_busy_bound(machine: Machine, jobs: Sequence[Job], weight: dict[str, float]) -> float:
    """A lower bound on sum(weight * completion) over every preemptive schedule
    of `jobs` on a machine doing at most one ms of work per ms: the mean busy
    time LP relaxation (a job's completion is at least its mean busy time plus
    half its work), which the preemptive WSPT schedule solves exactly
    (Goemans, Queyranne, Schulz, Skutella, Wang, "Single machine scheduling
    with release dates", SIAM J. Discrete Math. 15, 2002)."""
    pending = sorted(jobs, key=lambda j: j.arrival)
    ready: list[tuple[float, int, Job]] = []
    left: dict[str, float] = {}
    busy: dict[str, float] = {}
    now, k, total = 0.0, 0, 0.0
    while k < len(pending) or ready:
        if not ready:
            now = max(now, pending[k].arrival)
        while k < len(pending) and pending[k].arrival <= now:
            j = pending[k]
            w = weight[j.cls]
            heapq.heappush(ready, (-w / machine.work(j), k, j))
            left[j.req_id], busy[j.req_id] = machine.work(j), 0.0
            k += 1
        _, order, j = ready[0]
        until = pending[k].arrival if k < len(pending) else math.inf
        run = min(left[j.req_id], until - now)
        busy[j.req_id] += run * (now + run / 2)
        left[j.req_id] -= run
        now += run
        if left[j.req_id] <= 1e-9:
            heapq.heappop(ready)
            work = machine.work(j)
            total += weight[j.cls] * (busy[j.req_id] / work + work / 2)
    return total


def class_mean_lower_bound(load: workloads.Workload, cls: str, long_mean_ms: float) -> float:
    """Lowest mean TTFT (modelled ms) of class `cls` any rule could reach while
    the long prompts' mean TTFT is at most `long_mean_ms` (Lagrangian bound
    over the mean busy time relaxation, maximised over the multiplier)."""
    machine, jobs = relaxed_jobs(load)
    mine = [j for j in jobs if j.cls == cls]
    longs = [j for j in jobs if j.cls == "long"]
    arrivals = sum(j.arrival for j in mine)
    long_budget = len(longs) * long_mean_ms + sum(j.arrival for j in longs)  # sum of the longs' completions

    def dual(lam: float) -> float:
        weight = {c: (1.0 if c == cls else lam if c == "long" else 0.0) for c, _ in load.classes}
        return weighted_mean_busy_bound(machine, jobs, weight) - lam * long_budget - arrivals

    # The dual is concave in the multiplier: a coarse scan, then golden section.
    grid = [0.0] + [2.0 ** (e / 4) for e in range(-40, 41)]
    values = [dual(x) for x in grid]
    i = max(range(len(grid)), key=values.__getitem__)
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best = values[i]
    for _ in range(60):
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        fa, fb = dual(a), dual(b)
        best = max(best, fa, fb)
        lo, hi = (lo, b) if fa >= fb else (a, hi)
    return max(best, sum(machine.ideal(j) for j in mine)) / len(mine)


def smallest_long_factor(bound_at, target: float, long_ref: float) -> float:
    """Smallest long mean TTFT, as a ratio to `long_ref`, at which `bound_at`
    (long mean -> lowest class mean) lets the class reach `target`."""
    lo, hi = long_ref * 0.25, long_ref * 4
    if bound_at(lo) <= target:
        return lo / long_ref
    while hi - lo > 1.0:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if bound_at(mid) <= target else (mid, hi)
    return hi / long_ref


#: The class each kind of workload bounds (issue 15's targets).
BOUNDED_CLASS = {"agent": "cached", "short-stream": "short"}


def bounds_at(load: workloads.Workload, cls: str, v2_long: dict[str, float], factor: float) -> dict[str, float]:
    """Every lower bound that applies, with each long prompt's TTFT at most
    `factor` times its v2 value (and so their mean at most `factor` times v2's)."""
    v2_mean = sum(v2_long.values()) / len(v2_long)
    out = {
        "per-prompt deadlines": class_mean_with_long_deadlines(load, cls, v2_long, factor),
        "mean busy time": class_mean_lower_bound(load, cls, factor * v2_mean),
    }
    if len(v2_long) == 1 and cls == "short":
        out["single window"] = short_mean_lower_bound(load, factor * v2_mean)
    return out


def smallest_factor(load: workloads.Workload, cls: str, v2_long: dict[str, float], target: float) -> float:
    """Smallest factor over v2's long TTFTs at which no bound excludes `target`
    (1.0 or less: the bounds leave the target open at v2's long TTFTs)."""
    lo, hi = 0.5, 4.0
    if max(bounds_at(load, cls, v2_long, lo).values()) <= target:
        return lo
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if max(bounds_at(load, cls, v2_long, mid).values()) <= target else (mid, hi)
    return hi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="1")
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "results" / "scheduler-bound.json")
    args = parser.parse_args(argv)
    scale = scheduler_bench.parse_scale(args.scale)
    model_dir = scheduler_bench.prepare()
    stock_thr, v2 = policies.stock_policies()[1], policies.hotfix(1, policies.V2_MODE)
    out = []
    for load in workloads.suite(scale):
        cls = BOUNDED_CLASS.get(load.kind)
        if cls is None:
            continue
        ttft = {}
        for pol in (stock_thr, v2):
            step_time = functools.partial(MODEL.record_ms, scale=float(load.scale))
            run = h.run_workload(
                pol.spec(**load.scheduler_kwargs()), load.requests, model_dir, max_steps=50_000, step_time=step_time
            )
            ttft[pol.name] = metrics.ttft_ms_by_request(run, load)
        ids = dict(load.classes)
        stock_mean = sum(ttft[stock_thr.name][r] for r in ids[cls]) / len(ids[cls])
        v2_long = {r: ttft[v2.name][r] for r in ids["long"]}
        v2_long_mean = sum(v2_long.values()) / len(v2_long)
        target = report.CLASS_TTFT_VS_STOCK * stock_mean
        at_v2 = bounds_at(load, cls, v2_long, 1.0)
        bound = max(at_v2.values())
        out.append(
            {
                "workload": load.name,
                "class": cls,
                "stock_thr_mean_ms": round(stock_mean, 1),
                "target_ms": round(target, 1),
                "v2_long_mean_ms": round(v2_long_mean, 1),
                "lower_bound_ms_with_long_at_v2": round(bound, 1),
                "lower_bound_vs_stock_thr": round(bound / stock_mean, 3),
                "bounds_ms_with_long_at_v2": {name: round(v, 1) for name, v in at_v2.items()},
                "target_excluded_with_long_at_v2": bound > target,
                "long_vs_v2_needed_for_target": round(smallest_factor(load, cls, v2_long, target), 3),
            }
        )
        print(json.dumps(out[-1]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"scale": str(scale), "model": MODEL.describe(), "bounds": out}, indent=1) + "\n", encoding="utf-8"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
