#!/usr/bin/env python3
"""Issue 15's targets cannot all hold at once: a lower bound, from measured runs.

On a short-stream workload (a sustained stream of short prompts, one long
document among them) the bound asks: if the long prompt's time to first token
is at most patch v2's (target "long prompts no worse than v2"), how low can the
short prompts' mean time to first token be, under ANY admission rule that keeps
vLLM's threshold? Everything is in the benchmark's step-time model
(`dspark_launch.bench.metrics.MIXED_FIT`), arrivals in modelled time:

* The long prompt (P tokens, arriving at `a`, first token at `a + L`) needs at
  least ceil(P / threshold) steps (the streams keep more than one request
  eligible, and the benchmark leaves vLLM's adaptive threshold off, so no
  step gives it more), each costing at least the fixed part plus
  the always-decoding streams; its own tokens cost alpha*P + beta*P^2/2 however
  they are chunked. That is `base`.
* A short prompt arriving in [a, a + L) either gets its first token by a + L,
  and then its whole prefill ran inside the window (L >= base + the cost of
  every such prompt), or it waits at least until a + L plus one more step.
* Any prompt's time to first token is at least its prefill alone beside the
  streams (ceil(n / threshold) steps).

For each L up to v2's measured value the best split (fractional knapsack: an
optimistic relaxation, so still a lower bound) gives the lowest possible mean;
the script reports the minimum over L, against 1.2 x stock+thr's measured mean,
and the smallest L (as a ratio to v2's) at which the short target becomes
reachable at all. Decode steps of admitted short prompts are left out (they
only add time), so the bound is optimistic for the rule.

    python bench/scheduler_bound.py [--scale 1] [--out bench/results/scheduler-bound.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import pathlib
import sys
from fractions import Fraction

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dspark_launch.bench import harness as h  # noqa: E402
from dspark_launch.bench import metrics, policies, report, scheduler_bench, workloads  # noqa: E402

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
    ideal = {r.req_id: math.ceil(r.prompt_len * inv / thr) * step_floor + _prefill_ms(r.prompt_len * inv)
             for r in shorts}
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
            ((max(0.0, end - r.arrival_ms + step_floor - ideal[r.req_id]), _prefill_ms(r.prompt_len * inv))
             for r in window),
            key=lambda item: item[0] / item[1], reverse=True,
        )
        room = length - base
        for gain, cost in items:
            served = min(1.0, room / cost) if cost else 1.0
            room -= served * cost
            total += (1.0 - served) * gain
        best = min(best, total / len(shorts))
    return best


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
        if load.kind != "short-stream":
            continue
        measured = {}
        for pol in (stock_thr, v2):
            step_time = functools.partial(MODEL.record_ms, scale=float(load.scale))
            run = h.run_workload(pol.spec(**load.scheduler_kwargs()), load.requests, model_dir, max_steps=50_000,
                                 step_time=step_time)
            by_class = metrics.run_metrics(run, load)["ttft_by_class"]
            measured[pol.name] = {c: by_class[c]["model_ms"]["mean"] for c in ("short", "long")}
        target = report.CLASS_TTFT_VS_STOCK * measured[stock_thr.name]["short"]
        long_v2 = measured[v2.name]["long"]
        bound = short_mean_lower_bound(load, long_v2)
        # The smallest long TTFT (x v2's) at which the short target is reachable.
        lo, hi = long_v2, long_v2 * 4
        while hi - lo > 1.0:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if short_mean_lower_bound(load, mid) <= target else (mid, hi)
        out.append({
            "workload": load.name,
            "stock_thr_short_mean_ms": measured[stock_thr.name]["short"],
            "short_target_ms": round(target, 1),
            "v2_long_mean_ms": long_v2,
            "short_mean_lower_bound_ms_with_long_at_v2": round(bound, 1),
            "short_lower_bound_vs_stock_thr": round(bound / measured[stock_thr.name]["short"], 3),
            "long_vs_v2_needed_for_short_target": round(hi / long_v2, 3),
        })
        print(json.dumps(out[-1]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"scale": str(scale), "model": MODEL.describe(), "bounds": out}, indent=1) + "\n",
                        encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
