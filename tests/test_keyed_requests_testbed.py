"""The real `dspark start` with `VLLM_HOST=localhost` beside `nobody` squatters on the head, on the testbed,
whose nodes map localhost to ::1 in /etc/hosts (getaddrinfo gives ::1 first).

Before: with `nobody` on [::1]:PORT, `start` exited 0 and the squatter got `GET /v1/models` and the one-token
chat completion with the key (the port check resolved localhost IPv4-only; urllib tried ::1 first); then
`smoke` and `status` the same. With `nobody` on [::]:PORT with IPV6_V6ONLY beside the server's 127.0.0.1:PORT
the verdict was "foreign": `smoke` exit 1, `status` a problem line, `reload` refused. Now the server binds and
the launcher records, checks and reaches 127.0.0.1 only, and a v6-only listener holds no IPv4 port. The same on
loopback, in seconds: tests/test_keyed_requests.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import squatter
from tests.support.on_testbed import API_KEY, run, serving_env, set_knob, state

pytestmark = [pytest.mark.testbed, pytest.mark.serving]

API_PORT = 8000  # serving_env's VLLM_PORT


def squat(tb, tmp_path, host: str, v6only: bool = False):
    log = tmp_path / f"squatter-{host.strip(':') or 'any'}.log"
    with log.open("w") as out:
        proc = tb.popen(
            "head", squatter.argv(sys.executable, host, API_PORT, v6only), stdout=out, stderr=subprocess.STDOUT
        )
    squatter.wait_listening(log)
    return proc, log


def test_localhost_serves_beside_squatters_on_the_ipv6_loopback_and_a_v6only_wildcard(
    testbed_clean, tmp_path, tiny_model, step
):
    tb = testbed_clean
    env = serving_env(tb, tmp_path, tiny_model, VLLM_HOST="localhost")
    order = tb.exec(
        "head",
        [sys.executable, "-c", f"import socket; print(socket.getaddrinfo('localhost', {API_PORT}, type=1)[0][4][0])"],
        check=True,
    )
    assert order.stdout.strip() == "::1"  # guard: the node's resolver gives ::1 first, as on Debian
    loopback6, loopback6_log = squat(tb, tmp_path, "::1")
    wildcard6 = None
    try:
        step("start beside nobody on [::1]")
        started = run(tb, tmp_path, env, "start")
        out = started.stdout + started.stderr
        assert started.returncode == 0, out[-4000:]
        assert f"at http://127.0.0.1:{API_PORT}/v1" in started.stdout and API_KEY not in out
        assert state(tmp_path)["server"]["url"] == f"http://127.0.0.1:{API_PORT}"

        step("smoke and status beside nobody on [::1]")
        smoked = run(tb, tmp_path, env, "smoke", "-c", "3")
        assert smoked.returncode == 0 and "3 passed, 0 failed" in smoked.stdout, smoked.stdout + smoked.stderr
        shown = run(tb, tmp_path, env, "status", "--json")
        view = json.loads(shown.stdout)
        assert view["server"]["healthy"] and not [p for p in view["problems"] if "VLLM_PORT" in p], view
        assert squatter.connections(loopback6_log) == [], squatter.connections(loopback6_log)

        step("smoke, status and reload beside nobody on [::] with IPV6_V6ONLY")
        loopback6.kill()
        loopback6.wait()
        wildcard6, wildcard6_log = squat(tb, tmp_path, "::", v6only=True)
        smoked = run(tb, tmp_path, env, "smoke", "-c", "2")
        assert smoked.returncode == 0 and "2 passed, 0 failed" in smoked.stdout, smoked.stdout + smoked.stderr
        shown = run(tb, tmp_path, env, "status", "--json")
        view = json.loads(shown.stdout)
        assert shown.returncode == 0 and view["state"] == "up", view
        assert not [p for p in view["problems"] if "VLLM_PORT" in p], view
        set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "2")
        reloaded = run(tb, tmp_path, env, "reload")
        assert reloaded.returncode == 0, reloaded.stdout + reloaded.stderr
        assert squatter.connections(wildcard6_log) == [], squatter.connections(wildcard6_log)

        step("stop")
        assert run(tb, tmp_path, env, "stop").returncode == 0
    finally:
        for proc in (loopback6, wildcard6):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
