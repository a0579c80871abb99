"""The launcher's own HTTP calls go straight to the server, never through a proxy (issue 14, point 2).

A loopback HTTP server stands in for the API and another loopback listener for a
proxy; every proxy variable points at the listener. The listener must see nothing
while the API gets each request with its Authorization header.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dspark_launch.cluster.state import Deployment, ServerRecord, save_state
from dspark_launch.node import procfs
from dspark_launch.serve import http
from tests.support.launcher_env import run_dspark

KEY = "sk-direct-only-0123456789"
# The key with a port check that lets every request go (the check itself: tests/test_keyed_requests.py).
KEYED = http.Keyed(KEY, lambda ip, port: True)
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


class _Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler):
        super().__init__(("127.0.0.1", 0), handler)
        self.seen: list[tuple[str, str, str]] = []  # (method, path, Authorization)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _FakeApi(BaseHTTPRequestHandler):
    """Answers the endpoints the launcher calls, as vLLM's OpenAI server would."""

    def _answer(self) -> None:
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path == "/metrics":
            body, kind = "vllm:num_requests_running 2.0\nvllm:num_requests_waiting 1.0\n", "text/plain"
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        else:
            body = json.dumps(
                {"data": [{"id": "tiny"}], "usage": {"completion_tokens": 1}, "choices": [{"text": "hi"}]}
            )
            kind = "application/json"
        payload = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def _recorder():
    server = _Recorder(_FakeApi)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def api():
    yield from _recorder()


@pytest.fixture
def proxy():
    """Records every request that reaches it, as a proxy would."""
    yield from _recorder()


@pytest.fixture
def proxied(monkeypatch, proxy):
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, proxy.url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return {name: proxy.url for name in PROXY_VARIABLES}


def test_the_proxy_variables_are_in_force(proxied, api, proxy):
    """Guards the test itself: urllib's default opener does send loopback traffic to the listener."""
    # A fresh default opener: urlopen() would cache this proxied one for every later test of the process.
    with urllib.request.build_opener().open(f"{api.url}/health", timeout=5) as reply:
        assert reply.status == 200
    assert [path for _, path, _ in proxy.seen] == [f"{api.url}/health"] and api.seen == []


def test_health_models_completion_and_metrics_go_direct(proxied, api, proxy):
    assert http.request(f"{api.url}/health", KEYED).status == 200
    assert http.served_models(api.url, KEYED, 5) == ["tiny"]
    assert http.complete(api.url, KEYED, "tiny", "Hello", 1, 5).status == 200
    assert http.metrics(api.url, 5) == http.ServerMetrics(running=2.0, waiting=1.0)
    assert proxy.seen == []
    assert api.seen == [
        ("GET", "/health", f"Bearer {KEY}"),
        ("GET", "/v1/models", f"Bearer {KEY}"),
        ("POST", "/v1/completions", f"Bearer {KEY}"),
        ("GET", "/metrics", ""),
    ]


def test_a_redirect_is_not_followed_with_the_key(proxied, api, proxy):
    api.redirect_to = f"{proxy.url}/elsewhere"
    assert http.request(f"{api.url}/redirect", KEYED).status == 302
    assert proxy.seen == [] and api.seen == [("GET", "/redirect", f"Bearer {KEY}")]


def test_smoke_command_goes_direct(tmp_path, proxied, api, proxy):
    """`dspark smoke` end to end: real CLI, settings from an env file, the server from the state folder."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    # The stand-in API's socket is this process's: the head's agent finds it among the recorded pid's.
    server = ServerRecord(
        marker="dspark-test-server",
        log="",
        url=api.url,
        served_name="tiny",
        model="tiny",
        started_at=time.time(),
        settings={},
        digest="x",
        cap=1,
        chat=True,
        pid=os.getpid(),
        start_time=procfs.start_time(os.getpid()),
        boot_id=procfs.boot_id(),
    )
    save_state(
        state_dir,
        Deployment(
            ray_address="127.0.0.1:6379",
            config_digest="x",
            started_at=time.time(),
            launcher_version="test",
            nodes=[],
            server=server,
        ),
    )
    env_file = tmp_path / "smoke.env"
    env_file.write_text(
        f"DSPARK_HEAD_IP=127.0.0.1\nDSPARK_WORKER_HOSTS=127.0.0.2\nDSPARK_FABRIC_IFNAME=lo\n"
        f"DSPARK_STATE_DIR={state_dir}\nVLLM_API_KEY={KEY}\n"
    )
    env_file.chmod(0o600)
    proc = run_dspark(["smoke", "-c", "2", "--env-file", str(env_file)], env=proxied)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed, 0 failed" in proc.stdout
    assert proxy.seen == []
    assert sorted(api.seen) == [("POST", "/v1/chat/completions", f"Bearer {KEY}")] * 2
    assert KEY not in proc.stdout + proc.stderr
