"""The first answer of a started server: one-token requests retried with bounded backoff until the start's
deadline, the server's life checked while each one is in flight.

A first request can take long: kernels compiled on first use, Ray's execution graph set up on the first
step, a busy host. An attempt that gets no answer in its own timeout, or a 5xx/429, is retried with a longer
timeout after a growing pause; any other reply is final (a wrong key or model name does not heal). A
server that dies meanwhile ends the wait at once, even while an attempt hangs on a connection that a
surviving child process keeps open.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal

from dspark_launch.cluster.parallel import Background
from dspark_launch.report import Reporter
from dspark_launch.serve.http import Reply

Outcome = Literal["answered", "died", "refused", "no answer"]
ANSWERED: Outcome = "answered"
DIED: Outcome = "died"
REFUSED: Outcome = "refused"
NO_ANSWER: Outcome = "no answer"
RETRIED_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})  # 0: no answer (timeout, reset, refused)


@dataclass(frozen=True)
class Backoff:
    first_timeout_s: float = 30.0  # the first attempt's own timeout; doubled for each next one
    max_timeout_s: float = 300.0
    first_pause_s: float = 1.0  # before the second attempt; doubled for each next one
    max_pause_s: float = 15.0
    check_s: float = 1.0  # how often the server's life is checked while waiting

    def timeout(self, attempt: int) -> float:
        return min(self.max_timeout_s, self.first_timeout_s * 2 ** (attempt - 1))

    def pause(self, attempt: int) -> float:
        """Before attempt `attempt` + 1."""
        return min(self.max_pause_s, self.first_pause_s * 2 ** (attempt - 1))


@dataclass(frozen=True)
class FirstAnswer:
    outcome: Outcome
    attempts: int  # requests sent
    reply: Reply  # the last one's (status 0: none)
    latency_s: float  # the last request's own time: for ANSWERED, the first answer's latency
    waited_s: float  # from the first request to the outcome


def first_answer(
    ask: Callable[[float], Reply],
    alive: Callable[[], bool],
    what: str,
    started: float,
    timeout_s: float,
    reporter: Reporter,
    backoff: Backoff = Backoff(),
) -> FirstAnswer:
    """`ask(timeout)` until it answers, until `started` (a monotonic reading) + `timeout_s`, or until `alive()`
    says the server is gone; `what` names the request in progress lines."""
    deadline = started + timeout_s
    first = time.monotonic()
    attempt, reply, latency = 0, Reply(0, ""), 0.0

    def outcome(kind: Outcome) -> FirstAnswer:
        return FirstAnswer(kind, attempt, reply, latency, time.monotonic() - first)

    def wait(seconds: float, done: Callable[[float], bool], message: str) -> bool:
        """Check the server's life every `backoff.check_s` until `done(within)` or `seconds` passed;
        False when it died."""
        until = time.monotonic() + seconds
        while True:
            if not alive():
                return False
            reporter.waiting(message, time.monotonic() - started, timeout_s)
            left = until - time.monotonic()
            if left <= 0 or done(min(backoff.check_s, left)):
                return True

    while True:
        if not alive():
            return outcome(DIED)
        remaining = deadline - time.monotonic()
        if remaining < 1:
            return outcome(NO_ANSWER)
        attempt += 1
        own_timeout = min(backoff.timeout(attempt), remaining)
        sent = time.monotonic()
        request = Background(lambda: ask(own_timeout))
        # A little past the request's own timeout: urllib ends it; a hung socket read is not waited for forever.
        if not wait(own_timeout + 5, request.ended, f"{what}: waiting for the first answer (attempt {attempt})"):
            latency = time.monotonic() - sent
            return outcome(DIED)
        latency = time.monotonic() - sent
        reply = request.result() if request.ended(0) else Reply(0, "")
        if reply.status == 200:
            return outcome(ANSWERED)
        if reply.status not in RETRIED_STATUSES:
            return outcome(REFUSED)
        pause = min(backoff.pause(attempt), max(0.0, deadline - time.monotonic()))
        got = f"HTTP {reply.status}" if reply.status else "no answer"
        reporter.phase(f"{what}: attempt {attempt}: {got} after {latency:.1f} s; retrying in {pause:.0f} s")
        if not wait(
            pause, lambda within: time.sleep(within) or False, f"{what}: retrying (attempt {attempt + 1} next)"
        ):
            return outcome(DIED)
