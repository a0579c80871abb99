#!/usr/bin/env python3
"""Issue 23: gate mode 3 (shortest remaining uncached work first inside cap 1's
step bound, with aging k) against stock+thr, patch v2 (mode 1) and v3/v4
(mode 2), under both step-time fits, on the real vLLM Scheduler.

    python bench/srpt_sweep.py [--scale 1/16] [--fit mixed|solo|both] [--out bench/results/srpt-srpt.json]
    python bench/srpt_sweep.py --report bench/results/srpt-srpt.json   # tables + targets + curve

Arrivals are timed with the same fit the numbers are reported in (a solo-fit
run is a different run, not a re-costing). Token counts are scaled by
`--scale` (step counts are not; see bench/scheduler/workloads.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
import time
from fractions import Fraction

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scheduler import metrics, scheduler_bench, workloads  # noqa: E402
from dspark_launch.hotfix.contract import ENV_AGING, ENV_GATE_MODE  # noqa: E402
from tools import scheduler_harness as h  # noqa: E402

FITS = {"mixed": metrics.MIXED_FIT, "solo": metrics.SOLO_FIT}
AGINGS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)
#: stock+thr's knob on the curve: its threshold as a share of the workload's.
THRESHOLD_SHARES = (0.25, 0.5, 1.0)


def policies(k_values=AGINGS, curve: bool = False, only_mode3: bool = False) -> list[dict]:
    """Every (name, policy spec overrides) the run compares."""
    out = (
        [] if only_mode3 else [{"name": "stock+thr", "family": "stock+thr", "policy": "stock", "threshold_share": 1.0}]
    )
    if curve and not only_mode3:
        out += [
            {"name": f"stock+thr@{s:g}", "family": "stock+thr", "policy": "stock", "threshold_share": s}
            for s in THRESHOLD_SHARES
            if s != 1.0
        ]
    for mode, family in () if only_mode3 else ((1, "v2"), (2, "v3")):
        for cap in (1, 2, 3) if curve else (1,):
            out.append(
                {
                    "name": f"{family}" + (f"@cap{cap}" if cap != 1 else ""),
                    "family": family,
                    "policy": "patched",
                    "cap": cap,
                    "env": [[ENV_GATE_MODE, str(mode)]],
                }
            )
    for k in k_values:
        out.append(
            {
                "name": f"m3-k{k:g}",
                "family": "mode3",
                "policy": "patched",
                "cap": 1,
                "env": [[ENV_GATE_MODE, "3"], [ENV_AGING, str(k)]],
                "aging": k,
            }
        )
    return out


def spec_for(pol: dict, load: workloads.Workload) -> h.SchedulerSpec:
    kw = load.scheduler_kwargs()
    if pol["policy"] == "stock":
        kw["long_prefill_token_threshold"] = max(1, int(load.threshold * pol["threshold_share"]))
        return h.SchedulerSpec(policy="stock", **kw)
    return h.SchedulerSpec(policy="patched", cap=pol["cap"], extra_env=tuple(map(tuple, pol["env"])), **kw)


def selected_workloads(scale: Fraction, which: str) -> list[workloads.Workload]:
    shorts = [workloads.short_stream(scale), workloads.short_stream(scale, every_ms=250.0, long_k=32)]
    if which == "curve":
        return shorts
    if which == "targets":
        return shorts + [workloads.agent(scale)]
    return shorts + [
        workloads.short_stream(scale, every_ms=1000.0, replies=(200, 300)),
        workloads.agent(scale),
        workloads.steady(scale),
        workloads.steady(scale, n_prompts=48, every_ms=500.0, mix=workloads.CHAT_MIX, label="chat"),
        workloads.kv_pressure(scale),
        workloads.wave(8, 8, 16, scale),
        workloads.wave(32, 4, 16, scale),
        workloads.wave(62, 2, 16, scale),
        workloads.wave(32, 8, 6, scale),
    ]


def run_one(pol: dict, load: workloads.Workload, fit: metrics.StepTimeModel, model_dir, async_scheduling=False) -> dict:
    spec = spec_for(pol, load)
    if async_scheduling:
        spec = h.dataclasses.replace(spec, async_scheduling=True)
    step_time = functools.partial(fit.record_ms, scale=float(load.scale))
    started = time.perf_counter()
    run = h.run_workload(spec, load.requests, model_dir, max_steps=50_000, step_time=step_time)
    m = metrics.run_metrics(run, load, model=fit)
    cum = metrics._prefix(fit.step_times(run, float(load.scale)))
    by_request = metrics.ttft_ms_by_request(run, load, cum)
    classes = {name: m["ttft_by_class"][name]["model_ms"]["mean"] for name in m["ttft_by_class"]}
    longs = dict(load.classes).get("long", ())
    return {
        "workload": load.name,
        "kind": load.kind,
        "policy": pol["name"],
        "family": pol["family"],
        "fit": fit.name,
        "aging": pol.get("aging"),
        "wall_s": round(time.perf_counter() - started, 2),
        "unfinished": m["unfinished"],
        "preemptions": m["preemptions"],
        "itl_p99_ms": m["itl_model_ms"]["p99"],
        "itl_mean_ms": m["itl_model_ms"]["mean"],
        "ttft_mean_ms": m["ttft_model_ms"]["mean"],
        "class_mean_ms": classes,
        "long_ttft_ms": {rid: round(by_request[rid], 1) for rid in longs if rid in by_request},
        "max_prefill_tokens_in_decode_step": m["max_prefill_tokens_in_decode_step"],
        "max_mid_prefill": m["max_mid_prefill"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="1/16")
    ap.add_argument("--fit", default="both", choices=("mixed", "solo", "both"))
    ap.add_argument("--workloads", default="all", choices=("all", "curve", "targets"))
    ap.add_argument(
        "--curve", action="store_true", help="also the knob sweeps of stock+thr (threshold) and v2/v3 (cap)"
    )
    ap.add_argument("--async-scheduling", action="store_true", help="drive AsyncScheduler instead of Scheduler")
    ap.add_argument("--policies", default="", help="comma-separated policy names to keep (default: all)")
    ap.add_argument("--only-mode3", action="store_true", help="only mode 3 (to add k values to an earlier run)")
    ap.add_argument("--aging", default=",".join(f"{k:g}" for k in AGINGS))
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "results" / "srpt-srpt.json")
    args = ap.parse_args(argv)
    scale = scheduler_bench.parse_scale(args.scale)
    model_dir = scheduler_bench.prepare()
    fits = list(FITS.values()) if args.fit == "both" else [FITS[args.fit]]
    pols = policies(tuple(float(k) for k in args.aging.split(",")), args.curve, args.only_mode3)
    if args.policies:
        keep = set(args.policies.split(","))
        pols = [pol for pol in pols if pol["name"] in keep]
    rows = []
    for fit in fits:
        for load in selected_workloads(scale, args.workloads):
            for pol in pols:
                row = run_one(pol, load, fit, model_dir, args.async_scheduling)
                row["scheduler"] = "AsyncScheduler" if args.async_scheduling else "Scheduler"
                rows.append(row)
                print(
                    f"{fit.name:9s} {load.name[:36]:36s} {pol['name']:14s} itl99={row['itl_p99_ms']} "
                    f"cls={row['class_mean_ms']} unf={len(row['unfinished'])} {row['wall_s']}s",
                    file=sys.stderr,
                    flush=True,
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "scale": str(scale),
                "fits": [f.describe() for f in fits],
                "command": "python bench/srpt_sweep.py " + " ".join(argv or sys.argv[1:]),
                "versions": scheduler_bench.versions(),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    return 0 if not any(r["unfinished"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
