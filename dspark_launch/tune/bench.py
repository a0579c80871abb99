"""`dspark bench`: the workload against the recorded server, measured per class."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord, load_state
from dspark_launch.config.settings import Settings
from dspark_launch.errors import DsparkError
from dspark_launch.serve import http
from dspark_launch.tune import workload as wl
from dspark_launch.tune.loadgen import Run, Target
from dspark_launch.tune.stats import RunStats, run_stats

SCHEMA = "dspark-bench/1"


@dataclass(frozen=True)
class Limits:
    """What bounds a run: requests in all (0: the workload's own count), seconds, and each reply's tokens."""

    requests: int = 0
    seconds: float = 300.0
    max_reply: int = 0
    prompts: Path | None = None
    seed: int = 0


def served(settings: Settings, spec: ClusterSpec) -> tuple[ServerRecord, Target]:
    """The recorded server, holding its port, and how to reach it (the key from the settings, never from argv).

    Nothing is sent, the key least of all, unless the head's agent finds the port among the recorded
    server's sockets (the check `smoke` makes: serve/api_holder.py), and each request checks it again."""
    from dspark_launch.serve.serve_spec import api_key
    from dspark_launch.serve.smoke import confirm_server

    state = load_state(spec.state_dir)
    server = state.server if state else None
    if server is None:
        raise DsparkError("no server started from this state folder; `dspark start` serves")
    key = confirm_server(spec, server, api_key(settings))  # and again before each request (http.Keyed)
    return server, Target(server.url, server.served_name, server.chat, key)


def others_served(server: ServerRecord, target: Target) -> float:
    """Requests the server is running or queueing now (its /metrics, from the port the key's check found the
    server's), other clients' by the time we ask."""
    return http.metrics(server.url, 10.0, target.key).in_engine


def served_values(settings: Settings, server: ServerRecord) -> dict[str, str]:
    """The values the server runs with, the profile's replacements of built-in defaults included (the record
    keeps the settings as resolved; the profile's window, budget and threshold are what `vllm serve` got)."""
    from dspark_launch.config.profile_resolve import profile_values

    return {**server.running_settings, **{v.setting: v.value for v in profile_values(settings)}}


def workload_for(settings: Settings, server: ServerRecord, limits: Limits) -> wl.Workload:
    operator = wl.read_prompts(limits.prompts) if limits.prompts else None
    return wl.build(
        wl.Profile.of(served_values(settings, server)), operator, limits.requests, limits.max_reply, limits.seed
    )


def bench_once(
    target: Target, workload: wl.Workload, tokens_per_word: float, seconds: float, progress=None, on_run=None
) -> RunStats:
    """One pass; `on_run(run)` gets the Run before it starts (an interrupt handler can stop it)."""
    run = Run(target, workload, tokens_per_word, seconds, progress=progress)
    if on_run:
        on_run(run)
    outcomes = run.run()
    return run_stats(workload.names, outcomes, run.ended - run.began)


def bench_data(server: ServerRecord, workload: wl.Workload, tokens_per_word: float, stats: RunStats) -> dict:
    return {
        "schema": SCHEMA,
        "server": {"url": server.url, "model": server.served_name},
        "profile": vars(workload.profile),
        "tokens_per_word": round(tokens_per_word, 3),
        "classes": {c.name: {"lanes": c.lanes, "requests": len(c.requests), "what": c.what} for c in workload.classes},
        "result": stats.to_data(),
    }
