"""A `dspark start --foreground` supervisor on the testbed, read as it writes, and what tests send it (stdlib)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.on_testbed import API_KEY

URL = "http://127.0.0.1:8000"
CLIENT = Path(__file__).parent / "stream_client.py"


class Journal:
    """The supervisor's output (stdout and stderr merged), read as it comes."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.proc = proc
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float, count: int = 1) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.findall(pattern, self.text())
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None and not self.thread.is_alive():
                break
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} (x{count}) in the supervisor's output:\n{self.text()[-5000:]}")


def one_stream(tb, max_tokens: int = 900) -> subprocess.Popen:
    """A long streaming chat inside the head node, returned once its first token came."""
    client = tb.popen(
        "head",
        [sys.executable, str(CLIENT), URL, API_KEY, "tiny", "1", str(max_tokens)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = client.stdout.readline()
    assert line.startswith("first "), line + client.stderr.read()[-2000:]
    return client


POST = """
import json, sys, time, urllib.request
body = json.dumps({"model": "tiny", "prompt": sys.stdin.read(), "max_tokens": int(sys.argv[3])}).encode()
request = urllib.request.Request(sys.argv[1] + "/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + sys.argv[2]})
began = time.monotonic()
with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=600) as reply:
    print(json.dumps({"status": reply.status, "reply": json.loads(reply.read()), "seconds": time.monotonic() - began}))
"""


def completion_argv(max_tokens: int = 1) -> list[str]:
    """A completion sent from inside the head node (prompt on stdin), printing status, reply and seconds as JSON."""
    return [sys.executable, "-c", POST, URL, API_KEY, str(max_tokens)]
