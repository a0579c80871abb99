"""Is the engine still producing? Judged from vLLM's own /metrics, never from /health.

An engine hung in a collective (an NCCL hang between the nodes) keeps its API server answering `/health` and
`/metrics` with 200: only its numbers stop moving. While vLLM reports requests running
(`vllm:num_requests_running` > 0), each step of the engine moves at least one of:

- `vllm:generation_tokens_total`: a token sampled for a decoding (or a finishing prefill's first) request;
- `vllm:prompt_tokens_total`: a prompt whose prefill completed;
- `vllm:kv_cache_usage_perc`: KV blocks allocated for a prefill chunk (or freed).

The third is needed because vLLM (0.32 to 0.34, `IterationStats.update_from_output`) adds a prompt's tokens to
`prompt_tokens_total` once, with its first generated token: a chunked prefill of a long prompt moves no token
counter until its last chunk, but every chunk allocates the blocks it writes, so the KV cache use moves each step
(the scheduler sends its stats every step, `update_from_output`: "We must return the stats even if there are no
request outputs this step").

The engine is *stalled* when requests are running and none of the three moved for `DSPARK_STALL_TIMEOUT_S`. An idle
server (nothing running) is never stalled, whatever it did before; a long prefill is progress.

The last moment the numbers moved (the progress point) is kept in `STATE/engine-watch.json`, written by whoever
reads /metrics (the supervisor every poll, `dspark status` when it sees them move), so a `status` judges a stall
from the supervisor's observations and its own read.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from dspark_launch.errors import DsparkError
from dspark_launch.node.safe_path import read_private, write_private
from dspark_launch.serve import http

WATCH_FILE = "engine-watch.json"

# field -> the Prometheus series it sums (one sample per engine: a data-parallel server has several)
SERIES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
}
_SAMPLE = re.compile(r"^(vllm:[a-z_]+)(?:\{.*\})?\s+(\S+)(?:\s+\d+)?$")


@dataclass(frozen=True)
class EngineCounters:
    """The numbers a stall is judged from, each summed over the server's engines."""

    running: float
    waiting: float
    generation_tokens: float
    prompt_tokens: float
    kv_cache_usage: float

    @classmethod
    def parse(cls, text: str) -> EngineCounters | None:
        """From /metrics (Prometheus text); None when a series is missing (not a vLLM server, or not yet)."""
        wanted = {series: name for name, series in SERIES.items()}
        found: dict[str, float] = {}
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match and match.group(1) in wanted:
                try:
                    value = float(match.group(2))
                except ValueError:
                    continue
                name = wanted[match.group(1)]
                found[name] = found.get(name, 0.0) + value
        if len(found) < len(SERIES):
            return None
        return cls(**found)

    def moved_since(self, before: EngineCounters) -> bool:
        """Whether the engine did anything between `before` and this: a token, a completed prompt, a KV block."""
        return (
            self.generation_tokens != before.generation_tokens
            or self.prompt_tokens != before.prompt_tokens
            or self.kv_cache_usage != before.kv_cache_usage
        )


@dataclass(frozen=True)
class ProgressPoint:
    """When the engine of the server `marker` last moved (or was idle), and its numbers then."""

    marker: str
    at: float  # wall-clock seconds
    counters: EngineCounters


EngineState = Literal["idle", "progress", "quiet", "stalled", "unknown"]


