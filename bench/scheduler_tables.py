#!/usr/bin/env python3
"""Fill the generated tables of the research log bench/results/scheduler.md from a grid result.

    python bench/scheduler_tables.py [bench/results/scheduler.json] [bench/results/scheduler.md] [--only BLOCK ...]

(The grid: `bench/scheduler_experiments.py`; `python -m bench.scheduler` writes the
same JSON for the operator's comparison.)

(`bench/scheduler_bound.py`'s result, `scheduler-bound.json` next to the
grid's or in bench/results/, fills the `v3-bound` block. `--only v3-candidates`
fills that table from a `scheduler_experiments.py --candidates` run.)

Rewrites the text between each `<!-- BEGIN GENERATED: NAME -->` and
`<!-- END GENERATED: NAME -->` pair; everything else is left as written.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scheduler import report  # noqa: E402
from bench.scheduler.report import CAP1  # noqa: E402


def m0_vs_m1(result: dict) -> str:
    runs = {(r["workload"], r["policy"]): r for r in result["runs"] if r["scheduler"] == "Scheduler"}
    head = (
        "workload",
        "p99 proxy m0 / m1",
        "p99 ITL model ms m0 / m1",
        "TTFT steps m0 / m1",
        "TTFT model ms m0 / m1 (ratio)",
        "stock / stock+thr TTFT model ms",
        "preemptions m0 / m1",
        "longest gap m0 / m1",
    )
    rows = []
    for w in result["workloads"]:
        name = w["name"]
        a, b = runs[(name, CAP1)], runs[(name, result["shipped_default"])]
        s, st = runs[(name, "stock")], runs[(name, "stock+thr")]
        ratio = b["ttft_model_ms"]["mean"] / a["ttft_model_ms"]["mean"]
        rows.append(
            [
                name,
                f"{a['latency_proxy_tokens']['p99']:.0f} / {b['latency_proxy_tokens']['p99']:.0f}",
                f"{a['itl_model_ms']['p99']:.0f} / {b['itl_model_ms']['p99']:.0f}",
                f"{a['ttft_steps']['mean']:.1f} / {b['ttft_steps']['mean']:.1f}",
                f"{a['ttft_model_ms']['mean']:.0f} / {b['ttft_model_ms']['mean']:.0f} ({ratio:.3f})",
                f"{s['ttft_model_ms']['mean']:.0f} / {st['ttft_model_ms']['mean']:.0f}",
                f"{a['preemptions']} / {b['preemptions']}",
                f"{a['longest_gap_steps']} / {b['longest_gap_steps']}",
            ]
        )
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
    head = (
        "workload",
        "class (n)",
        "TTFT ms stock+thr / v2 / v3",
        "v3 / stock+thr",
        "v3 / v2",
        "p99 ITL ms stock+thr / v2 / v3",
        "p99 ITL v3 / v2",
    )
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
            rows.append(
                [
                    name if first else "",
                    f"{cls} ({b['ttft_by_class'][cls]['n']})",
                    " / ".join(_fmt(x) for x in m),
                    _fmt(report._ratio(m[2], m[0]), 2),
                    _fmt(report._ratio(m[2], m[1]), 2),
                    " / ".join(_fmt(x) for x in itl) if first else "",
                    _fmt(itl[2] / itl[1], 2) if first else "",
                ]
            )
            first = False
    return report.table(rows, head, markdown=True)


def v3_candidates(result: dict, scheduler: str = "Scheduler") -> str:
    """Gate mode 2 candidates against the issue-15 bounds."""
    runs = {(r["workload"], r["policy"]): r for r in result["runs"] if r["scheduler"] == scheduler}
    loads = [w["name"] for w in result["workloads"]]
    new = [w["name"] for w in result["workloads"] if w["kind"] in ("agent", "short-stream")]
    names = [p["name"] for p in result["policies"] if p["name"].startswith("m2-") or p["name"] in (V2, "hotfix-m2:1")]
    head = (
        "policy",
        "p99 ITL / v2, worst (workload)",
        "cached TTFT / stock+thr (agent)",
        "short TTFT / stock+thr, worst",
        "long TTFT / v2, worst (workload)",
    )
    rows = []
    for pol in names:
        itl = {w: runs[(w, pol)]["itl_model_ms"]["p99"] / runs[(w, V2)]["itl_model_ms"]["p99"] for w in loads}
        wi = max(itl, key=itl.get)
        cached = report.class_ratios(result, pol, "stock+thr", "cached", scheduler)
        short = {w: v for w, v in report.class_ratios(result, pol, "stock+thr", "short", scheduler).items() if w in new}
        long = report.class_ratios(result, pol, V2, "long", scheduler)
        wl = max(long, key=long.get)
        rows.append(
            [
                pol + (" *" if pol == result["shipped_default"] else ""),
                f"{itl[wi]:.2f} ({wi})",
                " ".join(f"{v:.2f}" for v in cached.values()),
                f"{max(short.values()):.2f}" if short else "-",
                f"{long[wl]:.2f} ({wl})",
            ]
        )
    return report.table(rows, head, markdown=True)


def targets(result: dict) -> str:
    lines = []
    for t in result["targets"]:
        lines.append(
            f"- **{'Met' if t['met'] else 'Not met'}**: {t['text']}. `{json.dumps(t['numbers'], sort_keys=True)}`"
        )
    return "\n".join(lines)


def v3_bound(bound: dict) -> str:
    """The lower bounds of `bench/scheduler_bound.py`, per workload with a
    cached or short class: the highest bound with every long prompt at most
    as slow as under patch v2, and the long TTFT the class target needs."""
    head = (
        "workload",
        "class",
        "stock+thr TTFT ms (target: 1.2x)",
        "v2 long TTFT ms",
        "lower bound ms with long <= v2 (x stock+thr)",
        "from",
        "target excluded",
        "long TTFT needed for the target (x v2)",
    )
    rows = []
    for b in bound["bounds"]:
        which = max(b["bounds_ms_with_long_at_v2"], key=b["bounds_ms_with_long_at_v2"].get)
        needed = b["long_vs_v2_needed_for_target"]
        rows.append(
            [
                b["workload"],
                b["class"],
                f"{b['stock_thr_mean_ms']:.0f} ({b['target_ms']:.0f})",
                f"{b['v2_long_mean_ms']:.0f}",
                f"{b['lower_bound_ms_with_long_at_v2']:.0f} ({b['lower_bound_vs_stock_thr']:.2f})",
                which,
                "yes" if b["target_excluded_with_long_at_v2"] else "no",
                f"{needed:.2f}" if needed > 1 else "<= 1.00 (not excluded)",
            ]
        )
    return report.table(rows, head, markdown=True)


#: Every generated block of the research log, in its order there.
BLOCKS = (
    "summary",
    "m0-vs-m1",
    "overhead",
    "targets",
    "v3-candidates",
    "v3-bound",
    "v3-classes",
    "v3-classes-async",
    "runs",
)


def blocks(result: dict, bound: dict | None = None, only: Sequence[str] | None = None) -> dict[str, str]:
    """Each generated block's text (`only`: just those named)."""
    makers: dict = {
        "summary": lambda: report.summary_table(result, "Scheduler", markdown=True),
        "m0-vs-m1": lambda: m0_vs_m1(result),
        "overhead": lambda: report.overhead_text(result.get("overhead"), markdown=True),
        "targets": lambda: targets(result),
        "v3-classes": lambda: v3_classes(result),
        "v3-classes-async": lambda: v3_classes(result, "AsyncScheduler"),
        "v3-candidates": lambda: v3_candidates(result),
        "runs": lambda: report.runs_table(result, "Scheduler", markdown=True),
    }
    if bound:
        makers["v3-bound"] = lambda: v3_bound(bound)
    assert set(makers) <= set(BLOCKS), sorted(set(makers) - set(BLOCKS))
    unknown = sorted(set(only or ()) - set(makers))
    if unknown:
        raise SystemExit(f"--only: no block {', '.join(unknown)} (known: {', '.join(sorted(makers))})")
    return {name: make() for name, make in makers.items() if not only or name in only}


