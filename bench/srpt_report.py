#!/usr/bin/env python3
"""Issue 23's targets, trade-off curve and tables from `bench/srpt_sweep.py` output.

    python bench/srpt_report.py bench/results/srpt-mixed.json bench/results/srpt-solo.json \
        [--shipped m3-k2] [--out-dir bench/results]

Writes srpt-targets.json, srpt-curve.json, srpt-curve.svg (drawn
by hand: no plotting library needed) and srpt-tables.md (generated; the
docs link it). The two raw runs (about 5,000 lines each) are not kept in git:
`python bench/srpt_sweep.py --fit mixed --out bench/results/srpt-mixed.json`
(and `--fit solo ... srpt-solo.json`) make them again; the runs are
deterministic, so the tables come out the same.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
FACTORS = (1.0, 1.1, 1.2, 1.4)
FAMILIES = ("stock+thr", "v2", "v3", "mode3")
COLORS = {"stock+thr": "#d62728", "v2": "#1f77b4", "v3": "#2ca02c", "mode3": "#9467bd"}
SHORT_STREAMS = ("short-stream-60x-every400ms-long62k", "short-stream-60x-every250ms-long32k")


def _ratio(a, b):
    return None if a is None or b in (None, 0) else round(a / b, 3)


def _index(rows):
    return {(r["fit"], r["workload"], r["policy"]): r for r in rows}


def targets(rows, shipped: str) -> list[dict]:
    """Every target of issue 23 at `shipped`, per fit, with its number and verdict."""
    idx = _index(rows)
    out = []
    for fit in sorted({r["fit"] for r in rows}):
        for load in sorted({r["workload"] for r in rows if r["fit"] == fit}):
            m3, v2, thr = (idx.get((fit, load, name)) for name in (shipped, "v2", "stock+thr"))
            if not (m3 and v2 and thr):
                continue
            kind = m3["kind"]
            checks = []
            if kind == "short-stream":
                checks += [
                    (
                        "short mean TTFT / stock+thr",
                        _ratio(m3["class_mean_ms"].get("short"), thr["class_mean_ms"].get("short")),
                        1.2,
                    ),
                    (
                        "long TTFT / stock+thr",
                        _ratio(m3["class_mean_ms"].get("long"), thr["class_mean_ms"].get("long")),
                        1.0,
                    ),
                    ("p99 ITL / v2", _ratio(m3["itl_p99_ms"], v2["itl_p99_ms"]), 1.1),
                    ("long TTFT / v2", _ratio(m3["class_mean_ms"].get("long"), v2["class_mean_ms"].get("long")), None),
                ]
            elif kind == "agent":
                worst = max((_ratio(ms, v2["long_ttft_ms"].get(rid)) or 0) for rid, ms in m3["long_ttft_ms"].items())
                checks += [
                    (
                        "cached mean TTFT / stock+thr",
                        _ratio(m3["class_mean_ms"].get("cached"), thr["class_mean_ms"].get("cached")),
                        1.2,
                    ),
                    (
                        "long class mean / v2",
                        _ratio(m3["class_mean_ms"].get("long"), v2["class_mean_ms"].get("long")),
                        1.05,
                    ),
                    ("worst long prompt / its v2 TTFT", round(worst, 3), 1.5),
                    ("p99 ITL / v2", _ratio(m3["itl_p99_ms"], v2["itl_p99_ms"]), None),
                ]
            else:
                checks += [
                    ("p99 ITL / v2", _ratio(m3["itl_p99_ms"], v2["itl_p99_ms"]), 1.1),
                    ("mean TTFT / v2", _ratio(m3["ttft_mean_ms"], v2["ttft_mean_ms"]), 1.05),
                    ("preemptions - v2", m3["preemptions"] - v2["preemptions"], 0),
                ]
            if m3["long_ttft_ms"] and kind != "agent":
                worst = max((_ratio(ms, v2["long_ttft_ms"].get(rid)) or 0) for rid, ms in m3["long_ttft_ms"].items())
                checks.append(("worst long prompt / its v2 TTFT", round(worst, 3), None))
            for name, value, limit in checks:
                out.append(
                    {
                        "fit": fit,
                        "workload": load,
                        "kind": kind,
                        "target": name,
                        "value": value,
                        "limit": limit,
                        "met": None if limit is None or value is None else value <= limit,
                    }
                )
    return out


def curve(rows) -> list[dict]:
    """Per short stream, fit and family: the best short mean TTFT whose long
    prompt is within each factor of v2's and whose p99 ITL <= 1.1 x v2's."""
    idx = _index(rows)
    out = []
    for fit in sorted({r["fit"] for r in rows}):
        for load in SHORT_STREAMS:
            v2 = idx.get((fit, load, "v2"))
            if not v2:
                continue
            points = [r for r in rows if r["fit"] == fit and r["workload"] == load]
            for family in FAMILIES:
                fam = [r for r in points if r["family"] == family]
                scatter = [
                    {
                        "policy": r["policy"],
                        "long_over_v2": _ratio(r["class_mean_ms"]["long"], v2["class_mean_ms"]["long"]),
                        "short_ms": r["class_mean_ms"]["short"],
                        "itl_over_v2": _ratio(r["itl_p99_ms"], v2["itl_p99_ms"]),
                    }
                    for r in fam
                ]
                best = {}
                for f in FACTORS:
                    ok = [p for p in scatter if p["long_over_v2"] <= f + 1e-9 and p["itl_over_v2"] <= 1.1 + 1e-9]
                    pick = min(ok, key=lambda p: p["short_ms"]) if ok else None
                    best[str(f)] = None if pick is None else {"short_ms": pick["short_ms"], "policy": pick["policy"]}
                out.append(
                    {"fit": fit, "workload": load, "family": family, "best_at_long_factor": best, "points": scatter}
                )
    return out


def svg(curves: list[dict]) -> str:
    """One panel per (fit, short stream): short mean TTFT against the long
    prompt's TTFT as a factor of v2's, best point per factor and family."""
    panels = sorted({(c["fit"], c["workload"]) for c in curves})
    w, h, pad = 420, 300, 50
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * 2}" height="{h * ((len(panels) + 1) // 2) + 30}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for n, (fit, load) in enumerate(panels):
        ox, oy = (n % 2) * w, (n // 2) * h + 30
        mine = [c for c in curves if c["fit"] == fit and c["workload"] == load]
        ys = [b["short_ms"] for c in mine for b in c["best_at_long_factor"].values() if b]
        top = max(ys, default=1) * 1.1
        x0, x1 = FACTORS[0] - 0.05, FACTORS[-1] + 0.05

        def px(x):
            return ox + pad + (x - x0) / (x1 - x0) * (w - 2 * pad)

        def py(y):
            return oy + h - pad - y / top * (h - 2 * pad)

        parts.append(f'<text x="{ox + pad}" y="{oy + 15}" font-weight="bold">{load} ({fit})</text>')
        parts.append(f'<line x1="{px(x0)}" y1="{py(0)}" x2="{px(x1)}" y2="{py(0)}" stroke="black"/>')
        parts.append(f'<line x1="{px(x0)}" y1="{py(0)}" x2="{px(x0)}" y2="{py(top)}" stroke="black"/>')
        for f in FACTORS:
            parts.append(f'<text x="{px(f) - 8}" y="{py(0) + 14}">{f:g}x</text>')
        for k in range(5):
            y = top * k / 4
            parts.append(f'<text x="{ox + 2}" y="{py(y) + 4}">{y / 1000:.1f}s</text>')
        parts.append(f'<text x="{ox + w / 2 - 90}" y="{oy + h - 12}">long TTFT / v2 (p99 ITL &lt;= 1.1x v2)</text>')
        for i, c in enumerate(mine):
            color = COLORS[c["family"]]
            pts = [(px(float(f)), py(b["short_ms"])) for f, b in c["best_at_long_factor"].items() if b]
            if len(pts) > 1:
                parts.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                    + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                    + '"/>'
                )
            for x, y in pts:
                parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>')
            parts.append(f'<text x="{ox + w - 95}" y="{oy + 30 + 13 * i}" fill="{color}">{c["family"]}</text>')
    parts.append(
        '<text x="10" y="18">short-prompt mean TTFT (modelled) vs long prompt TTFT as a factor of v2; '
        "missing point: no setting of that family meets it</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def tables(rows, tgt, shipped: str) -> str:
    lines = [
        "# Issue 23: gate mode 3 against stock+thr, v2 and v3 (generated)",
        "",
        "Generated by `python bench/srpt_report.py` from `bench/srpt_sweep.py` output; "
        f"shipped point `{shipped}`. Modelled milliseconds; real vLLM 0.32 `Scheduler`.",
        "",
    ]
    for fit in sorted({r["fit"] for r in rows}):
        lines += [f"## Targets, {fit}", "", "| workload | target | value | limit | met |", "|---|---|---|---|---|"]
        for t in tgt:
            if t["fit"] == fit:
                met = "-" if t["met"] is None else ("yes" if t["met"] else "**no**")
                lines.append(
                    f"| {t['workload']} | {t['target']} | {t['value']} | "
                    f"{t['limit'] if t['limit'] is not None else '-'} | {met} |"
                )
        lines += [
            "",
            f"## Every run, {fit}",
            "",
            "| workload | policy | p99 ITL ms | mean TTFT ms | class means ms | preemptions | max prefill "
            "tokens in a step |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            if r["fit"] == fit:
                cls = ", ".join(f"{k} {v}" for k, v in r["class_mean_ms"].items())
                lines.append(
                    f"| {r['workload']} | {r['policy']} | {r['itl_p99_ms']} | {r['ttft_mean_ms']} | {cls} | "
                    f"{r['preemptions']} | {r['max_prefill_tokens_in_decode_step']} |"
                )
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", type=pathlib.Path)
    ap.add_argument("--shipped", default="m3-k2")
    ap.add_argument("--out-dir", type=pathlib.Path, default=REPO / "bench" / "results")
    args = ap.parse_args(argv)
    rows = [row for path in args.inputs for row in json.loads(path.read_text())["rows"]]
    tgt = targets(rows, args.shipped)
    curves = curve(rows)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "srpt-targets.json").write_text(
        json.dumps({"shipped": args.shipped, "targets": tgt}, indent=1) + "\n"
    )
    (args.out_dir / "srpt-curve.json").write_text(json.dumps({"factors": FACTORS, "curves": curves}, indent=1) + "\n")
    (args.out_dir / "srpt-curve.svg").write_text(svg(curves))
    (args.out_dir / "srpt-tables.md").write_text(tables(rows, tgt, args.shipped))
    for t in tgt:
        print(
            f"{t['fit']:9s} {t['workload'][:40]:40s} {t['target']:34s} {t['value']!s:>8s} <= "
            f"{t['limit']!s:5s} {t['met']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
