"""The tune plot, written as SVG text (no plotting library in the launcher): for every point, each class's
mean first token (y) against the p99 inter-token time of all streams (x); whiskers show the range over
rounds, the recommended point is ringed. Down and to the left is better on both."""

from __future__ import annotations

import math
from html import escape

from dspark_launch.tune.points import Point
from dspark_launch.tune.recommend import Spread

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 480, 80, 180, 40, 60


def _ticks(low: float, high: float, log: bool) -> list[float]:
    if log:
        return [10**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)]
    step = 10 ** math.floor(math.log10((high - low) or high or 1))
    for factor in (1, 2, 5, 10):
        if (high - low) / (step * factor) <= 6:
            step *= factor
            break
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 2)]


def svg(
    points: list[Point],
    itl: dict[Point, Spread | None],
    ttft: dict[str, dict[Point, Spread | None]],
    chosen: Point | None,
    title: str,
) -> str:
    """`itl[point]`: p99 inter-token seconds; `ttft[class][point]`: mean first-token seconds."""
    xs = [v for s in itl.values() if s for v in (s.low, s.high)]
    ys = [v for by in ttft.values() for s in by.values() if s for v in (s.low, s.high) if v > 0]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14">{escape(title)}</text>',
    ]
    if not xs or not ys:
        out.append(f'<text x="{LEFT}" y="{H / 2}">no point measured</text></svg>')
        return "\n".join(out) + "\n"
    x0, x1 = min(xs) * 0.9, max(xs) * 1.1
    log = max(ys) / min(ys) > 20
    y0, y1 = (min(ys) / 1.5, max(ys) * 1.5) if log else (0.0, max(ys) * 1.1)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(v: float) -> float:
        return LEFT + (v - x0) / ((x1 - x0) or 1) * pw

    def py(v: float) -> float:
        if log:
            return TOP + ph - (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * ph
        return TOP + ph - (v - y0) / ((y1 - y0) or 1) * ph

    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    for t in _ticks(x0, x1, False):
        if x0 <= t <= x1:
            out.append(
                f'<line x1="{px(t):.1f}" y1="{TOP + ph}" x2="{px(t):.1f}" y2="{TOP + ph + 4}" stroke="#888"/>'
                f'<text x="{px(t):.1f}" y="{TOP + ph + 18}" text-anchor="middle">{t * 1000:g}</text>'
            )
    for t in _ticks(y0, y1, log):
        if y0 <= t <= y1:
            out.append(
                f'<line x1="{LEFT - 4}" y1="{py(t):.1f}" x2="{LEFT}" y2="{py(t):.1f}" stroke="#888"/>'
                f'<text x="{LEFT - 8}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>'
            )
    out.append(
        f'<text x="{LEFT + pw / 2}" y="{H - 18}" text-anchor="middle">p99 inter-token time, all streams (ms)</text>'
    )
    scale = " (log scale)" if log else ""
    out.append(
        f'<text transform="translate(18 {TOP + ph / 2}) rotate(-90)" text-anchor="middle">mean time to first '
        f"token (s){scale}</text>"
    )
    for i, (klass, by) in enumerate(ttft.items()):
        color = COLORS[i % len(COLORS)]
        out.append(
            f'<circle cx="{LEFT + pw + 20}" cy="{TOP + 10 + 18 * i}" r="5" fill="{color}"/>'
            f'<text x="{LEFT + pw + 30}" y="{TOP + 14 + 18 * i}">{escape(klass)}</text>'
        )
        for point in points:
            x, y = itl.get(point), by.get(point)
            if not x or not y or y.mid <= 0:
                continue
            cx, cy = px(x.mid), py(y.mid)
            out.append(
                f'<line x1="{px(x.low):.1f}" y1="{cy:.1f}" x2="{px(x.high):.1f}" y2="{cy:.1f}" '
                f'stroke="{color}" stroke-width="1"/>'
            )
            out.append(
                f'<line x1="{cx:.1f}" y1="{py(max(y.low, y0)):.1f}" x2="{cx:.1f}" y2="{py(y.high):.1f}" '
                f'stroke="{color}" stroke-width="1"/>'
            )
            out.append(
                f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="{color}"><title>{escape(point.name)}: '
                f"{escape(klass)} {y.mid:.3f} s, p99 ITL {x.mid * 1000:.1f} ms</title></circle>"
            )
            if point == chosen:
                out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="8" fill="none" stroke="black"/>')
            out.append(f'<text x="{cx + 6:.1f}" y="{cy - 6:.1f}" font-size="10" fill="#444">{escape(point.key)}</text>')
    legend_y = TOP + 20 + 18 * len(ttft)
    out.append(f'<text x="{LEFT + pw + 12}" y="{legend_y}" font-size="10">labels: cap:mode:aging</text>')
    if chosen:
        out.append(
            f'<circle cx="{LEFT + pw + 20}" cy="{legend_y + 14}" r="8" fill="none" stroke="black"/>'
            f'<text x="{LEFT + pw + 32}" y="{legend_y + 18}" font-size="10">recommended</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
