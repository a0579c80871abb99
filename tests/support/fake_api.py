"""A stand-in for vLLM's OpenAI server whose chat answers follow a script (tests of start's readiness).

Run as a file: `python fake_api.py SERVED_NAME CAP ACTION[,ACTION...]`. It listens on a free loopback port,
writes `listening on PORT` and the hotfix's active line to stdout (the server log), answers /health and
/v1/models at once (each logged as `GET PATH key=yes|no`: whether it came with a key), and answers the
n-th chat request with the n-th action (the last one repeats):
  ok      200 with one token
  NNN     that HTTP status (503, 401, ...)
  hang    no answer until the client gives up
  orphan  a few seconds in, the process exits while a forked child keeps the request's connection open, as
          an engine's child process holding the API's sockets would; the child writes `client closed` when
          the client gives up
Every chat request is logged as `chat request N: ACTION`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dspark_launch.hotfix.contract import ACTIVE_LOG_FORMAT

HANG_S = 600
ORPHAN_AFTER_S = 3  # the request is in flight, and seen alive, before the server dies


_SAYING = threading.Lock()


def say(line: str) -> None:
    # One write per line under a lock: print() writes the text and the newline apart, and two request threads
    # saying at once gave "chat request 1: okchat request 2: ok".
    with _SAYING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Api(BaseHTTPRequestHandler):
    served_name = ""
    actions: list[str] = []
    chats = 0
    lock = threading.Lock()

    def _send(self, status: int, body: dict) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        say(f"GET {self.path} key={'yes' if self.headers.get('Authorization') else 'no'}")
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": self.served_name}]})
        else:
            self._send(404, {"error": "no such path"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": "no such path"})
            return
        with Api.lock:
            Api.chats += 1
            number = Api.chats
        action = self.actions[min(number, len(self.actions)) - 1]
        say(f"chat request {number}: {action}")
        if action == "ok":
            self._send(
                200,
                {"choices": [{"message": {"role": "assistant", "content": "hi"}}], "usage": {"completion_tokens": 1}},
            )
        elif action == "hang":
            time.sleep(HANG_S)
        elif action == "orphan":
            self._orphan()
        else:
            self._send(int(action), {"error": f"scripted {action}"})

    def _orphan(self) -> None:
        if os.fork() == 0:
            say(f"child {os.getpid()} holds the connection")
            self.connection.settimeout(HANG_S)
            try:
                ended = self.connection.recv(1) == b""
            except OSError:
                ended = True
            say("client closed" if ended else "child gave up")
            os._exit(0)
        time.sleep(ORPHAN_AFTER_S)
        say("exiting with the request open")
        os._exit(3)

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    Api.served_name, cap, script = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    Api.actions = script.split(",")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    server.daemon_threads = True
    say(ACTIVE_LOG_FORMAT % (1, cap, 0, "none"))
    say(f"listening on {server.server_address[1]}")
    server.serve_forever()


if __name__ == "__main__":
    main()
