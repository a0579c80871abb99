"""The node end of the agent protocol: `python -m dspark_launch.agent.node_end`, one request per process.

It is the only command the launcher runs on a node (over SSH for workers, as a local
child for the head); the request, secrets included, travels on stdin, never on argv.
The answers and progress lines are described in `protocol`, whose OPERATIONS name each
operation's handler: only that one handler module is imported (`handlers/`, by subject), so
node operations answer in well under a second and the head's Ray and vLLM operations import
those only when asked; the launcher's own process never imports a handler.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Callable

from dspark_launch import __version__
from dspark_launch.agent import protocol as p
from dspark_launch.agent.codec import DecodeError, from_data, to_data
from dspark_launch.agent.protocol import OperationFailed


def handler(op: str) -> Callable:
    """The handler OPERATIONS names for `op`, its module imported now."""
    return getattr(importlib.import_module(f"dspark_launch.agent.handlers.{p.OPERATIONS[op].subject}"), op)


_wire = sys.stdout  # main() points this at the real stdout and everything else at stderr


def _emit(kind: str, payload) -> None:
    _wire.write(json.dumps({kind: to_data(payload)}) + "\n")
    _wire.flush()


def serve_one(line: str) -> None:
    """Decode one request line, run its handler, write progress lines and one final line."""
    try:
        envelope = json.loads(line)
        theirs = (envelope.get("protocol"), envelope.get("launcher"))
        if theirs != (p.PROTOCOL_VERSION, __version__):
            _emit(
                "failure",
                p.Failure(
                    p.VERSION_STEP,
                    f"dspark-launch {__version__} (protocol {p.PROTOCOL_VERSION}) "
                    f"here, {theirs[1]} (protocol {theirs[0]}) on the launcher",
                ),
            )
            return
        request: object = from_data(p.OPERATIONS[envelope["op"]].request, envelope["request"])
    except (ValueError, KeyError, TypeError, DecodeError) as exc:
        _emit("failure", p.Failure("protocol", f"unreadable request: {type(exc).__name__}: {exc}"))
        return
    try:
        answer = handler(envelope["op"])(request, lambda progress: _emit("progress", progress))
    except OperationFailed as exc:
        _emit("failure", exc.failure)
        return
    except Exception as exc:  # the answer must always be a line the launcher can read
        _emit("failure", p.Failure(envelope["op"], f"{type(exc).__name__}: {exc}"))
        return
    _emit("answer", answer)


def main() -> int:
    global _wire
    # Only protocol lines on stdout: whatever a handler's libraries (or their children) print goes to stderr.
    _wire = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve_one(sys.stdin.readline())
    return 0


if __name__ == "__main__":
    sys.exit(main())
