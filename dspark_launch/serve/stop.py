"""`dspark stop`: the server (drained unless `--now`), then Ray on every node."""

from __future__ import annotations

from dspark_launch.agent.protocol import DrainEnd, Stop, StopAnswer
from dspark_launch.cluster import lifecycle
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import Deployment, ServerRecord, save_state, wire_sessions
from dspark_launch.config.settings import recorded_value
from dspark_launch.errors import ClusterFailure
from dspark_launch.report import Reporter


def stop_server(
    spec: ClusterSpec,
    server: ServerRecord,
    grace_s: float = 15.0,
    drain_s: float = 0.0,
    drain_end: DrainEnd | None = None,
) -> StopAnswer:
    process = server.process
    return spec.head.agent().call(
        Stop(server.marker, (process,) if process else (), wire_sessions(server.sessions), grace_s, drain_s, drain_end),
        "stop server",
    )


# After vLLM's own drain timeout: its API server's teardown (Ray executor, sockets) before the usual stop.
DRAIN_TEARDOWN_S = 30.0
DRAIN_PROBE_S = 2.0


def drain_server(spec: ClusterSpec, server: ServerRecord, reporter: Reporter) -> StopAnswer:
    """`stop_server`, letting in-flight requests finish first when the server was started with a drain
    timeout (vLLM's --shutdown-timeout); says how many finished and how many were cut. An idle server
    (its EngineCore says so in its log) is stopped at once, without its ~10 s teardown."""
    from dspark_launch.serve.drain import drain_end, drained_stop

    if server.drain_s <= 0:
        return stop_server(spec, server)
    reporter.phase(
        f"vllm serve: draining in-flight requests (up to {server.drain_s} s; new ones are refused; "
        "`dspark stop --now` aborts them)"
    )
    end = drain_end(server.log, recorded_value(server.settings, "vllm_extra_args"))
    answer, report = drained_stop(
        lambda: stop_server(spec, server, drain_s=server.drain_s + DRAIN_TEARDOWN_S, drain_end=end),
        server.url,
        server.drain_s,
        DRAIN_PROBE_S,
    )
    reporter.phase(report.line)
    return answer


def abort_server(spec: ClusterSpec, server: ServerRecord) -> StopAnswer:
    """`--now`: a server started with a drain timeout drains on SIGTERM whatever it is sent after it (vLLM has
    no abort signal then), so its processes get SIGKILL right after the SIGTERM; one started without
    aborts on SIGTERM (the plain stop)."""
    return stop_server(spec, server, grace_s=0.0) if server.drain_s > 0 else stop_server(spec, server)


def stop(spec: ClusterSpec, reporter: Reporter, now: bool = False, remove: bool = False) -> list[str]:
    """The server (drained unless `now`), then Ray on every node; idempotent. Returns nodes that could not
    be stopped. `remove`: the node containers too (else they stay, idle and warm, for the next start)."""
    with lifecycle.locked_deployment(spec.state_dir) as state:
        return stop_locked(spec, reporter, state, now, remove)


def stop_run(spec: ClusterSpec, reporter: Reporter, marker: str, now: bool = False) -> bool:
    """Stop everything (the server drained unless `now`), but only while the record still holds the run whose server
    has `marker` (a supervisor's own run); False, and nothing touched, when an operator's command replaced it."""
    with lifecycle.locked_deployment(spec.state_dir) as state:
        if state is None or state.server is None or state.server.marker != marker:
            return False
        stop_locked(spec, reporter, state, now)
        return True


def stop_locked(
    spec: ClusterSpec, reporter: Reporter, state: Deployment | None, now: bool = False, remove: bool = False
) -> list[str]:
    if state and state.server:
        try:
            answer = abort_server(spec, state.server) if now else drain_server(spec, state.server, reporter)
            reporter.phase(f"vllm serve: stopped {len(answer.stopped)} process(es)")
        except ClusterFailure as exc:
            if not spec.containers:
                raise
            reporter.warn(f"{exc}; removing the containers ends it")
        state.server = None
        save_state(spec.state_dir, state)
    return lifecycle.cluster_down_locked(spec, reporter, state, remove)
