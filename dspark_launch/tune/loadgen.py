"""The load generator: a workload's classes streamed at the server at once, one thread per lane.

Requests go through `serve.http` (stdlib urllib, no proxy, no redirect: the same client as readiness and
smoke), so whatever that module checks before a key is sent holds here too. Threads, not asyncio: the
number of streams is bounded by the server's `MAX_NUM_SEQS` (tens), and urllib's blocking reads keep one
client for every command. Bounded twice: no request starts after the deadline, and the streams still
running at the deadline are cut at their next event (counted as cut, not as errors).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from dspark_launch.errors import DsparkError
from dspark_launch.serve import http
from dspark_launch.tune.workload import Request, RequestClass, Workload, words


@dataclass(frozen=True)
class Target:
    """Where and how to ask: the recorded server's URL, served name and API kind; the key stays in memory, with
    the port check each request passes before it is sent (`http.Keyed`; None: no key, no check)."""

    url: str
    model: str
    chat: bool
    key: http.Keyed | None = field(repr=False, default=None)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One request as measured by the client (monotonic seconds)."""

    klass: str
    index: int
    status: int
    sent: float
    chunks: tuple[float, ...]
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str = ""
    cut: bool = False  # ended by the time bound or an interrupt, not by the server

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and bool(self.chunks)


def payload(target: Target, messages: list[dict], max_tokens: int) -> tuple[str, dict]:
    """The endpoint and body: chat when the server serves a chat model, else the messages' text as a prompt.
    `ignore_eos` (vLLM's extension) makes a reply as long as asked: a random or terse model stops early."""
    common = {"model": target.model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if target.chat:
        return f"{target.url}/v1/chat/completions", {**common, "messages": messages}
    return f"{target.url}/v1/completions", {**common, "prompt": "\n".join(m["content"] for m in messages)}


def calibrate(target: Target, timeout: float = 120.0) -> float:
    """Prompt tokens per word of the workload's vocabulary, as the server's tokenizer counts them (the slope
    between two prompt sizes, so a chat template's fixed tokens do not count); 1.5 when it cannot tell."""
    rng = random.Random(7)
    counts = []
    for size in (20, 220):
        url, body = payload(target, [{"role": "user", "content": words(size, rng)}], 1)
        reply = http.request(url, target.key, {**body, "ignore_eos": False}, timeout)
        try:
            counts.append(int(reply.json()["usage"]["prompt_tokens"]) if reply.status == 200 else 0)
        except (ValueError, KeyError, TypeError):
            counts.append(0)
    slope = (counts[1] - counts[0]) / 200
    return slope if slope > 0.2 else 1.5


class Run:
    """One pass of the workload; `stop()` (an interrupt) ends it early like the deadline does."""

    def __init__(
        self,
        target: Target,
        workload: Workload,
        tokens_per_word: float,
        seconds: float,
        request_timeout: float = 600.0,
        progress: Callable[[int, int], None] | None = None,
    ):
        self.target, self.workload = target, workload
        self.tokens_per_word = tokens_per_word
        self.seconds = seconds
        self.request_timeout = request_timeout
        self.progress = progress or (lambda done, total: None)
        self.nonce = uuid.uuid4().hex[:12]  # cold prompts are cold in every run
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._refused: list[DsparkError] = []  # a lane's port check found another process on the port
        self.outcomes: list[Outcome] = []
        self.began = self.ended = 0.0

    def stop(self) -> None:
        self._stopped.set()

    def _words(self, tokens: int) -> int:
        return max(1, int(tokens / self.tokens_per_word))

    def _messages(self, request: Request, rng: random.Random, history: list[dict]) -> list[dict]:
        if request.messages:
            return list(request.messages)
        if request.text:
            return [{"role": "user", "content": request.text}]
        if history:  # an agent turn: the conversation so far, the last reply included, plus new words
            return [*history, {"role": "user", "content": words(self._words(request.prompt_tokens), rng)}]
        head = f"[{self.nonce} {request.klass} {request.index}] "  # a prefix no earlier request had
        return [{"role": "user", "content": head + words(self._words(request.prompt_tokens), rng)}]

    def _lane(self, klass: RequestClass, lane: int, deadline: float) -> None:
        rng = random.Random(f"{self.workload.seed}-{klass.name}-{lane}")
        mine = klass.requests if klass.turns else klass.requests[lane :: klass.lanes]
        history: list[dict] = []
        for request in mine:
            if self._stopped.is_set() or time.monotonic() >= deadline:
                return
            messages = self._messages(request, rng, history)
            url, body = payload(self.target, messages, request.max_tokens)
            timed_out = lambda: self._stopped.is_set() or time.monotonic() >= deadline  # noqa: E731
            try:
                got = http.stream(
                    url,
                    self.target.key,
                    body,
                    min(self.request_timeout, max(1.0, deadline - time.monotonic())),
                    stop=timed_out,
                )
            except DsparkError as exc:  # the port is someone else's now: nothing was sent; the run ends
                with self._lock:
                    self._refused.append(exc)
                self.stop()
                return
            cut = got.error == "stopped" or (bool(got.error) and timed_out())
            outcome = Outcome(
                klass=klass.name,
                index=request.index,
                status=got.status,
                sent=got.sent,
                chunks=tuple(got.chunks),
                prompt_tokens=got.prompt_tokens,
                completion_tokens=got.completion_tokens,
                error="" if cut else got.error,
                cut=cut,
            )
            with self._lock:
                self.outcomes.append(outcome)
                self.progress(len(self.outcomes), self.workload.requests)
            if klass.turns:
                if not outcome.ok:
                    return  # the conversation is broken: its later turns would not be cached turns
                history = [*messages, {"role": "assistant", "content": got.text or "ok"}]

    def run(self) -> list[Outcome]:
        """Every lane of every class at once, until all are done, the deadline passed or `stop()`; the waiting
        main thread stays interruptible (Ctrl-C reaches it between short joins)."""
        self.began = time.monotonic()
        deadline = self.began + self.seconds
        threads = [
            threading.Thread(
                target=self._lane, args=(klass, lane, deadline), daemon=True, name=f"bench-{klass.name}-{lane}"
            )
            for klass in self.workload.classes
            for lane in range(klass.lanes)
        ]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
        finally:
            self._stopped.set()  # an interrupt: the lanes stop at their next event
        self.ended = time.monotonic()
        if self._refused:
            raise self._refused[0]
        return sorted(self.outcomes, key=lambda o: (o.klass, o.index))
