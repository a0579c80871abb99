"""Where one `dspark status --json` spends its time, traced in-process (run by bench/fast_ops.py inside the
testbed's head node): `python bench/status_trace.py ENV_FILE` prints one JSON object.

Every agent call (op, node) and every HTTP request the launcher makes is timed from the process's start, as
are the imports up to the CLI app and the command itself; calls that overlap in time ran at once.
"""

from __future__ import annotations

import time

BEGAN = time.monotonic()

import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402


def since() -> float:
    return round(time.monotonic() - BEGAN, 3)


def main(env_file: str) -> None:
    from dspark_launch.cli.main import app

    imported = since()
    from dspark_launch.agent.client import NodeAgent
    from dspark_launch.serve import http

    spans: list[dict] = []
    lock = threading.Lock()

    def traced(name, fn):
        def wrapper(*args, **kwargs):
            began = since()
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    spans.append({"what": name(*args), "from_s": began, "to_s": since()})

        return wrapper

    NodeAgent.call = traced(
        lambda self, request, *rest: f"agent {self.label.split(' ')[0]}: {type(request).__name__}", NodeAgent.call
    )
    http.request = traced(lambda url, *rest: f"http {url.rsplit('/', 1)[-1]}", http.request)
    out = sys.stdout
    sys.stdout = open("/dev/null", "w")
    command_began = since()
    try:
        app(["status", "--json", "--env-file", env_file], standalone_mode=False)
    except SystemExit:
        pass
    finally:
        sys.stdout = out
    ended = since()
    print(
        json.dumps(
            {
                "imports_to_cli_app_s": imported,
                "command_from_s": command_began,
                "command_to_s": ended,
                "calls": sorted(spans, key=lambda s: s["from_s"]),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
