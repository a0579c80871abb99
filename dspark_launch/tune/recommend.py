"""The point to recommend for `--favor latency|throughput|balanced`, from every round's numbers.

Each point has one value per round of the metric that decides; its spread is the range over its rounds.
Two points whose spreads overlap are equal on that metric: among the points equal to the best one, the
tie-break metric decides, and among points equal on both, the lowest cap (the safest for running streams).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from dspark_launch.tune.points import Point
from dspark_launch.tune.stats import RunStats
from dspark_launch.tune.workload import AGENT, CHAT, OPERATOR

FAVORS = ("latency", "throughput", "balanced")
INTERACTIVE = (CHAT, AGENT, OPERATOR)


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    lower_is_better: bool
    of: Callable[[RunStats], float | None]

    def shown(self, value: float) -> str:
        if self.unit == "s":
            return f"{value * 1000:.0f} ms"
        return f"{value:.2f}x" if self.unit == "x" else f"{value:.1f} {self.unit}"


def _chat_ttft(stats: RunStats) -> float | None:
    found = [stats.classes[name].ttft_mean_s for name in INTERACTIVE if name in stats.classes]
    found = [v for v in found if v is not None]
    return sum(found) / len(found) if found else None


P99_ITL = Metric("p99 inter-token time (all streams)", "s", True, lambda s: s.all.itl_p99_s)
TTFT = Metric("mean first token of the interactive classes", "s", True, _chat_ttft)
TOKS = Metric("aggregate decode rate", "tok/s", False, lambda s: s.all.decode_tok_s)


@dataclass(frozen=True)
class Spread:
    low: float
    mid: float  # the median over rounds
    high: float

    def overlaps(self, other: "Spread") -> bool:
        return self.low <= other.high and other.low <= self.high

    def shown(self, metric: Metric) -> str:
        if self.low == self.high:
            return metric.shown(self.mid)
        return f"{metric.shown(self.mid)} ({metric.shown(self.low)}-{metric.shown(self.high)})"


def spread(values: Sequence[float]) -> Spread | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    n = len(values)
    mid = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return Spread(values[0], mid, values[-1])


def _balanced(rounds: dict[Point, list[RunStats]]) -> Metric:
    """The geometric mean, over p99 inter-token time and every class's mean first token, of each value over
    the best point's median (1.0: best at everything)."""
    parts: list[Callable[[RunStats], float | None]] = [P99_ITL.of]
    names = sorted({name for runs in rounds.values() for run in runs for name in run.classes})
    parts += [lambda s, n=name: s.classes[n].ttft_mean_s if n in s.classes else None for name in names]
    best = []
    for part in parts:
        mids = [sp.mid for sp in (spread([part(r) for r in runs]) for runs in rounds.values()) if sp and sp.mid > 0]
        best.append(min(mids) if mids else None)

    def score(stats: RunStats) -> float | None:
        ratios = [part(stats) / ref for part, ref in zip(parts, best) if ref and part(stats)]
        return math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None

    return Metric("balanced score (1.0 = best at p99 inter-token time and every class's first token)", "x", True, score)


@dataclass(frozen=True)
class Recommendation:
    point: Point
    favor: str
    reason: str
    equal: tuple[Point, ...]  # the points equal to the best on the deciding metric

    def to_data(self) -> dict:
        return {
            "point": self.point.key,
            "name": self.point.name,
            "values": self.point.values(),
            "favor": self.favor,
            "reason": self.reason,
            "equal_on_deciding_metric": [p.key for p in self.equal],
        }


def recommend(rounds: dict[Point, list[RunStats]], favor: str) -> Recommendation:
    """`rounds`: each measured point's verified rounds (a point without any is not a candidate)."""
    rounds = {p: runs for p, runs in rounds.items() if runs}
    if not rounds:
        raise ValueError("no point has a verified round")
    decide, then = {
        "latency": (TTFT, P99_ITL),
        "throughput": (TOKS, P99_ITL),
        "balanced": (_balanced(rounds), P99_ITL),
    }[favor]
    spreads = {p: spread([decide.of(r) for r in runs]) for p, runs in rounds.items()}
    measured = {p: s for p, s in spreads.items() if s is not None}
    if not measured:  # nothing decided (every request failed): the lowest cap, said so
        point = min(rounds)
        return Recommendation(point, favor, f"{point.name}: no round measured the {decide.name}; the lowest cap", ())
    sign = 1 if decide.lower_is_better else -1
    best = min(measured, key=lambda p: (sign * measured[p].mid, p))
    equal = tuple(sorted(p for p in measured if p != best and measured[p].overlaps(measured[best])))
    if not equal:
        runner = sorted((p for p in measured if p != best), key=lambda p: sign * measured[p].mid)
        beaten = f"; next {runner[0].name} at {measured[runner[0]].shown(decide)}" if runner else ""
        reason = f"{best.name}: best {decide.name}, {measured[best].shown(decide)}{beaten}, spreads apart"
        return Recommendation(best, favor, reason, ())
    tied = (best, *equal)
    tie = {p: spread([then.of(r) for r in rounds[p]]) for p in tied}
    tsign = 1 if then.lower_is_better else -1
    ranked = sorted(tied, key=lambda p: (tsign * tie[p].mid if tie[p] else math.inf, p))
    pick = ranked[0]
    if tie[pick] is not None:
        equal_too = [p for p in ranked[1:] if tie[p] is not None and tie[p].overlaps(tie[pick])]
        if equal_too:
            pick = min([pick, *equal_too])  # equal on both: the lowest cap
    names = ", ".join(p.name for p in tied if p != pick)
    reason = (
        f"{pick.name}: equal to {names} on {decide.name} (spreads overlap); "
        f"{then.name} {tie[pick].shown(then) if tie[pick] else 'unmeasured'} decides"
        + (" (equal there too: the lowest cap)" if pick != ranked[0] else "")
    )
    return Recommendation(pick, favor, reason, equal)
