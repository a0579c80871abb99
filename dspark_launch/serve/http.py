"""Small HTTP client for the server's endpoints (stdlib urllib; the key goes in a header).

Every request goes straight to the server: no proxy from `http_proxy`/`all_proxy`
(`127.0.0.1` is not exempt unless `no_proxy` says so, and the proxy would read the
key in clear text), and no redirect is followed (urllib would carry the
Authorization header to wherever a redirect points).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass


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


def request(url: str, key: str = "", payload: dict | None = None, timeout: float = 5.0) -> Reply:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with _DIRECT.open(req, timeout=timeout) as resp:
            return Reply(resp.status, resp.read().decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, TimeoutError):
        return Reply(0, "")


def served_models(base_url: str, key: str, timeout: float) -> list[str]:
    reply = request(f"{base_url}/v1/models", key, timeout=timeout)
    if reply.status != 200:
        return []
    try:
        return [m["id"] for m in reply.json().get("data", [])]
    except (ValueError, KeyError, TypeError):
        return []


def complete(base_url: str, key: str, model: str, prompt: str, max_tokens: int, timeout: float) -> Reply:
    return request(f"{base_url}/v1/completions", key,
                   {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}, timeout)


def chat(base_url: str, key: str, model: str, text: str, max_tokens: int, timeout: float) -> Reply:
    return request(f"{base_url}/v1/chat/completions", key,
                   {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                    "temperature": 0}, timeout)


_METRIC = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+|NaN)$")
WANTED_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def metrics(base_url: str, timeout: float) -> dict[str, float]:
    reply = request(f"{base_url}/metrics", timeout=timeout)
    found: dict[str, float] = {}
    if reply.status != 200:
        return found
    for line in reply.body.splitlines():
        match = _METRIC.match(line)
        if match and match.group(1) in WANTED_METRICS and match.group(1) not in found:
            found[match.group(1)] = float(match.group(2))
    return found
