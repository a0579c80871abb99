"""`dspark smoke`: a few requests at once to the recorded server, each timed."""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import Iterator

from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord
from dspark_launch.errors import DsparkError
from dspark_launch.serve import http
from dspark_launch.serve.api_holder import keyed, require_ours


@dataclass(frozen=True)
class SmokeReply:
    index: int
    status: int  # HTTP status; 0: no answer
    seconds: float
    completion_tokens: int | None  # from the reply's usage, when it says

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def line(self) -> str:
        if self.ok:
            tokens = "?" if self.completion_tokens is None else self.completion_tokens
            return f"request {self.index}: ok {self.seconds:.2f} s, {tokens} tokens"
        return f"request {self.index}: FAILED HTTP {self.status or 'unreachable'} after {self.seconds:.2f} s"


def confirm_server(spec: ClusterSpec, server: ServerRecord, key: str) -> http.Keyed:
    """Nothing is sent (the key least of all) unless the recorded server holds its port; the key for its
    requests, each checked again before it is sent (serve/api_holder.py `ServerPort`)."""
    holder = require_ours(spec, server)
    if not holder.ours:
        state = "is not running" if not holder.recorded_alive else f"does not listen on {server.url} yet"
        raise DsparkError(f"vllm serve (pid {server.pid}) {state}; nothing was sent; `dspark status` shows it")
    return keyed(spec, server, key, holder)


def smoke(
    server: ServerRecord, key: http.Keyed, concurrency: int, max_tokens: int, timeout: float
) -> Iterator[SmokeReply]:
    """`concurrency` requests sent at once (chat when the server serves a chat model), in order as they answer;
    each request's port check is made as it is sent (a foreign listener: ForeignApiListener, nothing sent)."""
    ask = http.chat if server.chat else http.complete

    def one(index: int) -> SmokeReply:
        began = time.monotonic()
        reply = ask(server.url, key, server.served_name, f"Say hello ({index}).", max_tokens, timeout)
        took = time.monotonic() - began
        tokens = reply.json().get("usage", {}).get("completion_tokens") if reply.status == 200 else None
        return SmokeReply(index, reply.status, took, tokens)

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        yield from pool.map(one, range(concurrency))
