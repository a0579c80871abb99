"""A serve-only restart's new `vllm serve`, started warm before the old one stops.

The new server's interpreter (node/serve_entry.py, warm) imports vLLM and checks its own arguments with
vLLM's parser while the old server still serves; only an accepted one goes on, and only once the old
server has stopped is it told to serve (`ServeGo`: its log becomes the server log, then its go file says
go). One interpreter pays vLLM's import where a cold restart pays it twice (the separate check, then the
server), and that import runs before the drain instead of after it. A warm server nobody tells to serve
exits by itself (its go wait) if the launcher dies; every failure here stops it by its marker.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

from dspark_launch.agent.protocol import AliveQuery, NonCarryOver, Process, ServeGo, Session, Spawn, Stop
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.node import serve_entry
from dspark_launch.node.serve_argcheck import VERDICT
from dspark_launch.report import Reporter
from dspark_launch.serve import logscan
from dspark_launch.serve.argcheck import refused_error
from dspark_launch.serve.logfollow import LogReader
from dspark_launch.serve.running_server import SERVER_LOG, ServeFailure
from dspark_launch.serve.serve_spec import ServeSpec

PENDING_LOG = "vllm-serve.next.log"
VERDICT_TIMEOUT_S = 300.0  # as the cold check's
GO_MARGIN_S = 300.0  # the go wait beyond the drain: the old server's teardown and stop, then this launcher


@dataclass(frozen=True)
class WarmServer:
    marker: str
    process: Process
    session: Session
    go_file: str
    pending_log: str


def new_marker() -> str:
    return f"dspark-{secrets.token_hex(4)}-server"


def start_warm(spec: ClusterSpec, serve_spec: ServeSpec, extra_args_source: str, reporter: Reporter) -> WarmServer:
    """The new server started on the head, its arguments accepted by its own vLLM; ConfigError (it has
    exited) when refused, ServeFailure when it died first. The old server is not touched."""
    head = spec.head.agent(reporter)
    reporter.phase("checking the vllm serve arguments with the installed vLLM, in the new server's own "
                   "process (it imports vLLM while the old server still serves)")
    head.call(NonCarryOver(serve_spec.config_root))  # vLLM reads it at import: the same list as the old server's
    marker = new_marker()
    go_file = str(spec.state_dir / f"{marker}.go")
    pending = str(spec.state_dir / "logs" / PENDING_LOG)
    env = {**serve_spec.full_env(), serve_entry.GO_FILE_ENV: go_file,
           serve_entry.GO_WAIT_ENV: str(serve_spec.drain_timeout_s + GO_MARGIN_S)}
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
            word = said[0][len(VERDICT):]
            return None if word == "ok" else str(json.loads(word))
        if not head.call(AliveQuery((warm.process,))).alive[0]:
            if VERDICT in log.refresh():
                continue
            raise ServeFailure(f"the new vllm serve exited before its argument check: {logscan.failure(log.text)}; "
                               f"log {warm.pending_log}")
        if time.monotonic() - start > VERDICT_TIMEOUT_S:
            raise ServeFailure(f"the new vllm serve did not check its arguments within {VERDICT_TIMEOUT_S:.0f} s; "
                               f"log {warm.pending_log}")
        time.sleep(0.1)


def tell_to_serve(spec: ClusterSpec, warm: WarmServer) -> str:
    """Once the old server has stopped: the warm server's log is the server log now, and it serves."""
    log = str(spec.state_dir / "logs" / SERVER_LOG)
    return spec.head.agent().call(ServeGo(warm.go_file, warm.pending_log, log), "vllm serve (go)").log


def cancel_warm(spec: ClusterSpec, warm: WarmServer) -> None:
    spec.head.agent().call(Stop(warm.marker, (warm.process,), (warm.session,), 5.0), "stop the new server")
