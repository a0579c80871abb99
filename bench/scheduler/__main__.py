"""`python -m bench.scheduler` (from the repository root): the scheduler benchmark.

Not installed with dspark-launch. Imports vLLM only once the options are checked."""

from __future__ import annotations

import json
import pathlib
import sys
from enum import Enum
from typing import Annotated, Optional

import typer

from dspark_launch.cli.output import emit_json, fail, warn
from dspark_launch.errors import ConfigError
from dspark_launch.hotfix.contract import (
    CAP_MAX,
    CAP_MIN,
    DEFAULT_CAP,
    DEFAULT_GATE_MODE,
    ENV_CAP,
    ENV_GATE_MODE,
    GATE_MODES,
)

app = typer.Typer(help="The scheduler benchmark (real vLLM scheduler, no GPU).", pretty_exceptions_enable=False)


class Grid(str, Enum):
    full = "full"
    ci = "ci"


class Which(str, Enum):
    both = "both"
    sync = "sync"
    async_ = "async"


@app.command("scheduler")
def scheduler(
    scale: Annotated[
        str, typer.Option(help="Multiply every token count, e.g. 1/64 for a quick run (steps are kept).")
    ] = "1",
    grid: Annotated[Grid, typer.Option(help="full: every workload; ci: four of them.")] = Grid.full,
    which: Annotated[
        Which, typer.Option("--scheduler", help="vLLM Scheduler (sync), AsyncScheduler (async) or both.")
    ] = Which.both,
    cap: Annotated[
        int,
        typer.Option(
            envvar=ENV_CAP,
            min=CAP_MIN,
            max=CAP_MAX,
            help=f"The hotfix's in-flight cap to measure (default: ${ENV_CAP}, else {DEFAULT_CAP}).",
        ),
    ] = DEFAULT_CAP,
    gate_mode: Annotated[
        int,
        typer.Option(
            envvar=ENV_GATE_MODE,
            min=min(GATE_MODES),
            max=max(GATE_MODES),
            help=f"The hotfix's gate mode to measure (default: ${ENV_GATE_MODE}, else {DEFAULT_GATE_MODE}).",
        ),
    ] = DEFAULT_GATE_MODE,
    out: Annotated[
        pathlib.Path, typer.Option(help="JSON result (schema: bench/scheduler/bench-schema.json).")
    ] = pathlib.Path("scheduler-bench.json"),
    plot: Annotated[
        Optional[pathlib.Path], typer.Option(help="PNG of tokens per request per step (default: next to --out).")
    ] = None,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="Skip the PNG (no matplotlib needed).")] = False,
    markdown: Annotated[Optional[pathlib.Path], typer.Option(help="Also write the tables as Markdown here.")] = None,
    overhead: Annotated[
        bool, typer.Option("--overhead/--no-overhead", help="Time schedule() with and without the hotfix.")
    ] = True,
    reps_small: Annotated[int, typer.Option(min=1, help="Overhead repetitions at 6 running.")] = 2000,
    reps_large: Annotated[int, typer.Option(min=1, help="Overhead repetitions at 256 running / 1,024 waiting.")] = 400,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON result instead of the tables.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
) -> None:
    """Stock vLLM, the community gate (baseline) and the shipped hotfix at your cap and gate mode,
    on identical workloads driven through the real vLLM scheduler.

    Exit 0 when every run finished and the JSON matches its schema, 1 otherwise, 2 for bad options.
    """
    from bench.scheduler import policies, report, scheduler_bench

    try:
        factor = scheduler_bench.parse_scale(scale)
    except ValueError as error:
        raise fail(ConfigError(str(error))) from None
    schedulers = {
        Which.both: ("Scheduler", "AsyncScheduler"),
        Which.sync: ("Scheduler",),
        Which.async_: ("AsyncScheduler",),
    }[which]
    plot_path = None if no_plot else (plot or out.with_name(out.stem + "-tokens-per-step.png"))
    if plot_path is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            warn("matplotlib is not installed (pip install 'dspark-launch[bench]'); skipping the plot")
            plot_path = None

    def progress(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    result = scheduler_bench.run(
        factor,
        compared=policies.operator_policies(cap, gate_mode),
        shipped=policies.hotfix_name(cap, gate_mode),
        grid=grid.value,
        schedulers=schedulers,
        overhead_compared=policies.overhead_policies(cap, gate_mode),
        overhead_reps=(reps_small, reps_large) if overhead else None,
        plot_path=plot_path,
        progress=progress,
        command=["python", "-m", "bench.scheduler", *sys.argv[1:]],
    )
    problems = []
    try:
        report.validate(result)
    except (ValueError, FileNotFoundError) as error:
        problems.append(f"JSON result does not match its schema (bench/scheduler/bench-schema.json): {error}")
    unfinished = [f"{r['workload']}/{r['policy']}/{r['scheduler']}" for r in result["runs"] if r["unfinished"]]
    if unfinished:
        problems.append(f"runs that did not finish (deadlock?): {', '.join(unfinished)}")

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(report_markdown(result), encoding="utf-8")
    if as_json:
        emit_json(result)
    else:
        print(report.terminal(result))
        print(f"JSON: {out}" + (f"; plot: {plot_path}" if result.get("plot") else ""))
    if problems:
        for problem in problems:
            print(f"dspark: error: {problem}", file=sys.stderr)
        raise typer.Exit(1)


def report_markdown(result: dict) -> str:
    """The Markdown tables of the research log (bench/results/scheduler.md)."""
    from bench.scheduler import report

    parts = [
        f"### Summary: each policy against `{result['reference_policy']}`, Scheduler",
        report.summary_table(result, "Scheduler", markdown=True),
    ]
    if "AsyncScheduler" in result["schedulers"]:
        parts += [
            "### Summary: AsyncScheduler",
            report.summary_table(result, "AsyncScheduler", markdown=True),
        ]
    if result.get("overhead"):
        parts += ["### schedule() overhead", report.overhead_text(result["overhead"], markdown=True)]
    parts += [
        "### Targets",
        "\n".join(
            f"- **{'met' if t['met'] else 'not met'}**: {t['text']}: `{json.dumps(t['numbers'], sort_keys=True)}`"
            for t in result["targets"]
        ),
    ]
    parts += ["### Every run, Scheduler", report.runs_table(result, "Scheduler", markdown=True)]
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    app()
