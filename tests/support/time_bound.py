"""Gate mode 4 (the time-bounded room) driven by a modelled clock (`scheduler_harness.ModelledClock`): a mixed
load, the benchmark's step cost (bench/scheduler/metrics.py, the mixed fit: full-size equivalents), and what
the controller did step by step. `main()` runs the same under another vLLM in a child process
(tests/support/newest_vllm.py)."""

from __future__ import annotations

import dataclasses
import pathlib
import random
from fractions import Fraction

from bench.scheduler.metrics import MIXED_FIT
from dspark_launch.hotfix import contract
from tools import scheduler_harness as h


def load(scale: Fraction) -> list[h.RequestSpec]:
    """Three streams that decode throughout; a 24K and a 12K document, and a short prompt every 400 ms, by
    modelled time."""

    def n(tokens: int) -> int:
        return max(2, int(tokens * scale))

    out = [h.RequestSpec(f"stream-{i}", 0, n(600), 2400) for i in range(3)]
    out += [
        h.RequestSpec("doc-0", 0, n(24000), 8, arrival_ms=300.0),
        h.RequestSpec("doc-1", 0, n(12000), 8, arrival_ms=6000.0),
    ]
    out += [h.RequestSpec(f"short-{i}", 0, n(300 + 97 * i % 500), 16, arrival_ms=200.0 + 400.0 * i) for i in range(24)]
    return out


def turns_load(scale: Fraction) -> list[h.RequestSpec]:
    """Three streams, a 24K document from 300 ms, and a conversation's turns every 600 ms, each adding 800 tokens
    to the shared history: at 80 ms a turn's uncached part is more than one step's room and less than two."""

    def n(tokens: int) -> int:
        return int(tokens * scale)

    history = n(6000)
    out = [h.RequestSpec(f"stream-{i}", 0, n(600), 600) for i in range(3)]
    out.append(h.RequestSpec("doc", 0, n(24000), 8, arrival_ms=300.0))
    out += [
        h.RequestSpec(f"turn-{i}", 0, history + i * n(800), 8, "conv", history + i * n(800), arrival_ms=200.0 + 600 * i)
        for i in range(6)
    ]
    return out


def borrowed(report: dict, doc: str = "doc") -> list[tuple[str, int, bool]]:
    """The turns that were mid-prefill beside `doc` (in a slot it lent): (turn, steps their prefill took, the one
    that gave the first token included, whether that first token came before the document's)."""
    first = report["first_token"]
    out = []
    for turn in sorted(t for t in first if t.startswith("turn-") and t != "turn-0"):
        prefill = [s for s in report["steps"] if turn in s["ids"] and s["step"] <= first[turn]]
        if any(doc in s["mid"] and turn in s["mid"] for s in prefill):
            out.append((turn, len(prefill), first[turn] < first[doc]))
    return out


def run(
    scale: Fraction,
    async_scheduling: bool,
    mtp: bool,
    target_ms: float,
    model_dir,
    *,
    factor_from: int = 0,
    factor: float = 1.0,
    noise: float = 0.0,
    seed: int = 0,
    lag: int | None = None,
    cost=None,
    workload: list[h.RequestSpec] | None = None,
    mode: int = 4,
    diag: bool = False,
) -> dict:
    """One mode-4 run. The modelled step cost is multiplied by `factor` from step `factor_from` on and by a
    seeded uniform noise of +-`noise`; `lag` overrides the scheduler's own (a wrong attribution, for the
    test that shows why it matters); `cost(record, scale)` replaces the mixed fit."""
    fields = {} if mtp else {"num_speculative_tokens": 0}
    spec = h.recipe_spec(
        scale,
        async_scheduling=async_scheduling,
        **fields,
        extra_env=(
            (contract.ENV_GATE_MODE, str(mode)),
            (contract.ENV_TARGET_STEP_MS, "%g" % target_ms),
            (contract.ENV_DIAG, "1" if diag else "0"),
        ),
    )
    sched = h.build_scheduler(spec, model_dir)
    if lag is not None:
        sched._dspark_lag = lag
    rng = random.Random(seed)
    clean: dict[int, float] = {}
    model = cost or (lambda record, s: MIXED_FIT.record_ms(record, s))

    def step_time(record: h.StepRecord) -> float:
        ms = model(record, float(scale)) * (factor if record.step >= factor_from else 1.0)
        clean[record.step] = ms
        return ms * (1.0 + noise * (2.0 * rng.random() - 1.0))

    state: list[tuple[int | None, bool, int]] = []

    def before(s, step: int) -> None:  # the previous step's room, whether a fit held, samples so far
        state.append((s._dspark_time_room, s._dspark_fit is not None, len(s._dspark_samples)))

    result = h.run_workload(
        spec,
        workload or load(scale),
        model_dir,
        scheduler=sched,
        step_time=step_time,
        clock=h.ModelledClock(),
        before_schedule=before,
    )
    state = state[1:] + [(sched._dspark_time_room, sched._dspark_fit is not None, len(sched._dspark_samples))]
    steps = []
    for record, (room, fitted, samples) in zip(result.steps, state):
        steps.append(
            {
                "step": record.step,
                "ms": clean[record.step],
                "prefill": record.prefill_tokens,
                "decode": record.decode_tokens,
                "decoders": len(record.decode_active),
                "skipped": len(record.decode_skipped),
                "room": room,
                "fitted": fitted,
                "samples": samples,
                "waiting": bool(record.mid_prefill) or any(r not in record.scheduled for r in record.mid_prefill),
                "ids": sorted(record.scheduled),
                "mid": sorted(record.mid_prefill),
            }
        )
    return {
        "vllm": _version(),
        "finished": len(result.finished),
        "requests": len(result.workload),
        "bound": sched._dspark_step_bound,
        "block": spec.block_size,
        "budget": spec.max_num_batched_tokens,
        "fit": list(sched._dspark_fit or ()),
        "note": sched._dspark_fit_note,
        "lag": sched._dspark_lag,
        "cap": sched._dspark_max_inflight_prefills,
        "first_token": {rid: produced[0] for rid, produced in result.token_steps.items() if produced},
        "steps": steps,
    }


def mixed(report: dict, after: int = 0) -> list[dict]:
    """Steps from `after` on that carried prefill beside decoding requests."""
    return [s for s in report["steps"] if s["step"] >= after and s["prefill"] and s["decoders"]]


def fitted_from(report: dict) -> int:
    """The first step planned with a fit."""
    return next((s["step"] for s in report["steps"] if s["room"] is not None), len(report["steps"]))


def _version() -> str:
    import vllm

    return vllm.__version__


def main() -> None:
    """`python -c 'from tests.support.time_bound import main; main()' JOB`: JOB is JSON {"workdir", "cases":
    [{"scale", "async_scheduling", "mtp", "target_ms"[, "workload": "turns"]}, ...]}; one JSON line per case."""
    import json
    import sys

    job = json.loads(sys.argv[1])
    model_dir = h.prepare_environment(pathlib.Path(job["workdir"]))
    for case in job["cases"]:
        case = dict(case)
        scale = Fraction(case.pop("scale"))
        if case.pop("workload", None) == "turns":
            case["workload"] = turns_load(scale)
        print(json.dumps(run(scale, model_dir=model_dir, **case)), flush=True)


__all__ = ["borrowed", "dataclasses", "fitted_from", "load", "main", "mixed", "run", "turns_load"]
