"""A port squatter: another local user's listener on a port the launcher talks to (issue 30's attacks).

Run as a file, as an unprivileged user: `python squatter.py HOST PORT [v6only]` (`v6only`: an IPv6 socket with
IPV6_V6ONLY, which Linux lets bind `[::]:PORT` beside another user's 127.0.0.1:PORT). It binds HOST:PORT, writes
`listening on HOST:PORT`, then for every connection `connection N: BYTES` (what the client sent in
its first two seconds, repr-ed), and answers like a healthy server would (HTTP 200 with a model list),
so a launcher that trusted whoever answers would go on and send its secrets.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time

_SAYING = threading.Lock()


def say(line: str) -> None:
    # One write per line under a lock: print() writes the text and the newline apart, and connection threads
    # interleave them (this script runs isolated, `-I`, so it cannot share fake_api's).
    with _SAYING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def serve(conn: socket.socket, number: int) -> None:
    conn.settimeout(2)
    got = b""
    try:
        while len(got) < 65536:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
            if b"\r\n\r\n" in got:
                break
    except OSError:
        pass
    say(f"connection {number}: {got[:4000]!r}")
    body = json.dumps({"data": [{"id": "tiny"}], "choices": [{"message": {"content": "hi"}}]}).encode()
    try:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
    except OSError:
        pass
    conn.close()


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sys.argv[3:] == ["v6only"]:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    listener.bind((host, port))
    listener.listen(16)
    say(f"listening on {host}:{listener.getsockname()[1]}")
    number = 0
    while True:
        conn, _ = listener.accept()
        number += 1
        threading.Thread(target=serve, args=(conn, number), daemon=True).start()


if __name__ == "__main__":
    main()


# --- for the tests that start one ---------------------------------------------------------------

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


def argv(python: str, host: str, port: int, v6only: bool = False) -> list[str]:
    """The squatter as user nobody (`-I`: nothing of the caller's environment or folder imported)."""
    return [*NOBODY, python, "-I", __file__, host, str(port), *(["v6only"] if v6only else [])]


def wait_listening(log, timeout: float = 30) -> int:
    """The port from the squatter's first line in `log` (a Path)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"listening on (?:.*:)?(\d+)$", log.read_text() if log.exists() else "", re.M)
        if found:
            return int(found.group(1))
        time.sleep(0.05)
    raise AssertionError(f"the squatter never listened: {log.read_text() if log.exists() else ''}")


def in_node(tb, node: str, log, host: str, port: int, v6only: bool = False) -> subprocess.Popen:
    """The squatter as user nobody inside a testbed node (its output in `log`, a Path), once it listens."""
    with log.open("w") as out:
        proc = tb.popen(node, argv(sys.executable, host, port, v6only), stdout=out, stderr=subprocess.STDOUT)
    wait_listening(log)
    return proc


def connections(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("connection ")]
