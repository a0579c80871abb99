"""Fast day-to-day commands (issue 35) on the two-namespace testbed: real SSH, Ray, vLLM (CPU).

With a drain limit of 600 s: a serve-only `restart` while a stream is in flight drains it (the stream ends
with its finish reason, the stop counts it finished; the client relays one stream after another, so one is
in flight when the drain begins however long the restart's checks take) and, its arguments unchanged,
skips the serve-argument check; an idle `stop` then ends as soon as the EngineCore says it had nothing in flight. Timings go to
bench/fast_ops.py, never here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dspark_launch.serve.drain import BUSY_LOG, DRAINED_LOG
from tests.support.on_testbed import API_KEY, our_pids, run, serving_env
from tests.support.processes import describe

pytestmark = [pytest.mark.testbed, pytest.mark.serving]

CLIENT = Path(__file__).parent / "support" / "stream_client.py"


def relayed_streams(tb, max_tokens: int) -> subprocess.Popen:
    """Streams one after another (stream_client.py's relay) until the server refuses one; returned once
    the first has its first token."""
    client = tb.popen("head", [sys.executable, str(CLIENT), "http://127.0.0.1:8000", API_KEY, "tiny", "1",
                               str(max_tokens), "relay"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = client.stdout.readline()
        if not line or line.startswith("first "):
            break
    assert client.poll() is None, client.stderr.read()[-2000:]
    return client


def test_a_streaming_drain_finishes_its_request_and_an_idle_stop_does_not_wait(testbed_clean, tmp_path, tiny_model):
    tb = testbed_clean
    env = serving_env(tb, tmp_path, tiny_model, MAX_MODEL_LEN="1024", MAX_NUM_BATCHED_TOKENS="1024",
                      DSPARK_DRAIN_TIMEOUT_S="600")
    started = run(tb, tmp_path, env, "start")
    assert started.returncode == 0, started.stderr[-4000:]
    log = tmp_path / "state" / "logs" / "vllm-serve.log"

    # Nothing changed: a serve-only restart, its arguments accepted at the start and not checked again.
    client = relayed_streams(tb, 900)
    restarted = run(tb, tmp_path, env, "restart")
    assert restarted.returncode == 0, restarted.stderr[-4000:]
    out, err = client.communicate(timeout=300)
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    # Every stream the old server took ran to its length; the one after them was refused, none was cut.
    *served, refused = results
    assert served and all((r["finish_reason"], r["error"]) == ("length", None) for r in served), out + err
    assert refused["error"] is not None and refused["tokens"] == 0, out + err
    assert "not checked again" in restarted.stderr, restarted.stderr[-3000:]
    drained = [line for line in restarted.stderr.splitlines() if "vllm serve drained in" in line]
    finished = re.search(r"(\d+) request\(s\) finished, 0 cut$", drained[0]) if drained else None
    assert finished and 1 <= int(finished.group(1)) <= len(served), restarted.stderr[-3000:]

    # Idle: the EngineCore logs its done line with no busy line before it, and the stop ends there.
    before = log.stat().st_size
    stopped = run(tb, tmp_path, env, "stop")
    assert stopped.returncode == 0, stopped.stderr[-4000:]
    assert "vllm serve was idle (nothing in flight): stopped in" in stopped.stderr, stopped.stderr[-3000:]
    tail = log.read_bytes()[before:].decode(errors="replace")
    assert DRAINED_LOG in tail and BUSY_LOG not in tail, tail[-3000:]
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
