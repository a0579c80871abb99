"""What one run of the workload measured, per class: first token, inter-token time, decode speed, errors."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from dspark_launch.tune.loadgen import Outcome


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True, kw_only=True)
class ClassStats:
    """One class of one run. Seconds; None where no request of the class got that far."""

    requests: int  # sent
    ok: int
    errors: int
    cut: int  # ended by the time bound or an interrupt
    prompt_tokens_mean: float | None  # as the server counted them
    completion_tokens: int
    ttft_mean_s: float | None
    ttft_p90_s: float | None
    itl_p50_s: float | None  # between consecutive chunks with text (one per step; a step may carry several tokens)
    itl_p99_s: float | None
    itl_max_s: float | None
    decode_tok_s_per_stream: float | None  # mean over streams of (tokens - 1) / (last chunk - first chunk)
    decode_tok_s: float | None  # the class's tokens / the time from its first request sent to its last chunk

    def to_data(self) -> dict:
        return asdict(self)


def class_stats(outcomes: Sequence[Outcome]) -> ClassStats:
    done = [o for o in outcomes if o.ok]
    ttft = [o.chunks[0] - o.sent for o in done]
    gaps = [b - a for o in done for a, b in zip(o.chunks, o.chunks[1:])]
    per_stream = []
    for o in done:
        tokens = o.completion_tokens or len(o.chunks)
        if len(o.chunks) > 1 and o.chunks[-1] > o.chunks[0]:
            per_stream.append((tokens - 1) / (o.chunks[-1] - o.chunks[0]))
    tokens = sum(o.completion_tokens or len(o.chunks) for o in done)
    span = (max(o.chunks[-1] for o in done) - min(o.sent for o in done)) if done else 0.0
    prompts = [o.prompt_tokens for o in done if o.prompt_tokens is not None]
    return ClassStats(
        requests=len(outcomes),
        ok=len(done),
        errors=sum(1 for o in outcomes if not o.ok and not o.cut),
        cut=sum(1 for o in outcomes if o.cut),
        prompt_tokens_mean=_mean(prompts),
        completion_tokens=tokens,
        ttft_mean_s=_mean(ttft),
        ttft_p90_s=percentile(ttft, 90),
        itl_p50_s=percentile(gaps, 50),
        itl_p99_s=percentile(gaps, 99),
        itl_max_s=max(gaps) if gaps else None,
        decode_tok_s_per_stream=_mean(per_stream),
        decode_tok_s=tokens / span if span > 0 else None,
    )


@dataclass(frozen=True)
class RunStats:
    """A whole run: each class, and the streams of every class together."""

    classes: dict[str, ClassStats]
    all: ClassStats
    seconds: float
    first_errors: tuple[str, ...] = ()  # up to three distinct error texts, for the operator
    requests: tuple[dict, ...] = ()  # each request: class, index, status, tokens, first token, error

    def to_data(self) -> dict:
        return {
            "seconds": round(self.seconds, 3),
            "classes": {k: v.to_data() for k, v in self.classes.items()},
            "all": self.all.to_data(),
            "first_errors": list(self.first_errors),
            "requests": list(self.requests),
        }


def request_data(o: Outcome) -> dict:
    return {
        "class": o.klass,
        "index": o.index,
        "status": o.status,
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "chunks": len(o.chunks),
        "ttft_s": round(o.chunks[0] - o.sent, 4) if o.chunks else None,
        "error": o.error,
        "cut": o.cut,
    }


def run_stats(names: Sequence[str], outcomes: Sequence[Outcome], seconds: float) -> RunStats:
    errors = []
    for o in outcomes:
        if o.error and o.error not in errors and len(errors) < 3:
            errors.append(o.error)
    return RunStats(
        {name: class_stats([o for o in outcomes if o.klass == name]) for name in names},
        class_stats(outcomes),
        seconds,
        tuple(errors),
        tuple(request_data(o) for o in outcomes),
    )
