#!/usr/bin/env python3
"""Fill the generated tables of docs/benchmarks.md from a `dspark bench scheduler` JSON result.

    python bench/scheduler_docs.py [bench/results/scheduler.json] [docs/benchmarks.md]

(`bench/scheduler_bound.py`'s result, `scheduler-bound.json` next to the
grid's, fills the `v3-bound` block when it is there.)

Rewrites the text between each `<!-- BEGIN GENERATED: NAME -->` and
`<!-- END GENERATED: NAME -->` pair; everything else is left as written.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dspark_launch.bench import report  # noqa: E402
from dspark_launch.bench.report import CAP1  # noqa: E402


def m0_vs_m1(result: dict) -> str:
    runs = {(r["workload"], r["policy"]): r for r in result["runs"] if r["scheduler"] == "Scheduler"}
    head = ("workload", "p99 proxy m0 / m1", "p99 ITL model ms m0 / m1", "TTFT steps m0 / m1",
            "TTFT model ms m0 / m1 (ratio)", "stock / stock+thr TTFT model ms", "preemptions m0 / m1",
            "longest gap m0 / m1")
    rows = []
    for w in result["workloads"]:
        name = w["name"]
        a, b = runs[(name, CAP1)], runs[(name, result["shipped_default"])]
        s, st = runs[(name, "stock")], runs[(name, "stock+thr")]
        ratio = b["ttft_model_ms"]["mean"] / a["ttft_model_ms"]["mean"]
        rows.append([
            name,
            f"{a['latency_proxy_tokens']['p99']:.0f} / {b['latency_proxy_tokens']['p99']:.0f}",
            f"{a['itl_model_ms']['p99']:.0f} / {b['itl_model_ms']['p99']:.0f}",
            f"{a['ttft_steps']['mean']:.1f} / {b['ttft_steps']['mean']:.1f}",
            f"{a['ttft_model_ms']['mean']:.0f} / {b['ttft_model_ms']['mean']:.0f} ({ratio:.3f})",
            f"{s['ttft_model_ms']['mean']:.0f} / {st['ttft_model_ms']['mean']:.0f}",
            f"{a['preemptions']} / {b['preemptions']}",
            f"{a['longest_gap_steps']} / {b['longest_gap_steps']}",
        ])
    return report.table(rows, head, markdown=True)


V2 = "hotfix-m1:1"
CLASSES = ("cached", "short", "long")


def _fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def v3_classes(result: dict, scheduler: str = "Scheduler") -> str:
    """Per workload with request classes: mean modelled TTFT per class and p99
    inter-token time, stock+thr / patch v2 (mode 1) / shipped."""
    runs = {(r["workload"], r["policy"]): r for r in result["runs"] if r["scheduler"] == scheduler}
    shipped = result["shipped_default"]
    head = ("workload", "class (n)", "TTFT ms stock+thr / v2 / v3", "v3 / stock+thr", "v3 / v2",
            "p99 ITL ms stock+thr / v2 / v3", "p99 ITL v3 / v2")
    rows = []
    for w in result["workloads"]:
        name = w["name"]
        s, a, b = runs.get((name, "stock+thr")), runs.get((name, V2)), runs.get((name, shipped))
        if not (s and a and b):
            continue
        itl = [r["itl_model_ms"]["p99"] for r in (s, a, b)]
        first = True
        for cls in CLASSES:
            if cls not in b["ttft_by_class"]:
                continue
            m = [report.class_mean(r, cls) for r in (s, a, b)]
            rows.append([
                name if first else "", f"{cls} ({b['ttft_by_class'][cls]['n']})",
                " / ".join(_fmt(x) for x in m), _fmt(report._ratio(m[2], m[0]), 2), _fmt(report._ratio(m[2], m[1]), 2),
                " / ".join(_fmt(x) for x in itl) if first else "", _fmt(itl[2] / itl[1], 2) if first else "",
            ])
            first = False
    return report.table(rows, head, markdown=True)


def v3_candidates(result: dict, scheduler: str = "Scheduler") -> str:
    """Gate mode 2 candidates against the issue-15 bounds."""
    runs = {(r["workload"], r["policy"]): r for r in result["runs"] if r["scheduler"] == scheduler}
    loads = [w["name"] for w in result["workloads"]]
    new = [w["name"] for w in result["workloads"] if w["kind"] in ("agent", "short-stream")]
    names = [p["name"] for p in result["policies"] if p["name"].startswith("m2-") or p["name"] in (V2, "hotfix-m2:1")]
    head = ("policy", "p99 ITL / v2, worst (workload)", "cached TTFT / stock+thr (agent)",
            "short TTFT / stock+thr, worst", "long TTFT / v2, worst (workload)")
    rows = []
    for pol in names:
        itl = {w: runs[(w, pol)]["itl_model_ms"]["p99"] / runs[(w, V2)]["itl_model_ms"]["p99"] for w in loads}
        wi = max(itl, key=itl.get)
        cached = report.class_ratios(result, pol, "stock+thr", "cached", scheduler)
        short = {w: v for w, v in report.class_ratios(result, pol, "stock+thr", "short", scheduler).items() if w in new}
        long = report.class_ratios(result, pol, V2, "long", scheduler)
        wl = max(long, key=long.get)
        rows.append([
            pol + (" *" if pol == result["shipped_default"] else ""),
            f"{itl[wi]:.2f} ({wi})",
            " ".join(f"{v:.2f}" for v in cached.values()),
            f"{max(short.values()):.2f}" if short else "-",
            f"{long[wl]:.2f} ({wl})",
        ])
    return report.table(rows, head, markdown=True)


def targets(result: dict) -> str:
    lines = []
    for t in result["targets"]:
        lines.append(f"- **{'Met' if t['met'] else 'Not met'}**: {t['text']}. "
                     f"`{json.dumps(t['numbers'], sort_keys=True)}`")
    return "\n".join(lines)


def v3_bound(bound: dict) -> str:
    """The lower bound of `bench/scheduler_bound.py`, per short-stream workload."""
    head = ("workload", "stock+thr short TTFT ms (target: 1.2x)", "v2 long TTFT ms",
            "short TTFT lower bound ms with long <= v2 (x stock+thr)", "long TTFT needed for the short target (x v2)")
    rows = [[b["workload"], f"{b['stock_thr_short_mean_ms']:.0f} ({b['short_target_ms']:.0f})",
             f"{b['v2_long_mean_ms']:.0f}",
             f"{b['short_mean_lower_bound_ms_with_long_at_v2']:.0f} ({b['short_lower_bound_vs_stock_thr']:.2f})",
             f"{b['long_vs_v2_needed_for_short_target']:.2f}"] for b in bound["bounds"]]
    return report.table(rows, head, markdown=True)


def blocks(result: dict, bound: dict | None = None) -> dict[str, str]:
    extra = {"v3-bound": v3_bound(bound)} if bound else {}
    return {
        **extra,
        "summary": report.summary_table(result, "Scheduler", markdown=True),
        "m0-vs-m1": m0_vs_m1(result),
        "overhead": report.overhead_text(result.get("overhead"), markdown=True),
        "targets": targets(result),
        "v3-classes": v3_classes(result),
        "v3-classes-async": v3_classes(result, "AsyncScheduler"),
        "v3-candidates": v3_candidates(result),
        "runs": report.runs_table(result, "Scheduler", markdown=True),
    }


def fill(text: str, parts: dict[str, str]) -> str:
    for name, body in parts.items():
        pattern = re.compile(
            r"(<!-- BEGIN GENERATED: " + re.escape(name) + r" -->\n).*?(<!-- END GENERATED: " + re.escape(name) + r" -->)",
            re.S,
        )
        if not pattern.search(text):
            raise SystemExit(f"no generated block {name!r} in the document")
        text = pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    result_path = pathlib.Path(argv[0]) if argv else REPO / "bench" / "results" / "scheduler.json"
    doc_path = pathlib.Path(argv[1]) if len(argv) > 1 else REPO / "docs" / "benchmarks.md"
    result = json.loads(result_path.read_text(encoding="utf-8"))
    # bench/scheduler_bound.py's result, when it sits next to the grid's.
    bound_path = result_path.with_name("scheduler-bound.json")
    bound = json.loads(bound_path.read_text(encoding="utf-8")) if bound_path.exists() else None
    doc_path.write_text(fill(doc_path.read_text(encoding="utf-8"), blocks(result, bound)), encoding="utf-8")
    print(f"filled {doc_path} from {result_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