def fill(text: str, parts: dict[str, str]) -> str:
    for name, body in parts.items():
        pattern = re.compile(
            r"(<!-- BEGIN GENERATED: "
            + re.escape(name)
            + r" -->\n).*?(<!-- END GENERATED: "
            + re.escape(name)
            + r" -->)",
            re.S,
        )
        if not pattern.search(text):
            raise SystemExit(f"no generated block {name!r} in the document")
        text = pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", nargs="?", type=pathlib.Path, default=REPO / "bench" / "results" / "scheduler.json")
    parser.add_argument("doc", nargs="?", type=pathlib.Path, default=REPO / "bench" / "results" / "scheduler.md")
    parser.add_argument(
        "--only",
        action="append",
        metavar="BLOCK",
        help="fill only this generated block (repeatable), e.g. v3-candidates from a --candidates run",
    )
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text(encoding="utf-8"))
    # bench/scheduler_bound.py's result, when it sits next to the grid's.
    bound_path = args.result.with_name("scheduler-bound.json")
    if not bound_path.exists():
        bound_path = REPO / "bench" / "results" / "scheduler-bound.json"
    bound = json.loads(bound_path.read_text(encoding="utf-8")) if bound_path.exists() else None
    parts = blocks(result, bound, args.only)
    args.doc.write_text(fill(args.doc.read_text(encoding="utf-8"), parts), encoding="utf-8")
    print(f"filled {', '.join(parts)} in {args.doc} from {args.result}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
