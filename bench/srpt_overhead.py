#!/usr/bin/env python3
"""Issue 23: `schedule()` overhead of gate mode 3 at 256 running / 1,024
waiting (and 6 / 16), against stock with the threshold, with the A/A and
copy controls of bench/scheduler/overhead.py, plus the per-step plan of
mode 3 timed directly with a free seat (so that it also looks at the first
waiting requests, which the scenario's full `max_num_seqs` skips).

    python bench/srpt_overhead.py [--reps 400] [--out bench/results/srpt-overhead.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scheduler import overhead, scheduler_bench  # noqa: E402
from bench.scheduler import policies as p  # noqa: E402


def plan_us(model_dir, running: int = 256, waiting: int = 1024, calls: int = 2000) -> dict:
    """Microseconds per call of mode 3's plan, with one seat free."""
    sched = overhead._build(model_dir, p.hotfix(1, 3), running, waiting, 64)
    module = sys.modules[type(sched).__module__]
    sched.max_num_running_reqs += 1  # a free seat: the plan looks at the waiting queue too
    try:
        module._dspark_hotfix_plan(sched)  # first sight: one prefix-cache lookup per request looked at
        gc.disable()
        started = time.perf_counter_ns()
        for _ in range(calls):
            plan = module._dspark_hotfix_plan(sched)
        elapsed = time.perf_counter_ns() - started
    finally:
        gc.enable()
        sched.max_num_running_reqs -= 1
    return {
        "running": running,
        "waiting": waiting,
        "plan_us": round(elapsed / calls / 1000.0, 3),
        "reserved_for_waiting": len(sched._dspark_reserved),
        "running_in_plan": len(plan),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "results" / "srpt-overhead.json")
    args = ap.parse_args(argv)
    model_dir = scheduler_bench.prepare()
    pols = p.overhead_policies(1, 3)[:3] + [p.hotfix(1, 2), p.hotfix(1, 3)]
    result = {
        "command": "python bench/srpt_overhead.py " + " ".join(argv or sys.argv[1:]),
        "versions": scheduler_bench.versions(),
        "schedule": overhead.measure(model_dir, pols, reps_small=max(args.reps, 1000), reps_large=args.reps),
        "plan": plan_us(model_dir),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for sc in result["schedule"]["scenarios"]:
        for row in sc["policies"]:
            print(sc["running"], sc["waiting"], row)
    print(result["plan"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
