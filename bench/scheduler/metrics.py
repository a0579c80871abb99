"""Metrics of one benchmark run, and the step-time model (a MODEL, not a measurement).

Step-time model
---------------
No GPU runs here, so time is modelled from the published GB10 numbers in
``../shared/anchors.md`` (two GB10s, DeepSeek-V4-Flash, TP=2, MTP 5). One step
costs::

    t(step) = T0 + T_DEC * decode_requests
              + sum over prefill chunks of  n * (ALPHA + BETA * (s + n / 2))

where a prefill chunk covers prompt positions ``s .. s+n`` (attention over the
``s + n/2`` tokens before its average position). Counts are full-size
equivalents: scaled token counts are divided by the workload's scale.

Fit ("mixed" fit, the default):

* decode-only steps: 12 to 16 ms per step for one stream (62 to 83 tok/s at
  any context up to 128K) and about 160 to 190 tok/s for six short chats:
  ``T0 = 11 ms`` and ``T_DEC = 3.3 ms`` per decoding request give 14.3 ms
  (70 tok/s) for one stream and 30.8 ms (195 tok/s aggregate) for six.
* mixed steps: four or six streams beside a cold 32K prefill sit on an ~8 tok/s
  floor, about 125 ms per step with one 1024-token chunk; a 1024-token chunk
  at 400K context takes about 577 ms. With five decoders (27.5 ms) and the
  32K chunk's mean position 16K: ``1024 (ALPHA + 16384 BETA) = 97.5 ms`` and
  ``1024 (ALPHA + 409600 BETA) = 563 ms`` give ``ALPHA = 0.0763 ms`` per
  prefill token and ``BETA = 1.156e-6 ms`` per token of context.

What it does not fit: the published solo-prefill TTFTs (0.81 s at 2K, 4.8 s at
8K, 23 s at 32K, 79 s at 128K, 1,029 s for 900K) are 2 to 7 times slower than
this model predicts (3.2 s for 32K). An alternative "solo" fit (``ALPHA = 0.6 ms``,
``BETA = 1.2e-9 ms``: 20 s at 32K, 79 s at 128K) makes prefill tokens, not
steps, dominate; the benchmark reports its mean TTFT too, as a sensitivity
check. Neither fit models speculative-decode acceptance, network jitter or
the KV transfer cost of preemption.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from bench.scheduler.workloads import Workload
from tools.scheduler_harness import RunResult, StepRecord, percentile


@dataclasses.dataclass(frozen=True)
class StepTimeModel:
    name: str
    t0_ms: float
    t_decode_ms: float
    alpha_ms: float
    beta_ms: float

    def describe(self) -> dict:
        return dataclasses.asdict(self)

    def chunks_ms(self, record: StepRecord, scale: float) -> dict[str, float]:
        """Modelled time of each prefill chunk of one step, by request; counts are divided by `scale`."""
        inv = 1.0 / scale
        out = {}
        for rid, n in record.scheduled.items():
            if rid not in record.decode_active:
                s, full = record.start.get(rid, 0) * inv, n * inv
                out[rid] = full * (self.alpha_ms + self.beta_ms * (s + full / 2))
        return out

    def record_ms(self, record: StepRecord, scale: float) -> float:
        """Modelled time of one step; counts are divided by `scale` (full size)."""
        decode = sum(1 for rid in record.scheduled if rid in record.decode_active)
        return self.t0_ms + self.t_decode_ms * decode + sum(self.chunks_ms(record, scale).values())

    def step_times(self, run: RunResult, scale: float) -> list[float]:
        return [self.record_ms(record, scale) for record in run.steps]


MIXED_FIT = StepTimeModel("mixed-fit", t0_ms=11.0, t_decode_ms=3.3, alpha_ms=0.07627, beta_ms=1.1561e-6)
SOLO_FIT = StepTimeModel("solo-fit", t0_ms=11.0, t_decode_ms=3.3, alpha_ms=0.6, beta_ms=1.2e-9)


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _stats(values: Sequence[float], digits: int = 1) -> dict:
    if not values:
        return {"p50": None, "p99": None, "max": None, "mean": None}
    return {
        "p50": round(percentile(values, 50), digits),
        "p99": round(percentile(values, 99), digits),
        "max": round(max(values), digits),
        "mean": round(sum(values) / len(values), digits),
    }


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def ideal_ttft_steps(prompt_len: int, workload: Workload) -> int:
    """Lower bound: the prompt over the budget left beside the decoding streams."""
    room = max(1, workload.budget - workload.n_streams)
    return math.ceil(prompt_len / room)


def ideal_ttft_ms(prompt_len: int, workload: Workload, model: StepTimeModel) -> float:
    """The same bound in modelled time: the prompt alone beside the streams,
    in chunks of the whole budget left."""
    scale = float(workload.scale)
    room = max(1, workload.budget - workload.n_streams)
    total, done = 0.0, 0
    while done < prompt_len:
        n = min(room, prompt_len - done)
        s, full = done / scale, n / scale
        total += model.t0_ms + model.t_decode_ms * workload.n_streams
        total += full * (model.alpha_ms + model.beta_ms * (s + full / 2))
        done += n
    return total


def run_metrics(run: RunResult, workload: Workload, model: StepTimeModel = MIXED_FIT) -> dict:
    """Every number the benchmark reports for one (policy, workload) run.

    `model` is the step-time fit the run's arrivals were timed with (the
    primary numbers); `ttft_solo_fit_ms_mean` is always the solo fit's."""
    scale = float(workload.scale)
    times = model.step_times(run, scale)
    alt_times = SOLO_FIT.step_times(run, scale)
    cum, alt_cum = _prefix(times), _prefix(alt_times)
    totals = _prefix([s.total_tokens for s in run.steps])

    # Latency proxy and modelled inter-token time: every pair of consecutive
    # tokens of every request (a request is a decode-active stream from its
    # first token on), and separately the workload's long-lived streams.
    proxy, itl, proxy_streams, gaps = [], [], [], {}
    for rid, produced in run.token_steps.items():
        for a, b in zip(produced, produced[1:]):
            p = totals[b + 1] - totals[a + 1]
            proxy.append(p)
            itl.append(cum[b + 1] - cum[a + 1])
            if rid.startswith("stream-"):
                proxy_streams.append(p)
        gaps[rid] = max((b - a for a, b in zip(produced, produced[1:])), default=0)

    arrival = run.arrival
    # A request arriving in modelled time waits for the step then running to
    # end before it can be scheduled: its time to first token counts from its
    # arrival, not from the start of the step it joined (heavier steps make
    # that wait longer).
    wait = run.arrival_wait_ms
    prompt_len = {r.req_id: r.prompt_len for r in run.workload}
    ttft_steps, ttft_ms, ttft_alt, ideal_steps, ideal_ms = [], [], [], [], []
    for rid in workload.prompts:
        produced = run.token_steps.get(rid)
        if not produced:
            continue
        a, f = arrival[rid], produced[0]
        ttft_steps.append(f - a + 1)
        ttft_ms.append(cum[f + 1] - cum[a] + wait.get(rid, 0.0))
        ttft_alt.append(alt_cum[f + 1] - alt_cum[a])
        ideal_steps.append(ideal_ttft_steps(prompt_len[rid], workload))
        ideal_ms.append(ideal_ttft_ms(prompt_len[rid], workload, model))

    by_request = ttft_ms_by_request(run, workload, cum)
    by_class = {}
    for name, ids in workload.classes:
        steps_c = [run.token_steps[rid][0] - arrival[rid] + 1 for rid in ids if run.token_steps.get(rid)]
        ms_c = [by_request[rid] for rid in ids if rid in by_request]
        by_class[name] = {"n": len(ms_c), "model_ms": _stats(ms_c), "steps_mean": _mean(steps_c)}

    budget_use = [s.total_tokens / workload.budget for s in run.steps if s.scheduled]
    mid = [len(s.mid_prefill) for s in run.steps]
    stream_ids = [r.req_id for r in run.workload if r.req_id.startswith("stream-")]
    ttft_stats = _stats(ttft_steps)
    mean = _mean
    return {
        "steps": len(run.steps),
        "finished": len(run.finished),
        "requests": len(run.workload),
        "unfinished": sorted(run.unfinished),
        "effective_cap": run.effective_cap,
        "latency_proxy_tokens": _stats(proxy, 0),
        "latency_proxy_streams_tokens": _stats(proxy_streams, 0),
        "itl_model_ms": _stats(itl),
        "preemptions": run.preemptions,
        "longest_gap_steps": max(gaps.values(), default=0),
        "longest_gap_steps_streams": max((gaps.get(r, 0) for r in stream_ids), default=0),
        "ttft_steps": ttft_stats,
        "ttft_ideal_steps_mean": mean(ideal_steps),
        "ttft_over_ideal": round(ttft_stats["mean"] / mean(ideal_steps), 2) if ttft_steps else None,
        "ttft_model_ms": _stats(ttft_ms),
        "ttft_ideal_model_ms_mean": mean(ideal_ms),
        "ttft_solo_fit_ms_mean": mean(ttft_alt),
        "ttft_by_class": by_class,
        "max_mid_prefill": max(mid, default=0),
        "max_partial_prefill_tokens": run.max_partial_prefill_tokens(),
        "max_prefill_tokens_in_decode_step": run.max_prefill_tokens_in_decode_steps(),
        "budget_use": {
            "max": round(max(budget_use), 3) if budget_use else None,
            "mean": round(sum(budget_use) / len(budget_use), 3) if budget_use else None,
            "p50": round(percentile(budget_use, 50), 3) if budget_use else None,
            "full_steps_share": round(sum(u >= 0.99 for u in budget_use) / len(budget_use), 3) if budget_use else None,
        },
        "model_total_s": round(cum[-1] / 1000, 2),
    }


def ttft_ms_by_request(run: RunResult, workload: Workload, cum: Sequence[float] | None = None) -> dict[str, float]:
    """Modelled time to first token of every classed prompt that got one, from
    its arrival (`cum`: the run's cumulative step times, if already known)."""
    if cum is None:
        cum = _prefix(MIXED_FIT.step_times(run, float(workload.scale)))
    arrival, wait = run.arrival, run.arrival_wait_ms
    out = {}
    for _, ids in workload.classes:
        for rid in ids:
            produced = run.token_steps.get(rid)
            if produced:
                out[rid] = cum[produced[0] + 1] - cum[arrival[rid]] + wait.get(rid, 0.0)
    return out


def tokens_per_step(run: RunResult, req_ids: Iterable[str] | None = None) -> dict[str, list[int]]:
    """Scheduled tokens per request per step (for the plot)."""
    wanted = list(run.token_steps) if req_ids is None else list(req_ids)
    return {rid: [s.scheduled.get(rid, 0) for s in run.steps] for rid in wanted}
