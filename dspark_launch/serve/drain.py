"""A drained stop of `vllm serve`: vLLM's own `--shutdown-timeout` does the draining; this
counts what it finished and what it cut.

With `--shutdown-timeout N` (vllm/engine/arg_utils.py), SIGTERM to the API server makes it signal its
EngineCore and wait up to N s for it (entrypoints/launchers/launcher.py); the EngineCore keeps stepping
its running and waiting requests and answers every new one with an abort (EngineCore._handle_shutdown,
_reject_add_in_shutdown), and logs "request processing complete" once it has no work left. The API
server keeps serving HTTP meanwhile, so its /metrics is read until it is gone.

Where an idle drain's time went (vLLM 0.32, Ray backend, docs/operations.md "Drained stops"): the EngineCore
is done at once, then spends about 10 s tearing down its Ray executor (the compiled graph's teardown, its
workers killed, the distributed state, Ray's driver) while the API server waits for it. vLLM's own abort
path skips that (it kills the EngineCore at once); so does the head's agent once the log says the drain
is over with nothing in flight (agent/handlers/processes.py `drain`, DrainEnd).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable

from dspark_launch.agent.protocol import DrainEnd, StopAnswer
from dspark_launch.serve import http
from dspark_launch.serve.engines import engine_count

# vLLM 0.32's EngineCore (v1/engine/core.py `_handle_shutdown`): out of work, and, before it, work left when
# the SIGTERM came (logged only when there was some). A vLLM that logs neither drains by its processes' end.
DRAINED_LOG = "[shutdown] EngineCore: request processing complete"
BUSY_LOG = "[shutdown] EngineCore: draining in-flight requests"
POLL_S = 0.25


@dataclass(frozen=True)
class RequestCounts:
    """From the server's /metrics: requests in the engine, and those finished without an abort so far."""

    in_flight: int
    finished: int


@dataclass(frozen=True)
class DrainReport:
    in_flight: int  # running + waiting when the stop began
    finished: int
    cut: int
    seconds: float
    timeout_s: int
    answered: bool = True  # False: /metrics did not answer when the stop began (a dead or hung server)
    idle: bool = False  # the engine said it had nothing in flight: its teardown was cut short

    @property
    def line(self) -> str:
        if not self.answered:
            return f"vllm serve did not answer /metrics; stopped in {self.seconds:.1f} s, nothing counted"
        if self.idle:
            return (
                f"vllm serve was idle (nothing in flight): stopped in {self.seconds:.1f} s, no drain wait: "
                "0 request(s) finished, 0 cut"
            )
        return (
            f"vllm serve drained in {self.seconds:.1f} s (limit {self.timeout_s} s): "
            f"{self.finished} request(s) finished, {self.cut} cut"
        )


def drain_end(log: str, extra_args: str) -> DrainEnd:
    """What the head's agent reads in the server log to end a drain: one done line per EngineCore."""
    return DrainEnd(log, DRAINED_LOG, BUSY_LOG, engine_count(extra_args))


_SUCCESS = re.compile(r"^vllm:request_success_total\{([^}]*)\}\s+([0-9.eE+-]+)$")
_REASON = re.compile(r'finished_reason="([^"]*)"')
_IN_ENGINE = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$")


def request_counts(base_url: str, timeout: float) -> RequestCounts | None:
    """None when /metrics does not answer (the server is gone or never listened)."""
    reply = http.request(f"{base_url}/metrics", timeout=timeout)
    return counts_from_metrics(reply.body) if reply.status == 200 else None


def counts_from_metrics(body: str) -> RequestCounts:
    finished = in_engine = 0.0
    for line in body.splitlines():
        gauge = _IN_ENGINE.match(line)
        if gauge:
            in_engine += float(gauge.group(1))
        match = _SUCCESS.match(line)
        if match:
            reason = _REASON.search(match.group(1))
            if reason is None or reason.group(1) != "abort":
                finished += float(match.group(2))
    return RequestCounts(int(in_engine), int(finished))


def drained_stop(
    stop: Callable[[], StopAnswer], base_url: str, timeout_s: int, probe_s: float
) -> tuple[StopAnswer, DrainReport]:
    """Runs `stop` (which blocks until the server's processes are gone, and says how its drain ended) while
    /metrics is read every POLL_S."""
    from dspark_launch.cluster.parallel import Background

    before = request_counts(base_url, probe_s)
    began = time.monotonic()
    stopping = Background(stop)
    last = before
    while not stopping.ended(POLL_S):
        counts = request_counts(base_url, probe_s)
        if counts is not None:
            last = counts
    answer = stopping.result()
    return answer, report(before, last, time.monotonic() - began, timeout_s, answer.drain)


def report(
    before: RequestCounts | None, last: RequestCounts | None, seconds: float, timeout_s: int, outcome: str
) -> DrainReport:
    """`outcome`: the agent's StopAnswer.drain."""
    if before is None:
        return DrainReport(0, 0, 0, seconds, timeout_s, answered=False)
    if outcome == "idle":
        return DrainReport(0, 0, 0, seconds, timeout_s, idle=True)
    if outcome == "complete":  # the EngineCore ran out of work: it finished every request it had
        return DrainReport(before.in_flight, before.in_flight, 0, seconds, timeout_s)
    finished = min(before.in_flight, max(0, last.finished - before.finished)) if last else 0
    return DrainReport(before.in_flight, finished, before.in_flight - finished, seconds, timeout_s)
