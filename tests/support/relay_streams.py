"""A relay of streaming chats inside the head node (tests/support/stream_client.py's `relay` mode): a stream
is in flight whenever the server takes requests, so a drain always has one to finish."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.support.on_testbed import API_KEY

CLIENT = Path(__file__).parent / "stream_client.py"
#: A stream's length in a paced life (launcher_env.paced_extra_args): at least 30 s of PACED_STEP_MS steps, about as
#: long as the 900 unpaced tokens it replaces took on loaded cores, for a third of their CPU.
PACED_TOKENS = 300


def relayed_streams(tb, max_tokens: int) -> subprocess.Popen:
    """Streams one after another until the server refuses one; returned once the first has its first token."""
    client = tb.popen(
        "head",
        [sys.executable, str(CLIENT), "http://127.0.0.1:8000", API_KEY, "tiny", "1", str(max_tokens), "relay"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = client.stdout.readline()
        if not line or line.startswith("first "):
            break
    assert client.poll() is None, client.stderr.read()[-2000:]
    return client


def drained_relay(client: subprocess.Popen, command_stderr: str) -> list[dict]:
    """The relay's outcome after a drained stop or restart: every stream the old server took ran to its length,
    the one after them was refused before a token (none cut), and the command counted the one in flight as
    finished, 0 cut. Returns the served streams."""
    streamed, streamed_err = client.communicate(timeout=300)
    results = [json.loads(line) for line in streamed.splitlines() if line.startswith("{")]
    *served, refused = results
    assert served and all((r["finish_reason"], r["error"]) == ("length", None) for r in served), streamed + streamed_err
    assert refused["error"] is not None and refused["tokens"] == 0, streamed + streamed_err
    drained = [line for line in command_stderr.splitlines() if "vllm serve drained in" in line]
    counted = re.search(r"(\d+) request\(s\) finished, 0 cut$", drained[0]) if drained else None
    assert counted and 1 <= int(counted.group(1)) <= len(served), command_stderr[-3000:]
    return served
