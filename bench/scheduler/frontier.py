"""The trade-off between p99 inter-token time and first-token time, as a frontier: stock vLLM at every
budget x threshold an operator would try, gate mode 3, and gate mode 4 (the time-bounded room) at several
targets, at the recipe's threshold and at 512, per request class, on the real vLLM scheduler with a modelled clock.

    nice -n 10 .venv/bin/python -m bench.scheduler.frontier [--scale 1/16] [--full-points default]
        [--out bench/results/frontier.json] [--svg-dir bench/results] [--fit-min N]

Real vLLM 0.32 `Scheduler`/`AsyncScheduler` (tools/scheduler_harness.py) in the recipe's configuration derived
from the default profile (`recipe_spec`: async scheduling, 6 sequences, block 256, prefix caching; MTP with 5
drafts at the recipe's scale, none at 1/16), budgets and thresholds scaled with the token counts. Time is the
harness's `ModelledClock`: steps run one after the other, each lasting the mixed fit's modelled cost
(bench/scheduler/metrics.py: full-size equivalents), outputs wait for their step's end, arrivals come by that
clock; gate mode 4 reads the same clock, so its fit sees the modelled step times. First token: a request's
arrival to the end of the step that gave its first token; inter-token: between the ends of consecutive steps
that gave a request tokens (with MTP a step gives 1 to 6). `--vllm 0.34.0` runs the same on that release's own
scheduler (its CUDA wheel's Python, tests/support/newest_vllm.py); where the scheduler has vLLM's
`prefill_schedule_interval` (0.32 and 0.34), every stock budget x threshold is also run with the interval at 2.

A stock point is dominated by one of ours when our p99 inter-token time of the decoding streams is equal or
better and no class's mean first token is worse by more than 5 %.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import tempfile
import time
from fractions import Fraction

from bench.scheduler.metrics import MIXED_FIT
from dspark_launch.hotfix import contract
from tools import scheduler_harness as h

BUDGETS = (8192, 4096, 2048, 1024)
THRESHOLDS = (1024, 512)
#: vLLM's own `prefill_schedule_interval` (0.32 and 0.34): 1 is its default; 2 schedules new prefills every other step.
INTERVALS = (1, 2)
TARGETS = (60.0, 75.0, 80.0, 100.0, 150.0, 200.0, 250.0, 300.0, 400.0, 600.0)
#: Our points at vLLM's smaller threshold too (the hotfix bounds a step; vLLM's threshold still cuts each prompt's
#: chunk): mode 3 and the targets that reach the lowest inter-token times.
OUR_SMALL_THRESHOLD = 512
SMALL_THRESHOLD_TARGETS = (60.0, 80.0, 100.0, 150.0)
#: Mode 4 at the default target with a smaller aging knob k (DSPARK_PREFILL_AGING): documents go first sooner,
#: at the short prompts' and cached turns' expense.
AGING_POINTS = (1.0, 1.5)
CLASSES = ("stream", "short", "cached", "document")
#: How much worse a class's mean first token may be for a point of ours to still dominate a stock point.
SLACK = 1.05


def workloads(scale: Fraction) -> dict[str, list[h.RequestSpec]]:
    """Two loads by modelled time (ms), token counts at `scale`: `chat-docs` (3 streams, two cold documents,
    a short prompt every 600 ms, a conversation's next turn every 1.2 s) and `flood-doc` (3 streams, a 30K
    document, short prompts every 300 ms, a conversation's turns every 0.8 s)."""

    def n(tokens: int) -> int:
        return max(2, int(tokens * scale))

    # The streams decode about as long as the prompts keep coming (with MTP a step gives 3.5 tokens on average),
    # so that their inter-token times are those of the steps beside prefill, not of a long tail of decoding.
    out_tokens = 500 if scale != 1 else 1750

    def streams() -> list[h.RequestSpec]:
        return [h.RequestSpec(f"stream-{i}", 0, n(600), out_tokens, arrival_ms=0.0) for i in range(3)]

    def turns(every: float, count: int, start: float) -> list[h.RequestSpec]:
        history = n(6000)
        out = [h.RequestSpec("turn-0", 0, history, 24, "conv", history, arrival_ms=start)]
        for i in range(1, count):
            length = history + i * n(400)
            out.append(h.RequestSpec(f"turn-{i}", 0, length, 24, "conv", length, arrival_ms=start + every * i))
        return out

    chat = streams() + [
        h.RequestSpec("doc-0", 0, n(24000), 8, arrival_ms=400.0),
        h.RequestSpec("doc-1", 0, n(12000), 8, arrival_ms=7000.0),
    ]
    chat += [h.RequestSpec(f"short-{i}", 0, n(300 + 97 * i % 500), 8, arrival_ms=300.0 + 600.0 * i) for i in range(20)]
    chat += turns(1200.0, 10, 100.0)
    flood = streams() + [h.RequestSpec("doc-0", 0, n(30000), 8, arrival_ms=500.0)]
    flood += [
        h.RequestSpec(f"short-{i}", 0, n(200 + 131 * i % 700), 8, arrival_ms=200.0 + 300.0 * i) for i in range(36)
    ]
    flood += turns(800.0, 12, 50.0)
    return {"chat-docs": chat, "flood-doc": flood}


def class_of(req_id: str) -> str | None:
    for prefix, name in (("stream-", "stream"), ("short-", "short"), ("doc-", "document"), ("turn-", "cached")):
        if req_id.startswith(prefix):
            return None if req_id == "turn-0" else name
    return None


def spec_for(point: dict, scale: Fraction) -> h.SchedulerSpec:
    kw: dict = {}
    if scale != 1:
        kw["num_speculative_tokens"] = 0
    if point["policy"] == "stock":
        if point.get("interval", 1) != 1:
            kw["scheduler_options"] = (("prefill_schedule_interval", point["interval"]),)
        return h.recipe_spec(
            scale,
            policy="stock",
            max_num_batched_tokens=max(1, int(point["budget"] * scale)),
            long_prefill_token_threshold=max(1, int(point["threshold"] * scale)),
            **kw,
        )
    env = [(contract.ENV_GATE_MODE, str(point["mode"]))]
    if point["mode"] == 4:
        env.append((contract.ENV_TARGET_STEP_MS, "%g" % point["target_ms"]))
    if "aging" in point:
        env.append((contract.ENV_AGING, "%g" % point["aging"]))
    if "threshold" in point:
        kw["long_prefill_token_threshold"] = max(1, int(point["threshold"] * scale))
    return h.recipe_spec(scale, extra_env=tuple(env), **kw)


def has_prefill_schedule_interval() -> bool:
    """Whether the installed vLLM's SchedulerConfig has `prefill_schedule_interval` (0.32 and 0.34 do)."""
    import dataclasses

    from vllm.config import SchedulerConfig

    return any(f.name == "prefill_schedule_interval" for f in dataclasses.fields(SchedulerConfig))


def points(intervals: tuple[int, ...] = (1,)) -> list[dict]:
    out = [
        {
            "name": f"stock b{b} t{t}" + (f" i{i}" if i != 1 else ""),
            "policy": "stock",
            "budget": b,
            "threshold": t,
            "interval": i,
        }
        for i in intervals
        for b in BUDGETS
        for t in THRESHOLDS
    ]
    out.append({"name": "mode 3", "policy": "patched", "mode": 3})
    out += [{"name": f"mode 4 @{t:g}ms", "policy": "patched", "mode": 4, "target_ms": t} for t in TARGETS]
    small = f" t{OUR_SMALL_THRESHOLD}"
    out.append({"name": "mode 3" + small, "policy": "patched", "mode": 3, "threshold": OUR_SMALL_THRESHOLD})
    out += [
        {
            "name": f"mode 4 @{t:g}ms{small}",
            "policy": "patched",
            "mode": 4,
            "target_ms": t,
            "threshold": OUR_SMALL_THRESHOLD,
        }
        for t in SMALL_THRESHOLD_TARGETS
    ]
    default = contract.DEFAULT_TARGET_STEP_MS
    out += [
        {"name": f"mode 4 @{default:g}ms k{k:g}", "policy": "patched", "mode": 4, "target_ms": default, "aging": k}
        for k in AGING_POINTS
    ]
    return out


def _pct(values: list[float], q: float) -> float | None:
    return round(h.percentile(values, q), 1) if values else None


def measure(point: dict, load: list[h.RequestSpec], scale: Fraction, model_dir) -> dict:
    spec = spec_for(point, scale)
    started = time.process_time()
    result = h.run_workload(
        spec,
        load,
        model_dir,
        step_time=lambda r: MIXED_FIT.record_ms(r, float(scale)),
        clock=h.ModelledClock(),
        max_steps=20000,
    )
    end = {r.step: r.end_ms for r in result.steps}
    arrival = {r.req_id: r.arrival_ms for r in load}
    classes: dict[str, dict] = {}
    for name in CLASSES:
        ids = [r.req_id for r in load if class_of(r.req_id) == name]
        ttft = [end[result.token_steps[r][0]] - arrival[r] for r in ids if result.token_steps.get(r)]
        itl = [end[b] - end[a] for r in ids for a, b in zip(result.token_steps[r], result.token_steps[r][1:])]
        classes[name] = {
            "n": len(ids),
            "ttft_mean_ms": round(sum(ttft) / len(ttft), 1) if ttft else None,
            "ttft_p90_ms": _pct(ttft, 90),
            "itl_p99_ms": _pct(itl, 99),
            "itl_max_ms": round(max(itl), 1) if itl else None,
        }
    mixed = [MIXED_FIT.record_ms(r, float(scale)) for r in result.steps if r.decode_tokens and r.prefill_tokens]
    documents = {
        r.req_id: document_life(result, r.req_id, r.arrival_ms or 0.0, float(scale))
        for r in load
        if class_of(r.req_id) == "document" and result.token_steps.get(r.req_id)
    }
    return {
        **point,
        "finished": len(result.finished),
        "requests": len(load),
        "steps": len(result.steps),
        "preemptions": result.preemptions,
        "classes": classes,
        "mixed_step_ms_p99": _pct(mixed, 99),
        "mixed_step_ms_max": round(max(mixed), 1) if mixed else None,
        "document_life": documents,
        "cpu_s": round(time.process_time() - started, 1),
    }


def document_life(result: h.RunResult, doc: str, arrival_ms: float, scale: float) -> dict:
    """Where a document's wait for its first token went, in modelled ms over the steps scheduled from its
    arrival to the step that gave its first token: its own prefill, the other prompts' prefill, and the rest
    of each step (the constant and the decoding requests: what every step pays, so more, shorter steps pay
    it more often)."""
    first = result.token_steps[doc][0]
    steps = [r for r in result.steps if r.step <= first and (r.scheduled_ms or 0.0) >= arrival_ms]
    own = other = total = 0.0
    for record in steps:
        total += MIXED_FIT.record_ms(record, scale)
        chunks = MIXED_FIT.chunks_ms(record, scale)
        own += chunks.pop(doc, 0.0)
        other += sum(chunks.values())
    return {
        "steps": len(steps),
        "span_ms": round(total, 1),
        "own_prefill_ms": round(own, 1),
        "other_prefill_ms": round(other, 1),
        "per_step_ms": round(total - own - other, 1),
    }


def dominates(ours: dict, stock: dict) -> bool:
    """Our p99 inter-token time of the streams equal or better, no class's mean first token worse by > 5 %."""
    if ours["classes"]["stream"]["itl_p99_ms"] > stock["classes"]["stream"]["itl_p99_ms"]:
        return False
    for name in CLASSES:
        a, b = ours["classes"][name]["ttft_mean_ms"], stock["classes"][name]["ttft_mean_ms"]
        if a is not None and b is not None and a > SLACK * b:
            return False
    return True


def verdicts(runs: list[dict]) -> list[dict]:
    """For every stock point: which of ours dominate it, or why none does (the class and ratio that stop the
    closest point of ours with equal or better p99 inter-token time)."""
    ours = [r for r in runs if r["policy"] != "stock"]
    out = []
    for stock in (r for r in runs if r["policy"] == "stock"):
        by = [o["name"] for o in ours if dominates(o, stock)]
        row: dict = {"stock": stock["name"], "dominated_by": by}
        if not by:
            itl = stock["classes"]["stream"]["itl_p99_ms"]
            eligible = [o for o in ours if o["classes"]["stream"]["itl_p99_ms"] <= itl]
            if not eligible:
                best = min(ours, key=lambda o: o["classes"]["stream"]["itl_p99_ms"])
                row["why"] = (
                    f"none of ours reaches its p99 inter-token time {itl} ms "
                    f"(lowest: {best['name']} {best['classes']['stream']['itl_p99_ms']} ms)"
                )
            else:

                def worst(o: dict) -> tuple[float, str]:
                    return max(
                        (o["classes"][c]["ttft_mean_ms"] / stock["classes"][c]["ttft_mean_ms"], c)
                        for c in CLASSES
                        if o["classes"][c]["ttft_mean_ms"] and stock["classes"][c]["ttft_mean_ms"]
                    )

                closest = min(eligible, key=worst)
                ratio, name = worst(closest)
                row["why"] = (
                    f"at equal or better p99 inter-token time the closest, {closest['name']}, has the "
                    f"{name} class's mean first token at {ratio:.2f}x"
                )
        out.append(row)
    return out


def ratios(runs: list[dict], name: str, base: str = "stock b8192 t1024") -> dict:
    """`name` over the recipe's stock point, per class: mean first token and p99 inter-token time."""
    a = next(r for r in runs if r["name"] == name)
    b = next(r for r in runs if r["name"] == base)
    out = {}
    for c in CLASSES:
        pair = {}
        for key in ("ttft_mean_ms", "itl_p99_ms"):
            x, y = a["classes"][c][key], b["classes"][c][key]
            pair[key] = round(x / y, 3) if x is not None and y else None
        out[c] = pair
    return out


def svg(title: str, runs: list[dict]) -> str:
    """One panel per class: mean first token (x, ms) against the streams' p99 inter-token time (y, ms)."""
    width, height, pad = 300, 260, 46
    panels = [c for c in CLASSES if c != "stream"] + ["stream"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width * len(panels)}" height="{height + 40}" '
        f'font-family="sans-serif" font-size="10">',
        f'<text x="8" y="16" font-size="13">{title}: streams\' p99 inter-token (ms, y) against each class\'s '
        f"mean first token (ms, x); grey stock (budget x threshold), blue mode 3, red mode 4 by target</text>",
    ]
    colour = {"stock": "#888", 3: "#1f5fbf", 4: "#c0392b"}
    for i, c in enumerate(panels):
        pts = [
            (r["classes"][c]["ttft_mean_ms"], r["classes"]["stream"]["itl_p99_ms"], r)
            for r in runs
            if r["classes"][c]["ttft_mean_ms"] is not None
        ]
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        x0, x1 = min(xs) * 0.9, max(xs) * 1.1
        y0, y1 = 0.0, max(ys) * 1.1
        ox = i * width

        def px(x: float) -> float:
            return ox + pad + (x - x0) / (x1 - x0 or 1) * (width - pad - 10)

        def py(y: float) -> float:
            return 30 + height - pad - (y - y0) / (y1 - y0 or 1) * (height - pad - 20)

        parts.append(f'<text x="{ox + pad}" y="40" font-size="12">{c}</text>')
        parts.append(f'<line x1="{ox + pad}" y1="{py(y0)}" x2="{ox + width - 10}" y2="{py(y0)}" stroke="#000"/>')
        parts.append(f'<line x1="{ox + pad}" y1="{py(y0)}" x2="{ox + pad}" y2="{py(y1)}" stroke="#000"/>')
        for v in (x0, (x0 + x1) / 2, x1):
            parts.append(f'<text x="{px(v) - 12:.1f}" y="{py(y0) + 14:.1f}">{v:.0f}</text>')
        for v in (y1 / 2, y1):
            parts.append(f'<text x="{ox + 4}" y="{py(v) + 3:.1f}">{v:.0f}</text>')
        line = sorted(
            (p for p in pts if p[2].get("mode") == 4 and "aging" not in p[2] and "threshold" not in p[2]),
            key=lambda p: p[2]["target_ms"],
        )
        if len(line) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in line)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour[4]}" stroke-width="1"/>')
        for x, y, r in pts:
            key = "stock" if r["policy"] == "stock" else r["mode"]
            label = r["name"].replace("stock ", "").replace("mode 4 @", "")
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour[key]}"><title>{r["name"]}: '
                f"{x} ms, {y} ms</title></circle>"
            )
            parts.append(
                f'<text x="{px(x) + 4:.1f}" y="{py(y) - 3:.1f}" font-size="7" fill="{colour[key]}">{label}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="1/16", help="token counts' scale: 1/16 (every point) or 1")
    parser.add_argument("--names", default="", help="comma-separated point names to run (default: every point)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/frontier.json"))
    parser.add_argument("--svg-dir", type=pathlib.Path, default=None, help="write one SVG per workload here")
    parser.add_argument("--svg-suffix", default="", help="appended to each SVG's name (e.g. -vllm-0.34.0)")
    parser.add_argument("--vllm", default="", help="run on this vLLM release's own scheduler (e.g. 0.34.0)")
    parser.add_argument(
        "--fit-min",
        type=int,
        default=0,
        help="research: mode 4's warm-up (samples before every term of its fit is used; the patch's is "
        f"{contract.TIME_FIT_MIN_SAMPLES}) in the code this run patches in; the shipped patch is unchanged",
    )
    args = parser.parse_args(argv)
    if args.vllm:
        return _on_release(args.vllm, list(argv if argv is not None else sys.argv[1:]))
    if args.fit_min < 0:
        parser.error(f"--fit-min {args.fit_min}: a number of samples, at least 1 (0: the patch's own)")
    if args.fit_min:
        contract.TIME_FIT_MIN_SAMPLES = args.fit_min  # read when the harness patches the scheduler
    scale = Fraction(args.scale)
    wanted = {n.strip() for n in args.names.split(",") if n.strip()}
    model_dir = h.prepare_environment(tempfile.mkdtemp(prefix="dspark-frontier-"))
    import vllm

    intervals = INTERVALS if has_prefill_schedule_interval() else (1,)
    doc: dict = {
        "vllm": vllm.__version__,
        "scale": str(scale),
        "mtp": scale == 1,
        "config": {k: str(v) for k, v in vars(h.recipe_config()).items()},
        "step_time_model": MIXED_FIT.describe(),
        "slack": SLACK,
        "fit_min_samples": contract.TIME_FIT_MIN_SAMPLES,
        "workloads": {},
    }
    for wname, load in workloads(scale).items():
        runs = []
        for point in points(intervals):
            if wanted and point["name"] not in wanted:
                continue
            run = measure(point, load, scale, model_dir)
            runs.append(run)
            print(
                wname,
                point["name"],
                json.dumps({c: run["classes"][c] for c in CLASSES}),
                run["preemptions"],
                run["cpu_s"],
                flush=True,
            )
        entry: dict = {"runs": runs}
        if any(r["policy"] == "stock" for r in runs) and any(r["policy"] != "stock" for r in runs):
            entry["verdicts"] = verdicts(runs)
        names = {r["name"] for r in runs}
        if "stock b8192 t1024" in names:
            entry["over_recipe_stock"] = {n: ratios(runs, n) for n in sorted(names) if not n.startswith("stock")}
        doc["workloads"][wname] = entry
        if args.svg_dir is not None:
            args.svg_dir.mkdir(parents=True, exist_ok=True)
            tag = "sixteenth" if scale != 1 else "recipe"
            (args.svg_dir / f"frontier-{wname}-{tag}{args.svg_suffix}.svg").write_text(
                svg(f"{wname} at {'1/16' if scale != 1 else 'the recipe scale, MTP 5'}", runs), encoding="utf-8"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(doc, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v) + "\n",
        encoding="utf-8",
    )
    return 0


def _on_release(version: str, argv: list[str]) -> int:
    """This bench again in a child whose vLLM is `version`'s own Python (unpacked once)."""
    import os
    import subprocess

    from tests.support import newest_vllm

    rest, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--vllm":
            skip = True
        elif not arg.startswith("--vllm="):
            rest.append(arg)
    from tests.support.paths import REPO

    env = newest_vllm.environ(version)
    env["PYTHONPATH"] = os.pathsep.join((env["PYTHONPATH"], str(REPO)))
    return subprocess.run([sys.executable, "-m", "bench.scheduler.frontier", *rest], env=env, cwd=REPO).returncode


if __name__ == "__main__":
    raise SystemExit(main())
