"""Issue 29: patch v6 against stock vLLM, patch v2's gate (mode 1) and patch v5,
per request class, at the recipe's scale with MTP and at 1/16 scale.

    .venv/bin/python -m bench.scheduler.recipe_comparison [--out bench/results/recipe-comparison.json]

Real vLLM 0.32 `Scheduler` and `AsyncScheduler` (tools/scheduler_harness.py),
the recipe's scheduler configuration derived from the default profile
(`recipe_spec`). Time is modelled (bench/scheduler/metrics.py: the mixed fit,
the solo fit as the sensitivity check): first-token time from the start of the
arrival step to the end of the step that gave the first token, inter-token
time between consecutive steps that gave a stream tokens (with MTP a step
gives 1 to 6 tokens). `schedule()` overhead is wall time on this shared CPU
(noisy). Classes: `stream` (decoding streams), `short` (cold short prompts),
`cached` (a conversation's next turn: its history cached, a short tail),
`document` (cold long prompts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import tempfile
import time
from fractions import Fraction

from bench.scheduler.metrics import MIXED_FIT, SOLO_FIT, StepTimeModel
from dspark_launch.hotfix import contract
from tools import scheduler_harness as h

POLICIES = ("stock", "v2", "v5", "v6")


def workload(scale: Fraction) -> tuple[list[h.RequestSpec], dict[str, list[str]]]:
    """3 chat streams; two cold documents; a short prompt every 9 steps; a
    conversation whose next turn (history cached, a 200-token tail) comes
    every 12 steps. Token counts are the recipe's times `scale`."""

    def n(tokens: int) -> int:
        return max(2, int(tokens * scale))

    load = [h.RequestSpec(f"stream-{i}", 0, n(600), 240) for i in range(3)]
    load += [h.RequestSpec("doc-0", 4, n(24000), 8), h.RequestSpec("doc-1", 60, n(12000), 8)]
    load += [h.RequestSpec(f"short-{i}", 6 + 9 * i, n(300 + 97 * i % 500), 16) for i in range(14)]
    history = n(6000)
    load.append(h.RequestSpec("turn-0", 1, history, 24, prefix_group="conv", shared_prefix_len=history))
    for i in range(1, 10):
        length = history + i * n(400)
        load.append(h.RequestSpec(f"turn-{i}", 12 * i, length, 24, prefix_group="conv", shared_prefix_len=length))
    classes = {
        "stream": [r.req_id for r in load if r.req_id.startswith("stream-")],
        "short": [r.req_id for r in load if r.req_id.startswith("short-")],
        "cached": [r.req_id for r in load if r.req_id.startswith("turn-") and r.req_id != "turn-0"],
        "document": ["doc-0", "doc-1"],
    }
    return load, classes


def spec_for(policy: str, scale: Fraction, async_scheduling: bool, mtp: bool, v5_script: str) -> h.SchedulerSpec:
    kw = dict(async_scheduling=async_scheduling)
    if not mtp:
        kw["num_speculative_tokens"] = 0
    if policy == "stock":
        return h.recipe_spec(scale, policy="stock", **kw)
    mode = {"v2": 1, "v5": contract.DEFAULT_GATE_MODE, "v6": contract.DEFAULT_GATE_MODE}[policy]
    return h.recipe_spec(
        scale,
        extra_env=((contract.ENV_GATE_MODE, str(mode)),),
        patch_script=v5_script if policy == "v5" else None,
        **kw,
    )


def _pct(values: list[float], q: float) -> float | None:
    return round(h.percentile(values, q), 1) if values else None


def measure(run: h.RunResult, classes: dict[str, list[str]], scale: Fraction, model: StepTimeModel) -> dict:
    cum = [0.0]
    for record in run.steps:
        cum.append(cum[-1] + model.record_ms(record, float(scale)))
    arrival = run.arrival
    out = {}
    for name, ids in classes.items():
        ttft = [cum[run.token_steps[r][0] + 1] - cum[arrival[r]] for r in ids if run.token_steps.get(r)]
        itl = [cum[b + 1] - cum[a + 1] for r in ids for a, b in zip(run.token_steps[r], run.token_steps[r][1:])]
        out[name] = {
            "ttft_mean_ms": round(sum(ttft) / len(ttft), 1) if ttft else None,
            "ttft_p90_ms": _pct(ttft, 90),
            "itl_p99_ms": _pct(itl, 99),
            "itl_max_ms": round(max(itl), 1) if itl else None,
        }
    return out


def run_one(spec: h.SchedulerSpec, load, classes, scale: Fraction, model_dir) -> dict:
    sched = h.build_scheduler(spec, model_dir)
    real = sched.schedule
    spent = []

    def timed():
        t = time.perf_counter()
        out = real()
        spent.append(time.perf_counter() - t)
        return out

    sched.schedule = timed
    result = h.run_workload(spec, load, model_dir, scheduler=sched)
    return {
        "finished": len(result.finished),
        "requests": len(result.workload),
        "steps": len(result.steps),
        "preemptions": result.preemptions,
        "schedule_us_mean": round(1e6 * sum(spent) / len(spent), 1),
        "classes": measure(result, classes, scale, MIXED_FIT),
        "classes_solo_fit": measure(result, classes, scale, SOLO_FIT),
    }


def ratios(results: dict) -> dict:
    """v6 / stock per class: mean first-token time and p99 inter-token time."""
    out = {}
    for kind, policies in results.items():
        base, new = policies["stock"]["classes"], policies["v6"]["classes"]
        out[kind] = {
            name: {
                "ttft_mean": _ratio(new[name]["ttft_mean_ms"], base[name]["ttft_mean_ms"]),
                "itl_p99": _ratio(new[name]["itl_p99_ms"], base[name]["itl_p99_ms"]),
            }
            for name in base
        }
    return out


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/recipe-comparison.json"))
    args = parser.parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="dspark-i29-bench-"))
    model_dir = h.prepare_environment(work)
    v5 = h.released_patch(5, work)
    results: dict = {}
    for label, scale, mtp in (("recipe+mtp", Fraction(1), True), ("1/16", Fraction(1, 16), False)):
        load, classes = workload(scale)
        for async_scheduling in (True, False):
            kind = f"{label}/{'AsyncScheduler' if async_scheduling else 'Scheduler'}"
            results[kind] = {}
            for policy in POLICIES:
                spec = spec_for(policy, scale, async_scheduling, mtp, str(v5))
                try:
                    results[kind][policy] = run_one(spec, load, classes, scale, model_dir)
                except AssertionError as exc:  # v5's crash under MTP
                    results[kind][policy] = {"crashed": f"AssertionError in schedule(): {exc!s}"[:200]}
                print(kind, policy, json.dumps(results[kind][policy].get("classes", results[kind][policy])), flush=True)
    doc = {
        "config": dataclasses.asdict(h.recipe_config()),
        "step_time_model": MIXED_FIT.describe(),
        "sensitivity_model": SOLO_FIT.describe(),
        "policies": {
            "stock": "vLLM 0.32 as installed, the recipe's threshold",
            "v2": "gate mode 1 (patch v2's gate) of patch v6",
            "v5": "the released v5 script, gate mode 3",
            "v6": "patch v6, gate mode 3 (the default)",
        },
        "results": results,
        "v6_over_stock": ratios(results),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(doc["v6_over_stock"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
