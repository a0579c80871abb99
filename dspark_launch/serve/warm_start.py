"""`vllm serve` started warm: its interpreter ready before it may serve.

The new server's interpreter (node/serve_entry.py, warm) imports vLLM and checks its own arguments with
vLLM's parser, and its fork server imports vLLM's engine core, while something else runs: a `start`'s Ray
bring-up and node checks, a serve-only restart's old server (it still serves). Only an accepted one goes on,
and only once that is done is it told to serve (`ServeGo`: its log becomes the server log, then its go file
says go). One interpreter pays vLLM's import where a separate check would pay it once more, and that import
runs beside the rest instead of after it. A warm server nobody tells to serve exits by itself (its go wait)
if the launcher dies; every failure here stops it by its marker.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

from dspark_launch.agent.protocol import AliveQuery, NonCarryOver, Process, ServeGo, Session, Spawn, Stop
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.errors import ConfigError
from dspark_launch.node import serve_entry
from dspark_launch.node.serve_argcheck import VERDICT
from dspark_launch.report import Reporter
from dspark_launch.serve import logscan
from dspark_launch.serve.logfollow import LogReader
from dspark_launch.serve.running_server import SERVER_LOG, ServeFailure
from dspark_launch.serve.serve_spec import ServeSpec

PENDING_LOG = "vllm-serve.next.log"
VERDICT_TIMEOUT_S = 300.0  # vLLM's import and parser take seconds; one stuck this long is a failure
GO_MARGIN_S = 300.0  # the go wait beyond the drain or the start's bound: the old server's teardown, this launcher


@dataclass(frozen=True)
class WarmServer:
    marker: str
    process: Process
    session: Session
    go_file: str
    pending_log: str


def refused_error(reason: str, extra_args_source: str) -> ConfigError:
    return ConfigError(
        f"vllm serve arguments refused by the installed vLLM: {reason} "
        f"(VLLM_EXTRA_ARGS from {extra_args_source}, or a knob); allowed: flags this vLLM knows"
    )


def new_marker() -> str:
    return f"dspark-{secrets.token_hex(4)}-server"


def start_warm(
    spec: ClusterSpec,
    serve_spec: ServeSpec,
    extra_args_source: str,
    reporter: Reporter,
    beside: str,
    go_wait_s: float,
    marker: str = "",
) -> WarmServer:
    """The new server started on the head (with `marker`, or a new one), its arguments accepted by its own
    vLLM; ConfigError (it has exited) when refused, ServeFailure when it died first. `beside`: what runs
    meanwhile, for the report; `go_wait_s`: how long it waits to be told to serve before it exits."""
    head = spec.head.agent(reporter)
    reporter.phase(
        "checking the vllm serve arguments with the installed vLLM, in the new server's own "
        f"process (it imports vLLM while {beside})"
    )
    head.call(NonCarryOver(serve_spec.config_root))  # vLLM reads it at import: the same list as a running server's
    marker = marker or new_marker()
    go_file = str(spec.state_dir / f"{marker}.go")
    pending = str(spec.state_dir / "logs" / PENDING_LOG)
    env = {**serve_spec.full_env(), serve_entry.GO_FILE_ENV: go_file, serve_entry.GO_WAIT_ENV: str(go_wait_s)}
    answer = head.call(Spawn(tuple(serve_spec.argv), env, marker, pending, rotate_log=True), "vllm serve (warm)")
    warm = WarmServer(marker, answer.process, answer.session, go_file, pending)
    try:
        reason = _verdict(spec, warm, reporter)
    except BaseException:
        cancel_warm(spec, warm)
        raise
    if reason is not None:
        cancel_warm(spec, warm)
        raise refused_error(reason, extra_args_source)
    reporter.phase("vllm serve arguments accepted by the installed vLLM (the new server waits to serve)")
    return warm


def _verdict(spec: ClusterSpec, warm: WarmServer, reporter: Reporter) -> str | None:
    head = spec.head.agent(reporter)
    log = LogReader(head, warm.pending_log)
    start = time.monotonic()
    while True:
        text = log.refresh()
        said = [line for line in text.splitlines() if line.startswith(VERDICT)]
        if said:
            word = said[0][len(VERDICT) :]
            return None if word == "ok" else str(json.loads(word))
        if not head.call(AliveQuery((warm.process,))).alive[0]:
            if VERDICT in log.refresh():
                continue
            raise ServeFailure(
                f"the new vllm serve exited before its argument check: {logscan.failure(log.text)}; "
                f"log {warm.pending_log}"
            )
        if time.monotonic() - start > VERDICT_TIMEOUT_S:
            raise ServeFailure(
                f"the new vllm serve did not check its arguments within {VERDICT_TIMEOUT_S:.0f} s; "
                f"log {warm.pending_log}"
            )
        time.sleep(0.1)


def tell_to_serve(spec: ClusterSpec, warm: WarmServer) -> str:
    """Once the old server has stopped: the warm server's log is the server log now, and it serves."""
    log = str(spec.state_dir / "logs" / SERVER_LOG)
    return spec.head.agent().call(ServeGo(warm.go_file, warm.pending_log, log), "vllm serve (go)").log


def cancel_warm(spec: ClusterSpec, warm: WarmServer | None, marker: str = "") -> None:
    """Stop the warm server, or (`warm` None: its start may still be on its way) whatever carries `marker`:
    the agent remembers it, and a spawn with it that comes later is stopped at once."""
    found = (warm.process,) if warm else ()
    sessions = (warm.session,) if warm else ()
    spec.head.agent().call(Stop(warm.marker if warm else marker, found, sessions, 5.0), "stop the new server")