@dataclass(frozen=True)
class EngineWatch:
    """The verdict and the numbers it was judged from (`status --json`: `server.engine`).

    state: "idle" nothing running; "progress" the numbers moved since the last look; "quiet" requests running and
    nothing moved for `quiet_s` (< the timeout); "stalled" the same for at least `timeout_s`; "unknown" /metrics gave
    no numbers."""

    state: EngineState
    timeout_s: int  # DSPARK_STALL_TIMEOUT_S the server runs with (0: never judged stalled)
    quiet_s: int = 0  # seconds since the numbers last moved with requests running
    since: float | None = None  # when they last moved (wall clock)
    counters: EngineCounters | None = None  # the numbers now

    @property
    def stalled(self) -> bool:
        return self.state == "stalled"

    @property
    def line(self) -> str:
        """`engine: stalled for 42 s (DSPARK_STALL_TIMEOUT_S 30): 2 running, ...` as status shows it."""
        if self.counters is None:
            return "engine: no numbers from /metrics"
        c = self.counters
        numbers = (
            f"{c.running:g} running, {c.waiting:g} waiting; generated tokens {c.generation_tokens:g}, "
            f"prompt tokens {c.prompt_tokens:g}, KV cache use {100 * c.kv_cache_usage:.4g}%"
        )
        limit = f"DSPARK_STALL_TIMEOUT_S {self.timeout_s}" if self.timeout_s else "DSPARK_STALL_TIMEOUT_S 0: not judged"
        if self.state == "stalled":
            return f"engine: stalled for {self.quiet_s} s ({limit}): {numbers}, none moved since {_clock(self.since)}"
        if self.state == "quiet":
            return f"engine: nothing moved for {self.quiet_s} s ({limit}): {numbers}"
        if self.state == "idle":
            return f"engine: idle ({numbers})"
        return f"engine: producing ({numbers})"


def _clock(at: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if at else "?"


def judge(
    point: ProgressPoint | None, counters: EngineCounters | None, marker: str, now: float, timeout_s: int
) -> tuple[ProgressPoint | None, EngineWatch]:
    """The progress point after this look, and the verdict. A point of another server counts as none."""
    if counters is None:
        return point, EngineWatch("unknown", timeout_s)
    fresh = ProgressPoint(marker, now, counters)
    if counters.running <= 0:
        return fresh, EngineWatch("idle", timeout_s, 0, now, counters)
    if point is None or point.marker != marker or counters.moved_since(point.counters):
        return fresh, EngineWatch(
            "progress" if point is not None and point.marker == marker else "quiet", timeout_s, 0, now, counters
        )
    quiet = max(0, int(now - point.at))
    state: EngineState = "stalled" if timeout_s and quiet >= timeout_s else "quiet"
    return point, EngineWatch(state, timeout_s, quiet, point.at, counters)


def load_point(state_dir: Path) -> ProgressPoint | None:
    """The kept progress point; None when there is none or it is not one (never an error: it is only a hint)."""
    try:
        data = json.loads(read_private(state_dir / WATCH_FILE, limit=1 << 16))
        return ProgressPoint(str(data["marker"]), float(data["at"]), EngineCounters(**data["counters"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_point(state_dir: Path, point: ProgressPoint) -> None:
    """Kept for the next look (a 0600 file renamed over the old one); a failure to write is not an error."""
    try:
        write_private(state_dir / WATCH_FILE, json.dumps(asdict(point)) + "\n")
    except OSError:
        pass


def look(
    state_dir: Path, marker: str, metrics_text: str | None, timeout_s: int, now: float | None = None
) -> EngineWatch:
    """One look at the engine: judged against the kept point, which is moved on when the engine moved or idles."""
    now = time.time() if now is None else now
    counters = EngineCounters.parse(metrics_text) if metrics_text else None
    before = load_point(state_dir)
    point, verdict = judge(before, counters, marker, now, timeout_s)
    if point is not None and point != before:
        save_point(state_dir, point)
    return verdict


def metrics_text(url: str, timeout: float, check: http.Keyed | None) -> str | None:
    """The server's /metrics (no key), after the port check of the key it would go with (`check`, as status's own
    read: serve/api_holder.py); None when nothing answered or another process holds the port."""
    try:
        reply = http.request(f"{url}/metrics", check.unkeyed() if check else None, timeout=timeout)
    except DsparkError:  # another process holds the API port: its numbers are not the engine's
        return None
    return reply.body if reply.status == 200 else None
