"""A relay of streaming chats inside the head node (tests/support/stream_client.py's `relay` mode): a stream
is in flight whenever the server takes requests, so a drain always has one to finish."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.support.on_testbed import API_KEY

CLIENT = Path(__file__).parent / "stream_client.py"


def relayed_streams(tb, max_tokens: int) -> subprocess.Popen:
    """Streams one after another until the server refuses one; returned once the first has its first token."""
    client = tb.popen("head", [sys.executable, str(CLIENT), "http://127.0.0.1:8000", API_KEY, "tiny", "1",
                               str(max_tokens), "relay"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = client.stdout.readline()
        if not line or line.startswith("first "):
            break
    assert client.poll() is None, client.stderr.read()[-2000:]
    return client
