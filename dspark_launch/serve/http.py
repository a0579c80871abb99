"""Small HTTP client for the server's endpoints (stdlib urllib; the key goes in a header).

Every request goes straight to the server: no proxy from `http_proxy`/`all_proxy`
(`127.0.0.1` is not exempt unless `no_proxy` says so, and the proxy would read the
key in clear text), and no redirect is followed (urllib would carry the
Authorization header to wherever a redirect points).

Every request goes to one literal address: a host name in the URL (`localhost` from an older record) is
resolved once, as the server bound it (`agent/port_holder.bind_address`: vLLM binds IPv4 for a name), and
the connection made to that address only; urllib would otherwise try each address the resolver gives,
`::1` first where /etc/hosts maps localhost to it, where any local user may listen.

The key travels only as a `Keyed`: the key with its port check, which `_prepared`, the one place a request
is built, runs right before each request (not once per command: a readiness retry, `smoke -c N`, each
request of a bench or a tune) against the address the connection is then made to. A bare string is
refused (TypeError), so no caller can send the key unchecked.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

from dspark_launch.agent.port_holder import bind_address


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the 3xx reaches the caller as an HTTPError: a reply, never a second request


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


@dataclass(frozen=True)
class Reply:
    status: int  # 0 when the server could not be reached
    body: str

    def json(self):
        return json.loads(self.body)


@dataclass(frozen=True)
class Keyed:
    """An API key ("" when the API is open) and the check each request carrying it passes first:
    `check(ip, port)`, the literal address the connection is then made to; True when the recorded server holds
    that port, False when nothing of it listens there (nothing is sent); it raises when another process holds
    it (serve/api_holder.py `ServerPort`). `unkeyed()`: the same check for a request without the key (/metrics)."""

    key: str = field(repr=False)
    check: Callable[[str, int], bool]

    def unkeyed(self) -> Keyed:
        return Keyed("", self.check)


def pinned(url: str) -> tuple[str, str, int]:
    """`url` with its host as the literal address the connection goes to, that address, and the port."""
    parts = urllib.parse.urlsplit(url)
    ip = bind_address(parts.hostname or "")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{ip}]" if ":" in ip else ip
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{port}")), ip, port


def _prepared(
    url: str, key: Keyed | None, payload: dict | None, extra_headers: dict[str, str] | None = None
) -> urllib.request.Request | None:
    """The one place a request is built: to the literal address, after the key's check of that address;
    None when the check found nothing of the server's listening there (nothing is sent)."""
    if key is not None and not isinstance(key, Keyed):
        raise TypeError("an API key is sent only with its port check: pass an http.Keyed, not a string")
    url, ip, port = pinned(url)
    if key is not None and not key.check(ip, port):
        return None
    headers = {"Content-Type": "application/json", **(extra_headers or {})}
    if key is not None and key.key:
        headers["Authorization"] = f"Bearer {key.key}"
    data = json.dumps(payload).encode() if payload is not None else None
    return urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")


def request(
    url: str,
    key: Keyed | None = None,
    payload: dict | None = None,
    timeout: float = 5.0,
    headers: dict[str, str] | None = None,
) -> Reply:
    """One request (no key when `key` is None); status 0 when nothing answered or nothing was sent."""
    try:
        req = _prepared(url, key, payload, headers)
    except OSError:  # a name that does not resolve
        return Reply(0, "")
    if req is None:
        return Reply(0, "")
    try:
        with _DIRECT.open(req, timeout=timeout) as resp:
            return Reply(resp.status, resp.read().decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, TimeoutError):
        return Reply(0, "")


def served_models(base_url: str, key: Keyed | None, timeout: float) -> list[str]:
    reply = request(f"{base_url}/v1/models", key, timeout=timeout)
    if reply.status != 200:
        return []
    try:
        return [m["id"] for m in reply.json().get("data", [])]
    except (ValueError, KeyError, TypeError):
        return []


