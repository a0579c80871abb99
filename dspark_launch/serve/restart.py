"""`dspark restart`, serve-only: `vllm serve` replaced while Ray (and the containers) stay up."""

from __future__ import annotations

from dspark_launch.cluster import lifecycle
from dspark_launch.cluster import ray_cluster as rc
from dspark_launch.cluster.parallel import Background
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import Deployment, save_state
from dspark_launch.config.secret_digest import compared_values
from dspark_launch.config.settings import Settings
from dspark_launch.errors import ClusterFailure, DsparkError
from dspark_launch.report import Reporter
from dspark_launch.serve.restart_kind import RestartKind
from dspark_launch.serve.start import StartResult, checked_serve_spec, launch, preflight_memory
from dspark_launch.serve.stop import abort_server, drain_server
from dspark_launch.serve.warm_start import GO_MARGIN_S, cancel_warm, start_warm


def restart_kind_of(settings: Settings, spec: ClusterSpec, state: Deployment | None) -> RestartKind:
    """Serve-only when the recorded server's settings differ from `settings` only in serve-level ones,
    this launcher version made the record, and every node's Ray is alive; else full (with why)."""
    from dspark_launch import __version__
    from dspark_launch.serve.restart_kind import restart_kind

    if state is not None and state.launcher_version != __version__:
        return RestartKind(False, f"the record is of dspark-launch {state.launcher_version}, this is {__version__}")
    running = state.server.running_settings if state and state.server else None
    now = compared_values(settings, state.server.secrets if state and state.server else {})
    return restart_kind(running, now, running is not None and _ray_up(spec, state))


def _ray_up(spec: ClusterSpec, state: Deployment | None) -> bool:
    """Every node's recorded Ray daemons alive, and Ray itself (the GCS) lists every node alive: after a
    cut link the daemons can live on while Ray has declared the node dead."""
    ray_view = Background(
        lambda: rc.ray_view(spec, state.node(spec.head.name) if state else None, lifecycle.RAY_VIEW_TIMEOUT_S)
    )  # asked while the nodes are
    healthy = all(h == "alive" for h in lifecycle.node_health(spec, state).values())
    try:
        seen = {node.ip for node in ray_view.result() if node.alive}
    except ClusterFailure:
        return False
    return healthy and all(node.ip in seen for node in spec.nodes)


def restart_serve(
    settings: Settings,
    spec: ClusterSpec,
    reporter: Reporter,
    force: bool = False,
    verify: bool = False,
    now: bool = False,
    marker: str = "",
) -> StartResult:
    """Only `vllm serve` restarted, Ray (and the containers) kept, after `restart_kind_of` found it enough
    for the server with `marker`: the new serve spec is resolved and the new server started warm (vLLM
    imported, its arguments checked: serve/warm_start.py) while the old server still serves, then the old one
    drains (unless `now`) and the new one serves. A failure leaves Ray up
    and no server (`dspark start` serves again)."""
    with lifecycle.locked_deployment(spec.state_dir) as state:
        if state is None or state.server is None or state.server.marker != marker:
            raise DsparkError("the deployment changed meanwhile (another dspark command); run `dspark restart` again")
        spec, serve_spec, weights, memory = checked_serve_spec(settings, spec, reporter, verify)
        preflight_memory(spec, serve_spec, weights, memory, reporter, force)
        warm = start_warm(
            spec,
            serve_spec,
            settings.source_of("vllm_extra_args"),
            reporter,
            "the old server still serves",
            serve_spec.drain_timeout_s + GO_MARGIN_S,
        )
        try:
            stopped = abort_server(spec, state.server) if now else drain_server(spec, state.server, reporter)
            reporter.phase(f"vllm serve: stopped {len(stopped.stopped)} process(es); Ray kept up on every node")
            state.server = None
            state.config_digest = spec.config_digest  # the settings this deployment now runs with
            save_state(spec.state_dir, state)
            server, answer = launch(spec, serve_spec, state, reporter, warm)
        except BaseException as error:
            cancel_warm(spec, warm)  # already stopped when it was launched; never left waiting
            if isinstance(error, DsparkError) and state.server is None:
                error.stopped = ("the running vllm serve, then the new one; Ray kept up",)
            raise
        return StartResult(serve_spec, server, False, state.hotfix, answer)