def complete(
    base_url: str,
    key: Keyed | None,
    model: str,
    prompt: str,
    max_tokens: int,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> Reply:
    return request(
        f"{base_url}/v1/completions",
        key,
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout,
        headers,
    )


def chat(
    base_url: str,
    key: Keyed | None,
    model: str,
    text: str,
    max_tokens: int,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> Reply:
    return request(
        f"{base_url}/v1/chat/completions",
        key,
        {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0},
        timeout,
        headers,
    )


@dataclass
class Streamed:
    """One streamed completion as the client saw it: when each chunk with text arrived (monotonic seconds)."""

    status: int = 0  # HTTP status; 0: no answer
    sent: float = 0.0
    chunks: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    prompt_tokens: int | None = None  # from the final usage chunk (stream_options.include_usage)
    completion_tokens: int | None = None
    text: str = ""  # the reply's text (agent turns resend it)
    error: str = ""  # why the stream ended without a usage chunk or a [DONE], "" when it ended well


def stream(
    url: str, key: Keyed | None, payload: dict, timeout: float, stop: Callable[[], bool] = lambda: False
) -> Streamed:
    """A streamed (`"stream": true`) completion or chat completion, read as server-sent events through the
    same direct opener as `request`; `stop()` ends the read early (checked at each event)."""
    parts: list[str] = []
    try:
        req = _prepared(url, key, {**payload, "stream": True, "stream_options": {"include_usage": True}})
    except OSError:
        req = None
    result = Streamed(sent=time.monotonic())
    if req is None:
        result.error = "the server does not hold its port: nothing was sent"
        return result
    try:
        with _DIRECT.open(req, timeout=timeout) as resp:
            result.status = resp.status
            done = False
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = str(
                        chunk["error"].get("message", chunk["error"])
                        if isinstance(chunk["error"], dict)
                        else chunk["error"]
                    )[:200]
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                    if piece:
                        result.chunks.append(time.monotonic())
                        parts.append(piece)
                usage = chunk.get("usage")
                if usage:
                    result.prompt_tokens = usage.get("prompt_tokens")
                    result.completion_tokens = usage.get("completion_tokens")
                if stop():
                    result.error = result.error or "stopped"
                    break
            if not done and not result.error:
                result.error = "the stream ended without [DONE]"
    except urllib.error.HTTPError as exc:
        result.status = exc.code
        result.error = f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}"  # never the URL's query or headers
    result.text = "".join(parts)
    return result


_METRIC = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+|NaN)$")
# field of ServerMetrics -> the Prometheus gauge it is read from (the only place that names them)
_GAUGES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
}


@dataclass(frozen=True)
class ServerMetrics:
    """The numbers `dspark status` shows from the server's /metrics; None: the server did not report it."""

    running: float | None = None  # requests in the model's batches
    waiting: float | None = None  # requests queued
    kv_cache_usage: float | None = None  # fraction of the KV cache in use, 0..1 (vLLM's `_perc` is a fraction)

    @classmethod
    def from_prometheus(cls, text: str) -> ServerMetrics:
        """The first sample of each gauge (one engine: one sample; labels ignored)."""
        wanted = {gauge: name for name, gauge in _GAUGES.items()}
        found: dict[str, float] = {}
        for line in text.splitlines():
            match = _METRIC.match(line)
            if match and match.group(1) in wanted and wanted[match.group(1)] not in found:
                found[wanted[match.group(1)]] = float(match.group(2))
        return cls(**found)

    @property
    def reported(self) -> bool:
        return any(value is not None for value in (self.running, self.waiting, self.kv_cache_usage))

    @property
    def in_engine(self) -> float:
        """Requests running or waiting (0 for what was not reported)."""
        return (self.running or 0.0) + (self.waiting or 0.0)

    def as_prometheus(self) -> dict[str, float]:
        """By gauge name, only those reported: the `metrics` object of `dspark status --json` (docs/cluster.md)."""
        return {gauge: value for name, gauge in _GAUGES.items() if (value := getattr(self, name)) is not None}


def metrics(base_url: str, timeout: float, check: Keyed | None = None) -> ServerMetrics:
    """The server's /metrics (vLLM serves it without a key); `check`: the port check of the key it would go with."""
    reply = request(f"{base_url}/metrics", check.unkeyed() if check else None, timeout=timeout)
    return ServerMetrics.from_prometheus(reply.body) if reply.status == 200 else ServerMetrics()
