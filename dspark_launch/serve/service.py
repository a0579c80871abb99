"""The whole service: cluster up, `vllm serve` through the head's agent, health; stop; status.

Each command loads the deployment record once under the state lock and passes it
down; the plan is built once. The state lock is held for the whole start, so a
second launcher fails at once naming the holder.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass, field

from dspark_launch.cluster import lifecycle
from dspark_launch.cluster import ray_cluster as rc
from dspark_launch.cluster.parallel import Background, on_each, settle
from dspark_launch.cluster.client import ClusterFailure, NodeAgent, Reporter
from dspark_launch.cluster.protocol import HotfixReport, MemoryAnswer, Spawn, Stop, StopAnswer
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import Deployment, ServerRecord, load_state, save_state
from dspark_launch.config.settings import Settings
from dspark_launch.errors import DsparkError
from dspark_launch.model.onnodes import ModelWeights, ServingModel
from dspark_launch.serve import http, logscan, readiness
from dspark_launch.serve.argcheck import check_serve_args
from dspark_launch.serve.logfollow import LogReader
from dspark_launch.serve.plan import ServePlan, api_key, serve_plan
from dspark_launch.serve.restart_kind import RestartKind

SERVER_LOG = "vllm-serve.log"


class ServeFailure(DsparkError):
    """vllm serve did not come up; `extra` holds the log tails to print."""

    def __init__(self, message: str, extra: list[str] | None = None):
        super().__init__(message)
        self.extra = extra or []


@dataclass
class StartResult:
    plan: ServePlan
    server: ServerRecord
    cluster_started: bool
    hotfix: dict[str, HotfixReport] = field(default_factory=dict)
    first_answer: readiness.FirstAnswer | None = None  # readiness's one-token request that answered


def resolved_plan(settings: Settings, spec: ClusterSpec, reporter: Reporter, ray_env: dict[str, str]) -> ServePlan:
    """The profile resolved against the head's installed vLLM (through its agent), the head's own fabric
    environment beside it; the serve plan built once from both. ConfigError (exit 2) for a flag it lacks."""
    from dspark_launch.cluster.node_checks import node_gpus
    from dspark_launch.profiles.resolve import resolve_selected

    reporter.phase(f"resolving profile {settings['DSPARK_PROFILE']} against the vLLM on {spec.head.label} "
                   f"and every node's GPU")
    head_fabric = Background(lambda: rc.node_fabric(spec, spec.head))
    gpus = Background(lambda: node_gpus(spec, reporter))
    resolved = resolve_selected(spec.head.agent(reporter).describe_vllm(), settings, gpus.result())
    plan = serve_plan(settings, spec, ray_env, resolved, head_fabric.result())
    reporter.phase(f"profile {plan.profile} on vLLM {resolved.vllm_version}: {len(plan.decisions)} decision(s)")
    for decision in plan.decisions:
        reporter.phase(f"  {decision.line}")
    return plan


def node_memory(spec: ClusterSpec) -> dict[str, MemoryAnswer]:
    """Every node's memory (MemTotal, MemAvailable, GPU or not) by its label, asked at once (read-only)."""
    return {spec.node(name).label: answer
            for name, answer in on_each(spec.nodes, lambda n: n.agent().meminfo()).items()}


def preflight_memory(spec: ClusterSpec, plan: ServePlan, weights: ModelWeights, memory: dict[str, MemoryAnswer],
                     reporter: Reporter, force: bool) -> None:
    """Weights ÷ TP + overhead + KV at MAX_MODEL_LEN against every node's `memory` (node_memory), and each node's
    free memory against vLLM's start-up gate, before anything starts: unified memory that runs out freezes the
    host, and a node below the gate fails vLLM's start. Refused unless `force`. `weights`: what the weights
    pre-flight just verified on every node."""
    from dspark_launch.serve.memory import estimate, kv_size_fixed

    found = estimate(plan.profile, weights, plan.kv_cache_dtype, plan.max_model_len,
                     plan.tensor_parallel_size, plan.gpu_memory_utilization, memory,
                     kv_size_fixed(plan.serve_args, plan.full_env()))
    for finding in found.findings:
        reporter.phase(f"memory pre-flight: {finding.line}")
        if finding.free_line:
            reporter.phase(f"memory pre-flight: {finding.free_line}")
    bad = [f for f in found.findings if not f.fits]
    if bad and not force:
        raise ServeFailure(f"memory pre-flight: {bad[0].problem}; unified memory that runs out freezes the "
                           f"host: {bad[0].fix}, or pass --force",
                           [f"memory pre-flight: {f.problem}; {f.fix}" for f in bad[1:]]
                           + [f"memory pre-flight: {note}" for note in found.notes])
    for finding in bad:
        reporter.warn(f"memory pre-flight: {finding.problem} (--force: starting anyway)")


def check_arguments(settings: Settings, spec: ClusterSpec, plan: ServePlan, reporter: Reporter) -> None:
    """vLLM's own parser on the head (about 10 s: it runs while Ray starts); once it accepted them,
    vLLM's list of per-node variables in the server's config folder (vLLM reads it at import)."""
    reporter.phase("checking the vllm serve arguments with the installed vLLM")
    head = spec.head.agent(reporter)
    check_serve_args(head, plan.serve_args, settings.entries["VLLM_EXTRA_ARGS"].source)
    reporter.phase("vllm serve arguments accepted by the installed vLLM")
    head.non_carry_over(plan.config_root)


def server_alive(spec: ClusterSpec, server: ServerRecord) -> bool:
    process = server.process
    return process is not None and all(spec.head.agent().alive((process,), "server status"))


def _server_healthy(url: str, key: str, served_name: str, timeout: float) -> bool:
    return (http.request(f"{url}/health", key, timeout=timeout).status == 200
            and served_name in http.served_models(url, key, timeout))


def start(settings: Settings, spec: ClusterSpec, reporter: Reporter, force: bool = False,
          verify: bool = False) -> StartResult:
    """Ray on every node and the serve-argument check at once, then `vllm serve` on the head; one record saved."""
    with lifecycle.locked_deployment(spec.state_dir) as state:
        if state and state.server and _serving(spec, state.server, api_key(settings), settings.int("HEALTH_TIMEOUT_S")):
            raise lifecycle.AlreadyRunning(f"already running and healthy at {state.server.url}; "
                                           "`dspark status` shows it")
        if spec.containers:
            return _start_in_containers(settings, spec, reporter, force, verify, state)
        spec, plan, weights, memory = _checked_plan(settings, spec, reporter, verify)
        if state and state.server:
            stop_server(spec, state.server)
            state.server = None
            save_state(spec.state_dir, state)
        preflight_memory(spec, plan, weights, memory, reporter, force)
        checked = Background(lambda: check_arguments(settings, spec, plan, reporter))
        cluster_started = True
        try:
            state = lifecycle.cluster_up_locked(spec, reporter, state).state
            save_state(spec.state_dir, state)
        except lifecycle.AlreadyRunning:
            cluster_started = False
            reporter.phase("the Ray cluster is already up; reusing it")
        try:
            checked.result()
            server, answer = launch(spec, plan, state, reporter)
        except BaseException:
            if cluster_started:
                lifecycle.cluster_down_locked(spec, reporter, load_state(spec.state_dir))
            raise
        return StartResult(plan, server, cluster_started, state.hotfix, answer)


def _alive_or_container_gone(spec: ClusterSpec, server: ServerRecord) -> bool:
    try:
        return server_alive(spec, server)
    except ClusterFailure:
        if not spec.containers:
            raise
        return False  # the head's container is gone, and the server with it


def _serving(spec: ClusterSpec, server: ServerRecord, client_key: str, timeout: float) -> bool:
    return _alive_or_container_gone(spec, server) and _server_healthy(server.url, client_key, server.served_name, timeout)


def _start_in_containers(settings: Settings, spec: ClusterSpec, reporter: Reporter, force: bool, verify: bool,
                         previous: Deployment | None) -> StartResult:
    """Every node's container made ready first (the agent runs in it: reused when unchanged), then as on hosts;
    a failure removes them."""
    from dspark_launch.model.onnodes import require_mounted

    require_mounted(settings, spec)
    image_id = lifecycle.prepare_containers(spec, reporter, previous)
    try:
        spec, plan, weights, memory = _checked_plan(settings, spec, reporter, verify)
        preflight_memory(spec, plan, weights, memory, reporter, force)
        checked = Background(lambda: check_arguments(settings, spec, plan, reporter))
        state = lifecycle.cluster_up_locked(spec, reporter, None, image_id).state
        save_state(spec.state_dir, state)
        checked.result()
        server, answer = launch(spec, plan, state, reporter)
    except BaseException:
        lifecycle.cluster_down_locked(spec, reporter, None, remove=True)
        raise
    return StartResult(plan, server, True, state.hotfix, answer)


def _checked_plan(settings: Settings, spec: ClusterSpec, reporter: Reporter,
                  verify: bool) -> tuple[ClusterSpec, ServePlan, ModelWeights, dict[str, MemoryAnswer]]:
    """The weights checked on every node, then the plan resolved against the head's vLLM (under the lock:
    a first start writes the Ray token); the verified weights and every node's memory (asked meanwhile)
    for the memory pre-flight."""
    memory = Background(lambda: node_memory(spec))
    try:
        spec, serving = model_preflight(settings, spec, reporter, verify)
        plan = with_model(resolved_plan(settings, spec, reporter, rc.auth_env(spec, create=True)), serving)
    except BaseException as exc:
        settle(memory, exc)
        raise
    return spec, plan, serving.weights, memory.result()


# --- serve-only restarts (issue 24) --------------------------------------------------------------

def restart_kind_of(settings: Settings, spec: ClusterSpec, state: Deployment | None) -> RestartKind:
    """Serve-only when the recorded server's settings differ from `settings` only in serve-level ones,
    this launcher version made the record, and every node's Ray is alive; else full (with why)."""
    from dspark_launch import __version__
    from dspark_launch.serve.restart_kind import restart_kind

    if state is not None and state.launcher_version != __version__:
        return RestartKind(False, f"the record is of dspark-launch {state.launcher_version}, this is {__version__}")
    running = state.server.running_settings if state and state.server else None
    return restart_kind(running, settings.public_values(), running is not None and _ray_up(spec, state))


def _ray_up(spec: ClusterSpec, state: Deployment | None) -> bool:
    """Every node's recorded Ray daemons alive, and Ray itself (the GCS) lists every node alive: after a
    cut link the daemons can live on while Ray has declared the node dead."""
    ray_view = Background(lambda: rc.ray_view(spec, lifecycle.RAY_VIEW_TIMEOUT_S))  # asked while the nodes are
    healthy = all(h == "alive" for h in lifecycle.node_health(spec, state).values())
    try:
        seen = {node.ip for node in ray_view.result() if node.alive}
    except ClusterFailure:
        return False
    return healthy and all(node.ip in seen for node in spec.nodes)


def restart_serve(settings: Settings, spec: ClusterSpec, reporter: Reporter, force: bool = False,
                  verify: bool = False, now: bool = False, marker: str = "") -> StartResult:
    """Only `vllm serve` restarted, Ray (and the containers) kept, after `restart_kind_of` found it enough
    for the server with `marker`: the new plan is resolved and its arguments checked while the old server
    still serves, then the old one drains (unless `now`) and the new one starts. A failure leaves Ray up
    and no server (`dspark start` serves again)."""
    with lifecycle.locked_deployment(spec.state_dir) as state:
        if state is None or state.server is None or state.server.marker != marker:
            raise DsparkError("the deployment changed meanwhile (another dspark command); run `dspark restart` again")
        spec, plan, weights, memory = _checked_plan(settings, spec, reporter, verify)
        preflight_memory(spec, plan, weights, memory, reporter, force)
        check_arguments(settings, spec, plan, reporter)
        answer = abort_server(spec, state.server) if now else drain_server(spec, state.server, reporter)
        reporter.phase(f"vllm serve: stopped {len(answer.stopped)} process(es); Ray kept up on every node")
        state.server = None
        state.config_digest = spec.config_digest  # the settings this deployment now runs with
        save_state(spec.state_dir, state)
        server, answer = launch(spec, plan, state, reporter)
        return StartResult(plan, server, False, state.hotfix, answer)


# --- model weights (issue 12) ---------------------------------------------------------------------

def model_preflight(settings: Settings, spec: ClusterSpec, reporter: Reporter,
                    full: bool) -> tuple[ClusterSpec, ServingModel]:
    """The weights on every node (fast check, or sha256 with `full`) before anything starts; the
    spec whose node environment keeps the hub offline for every Ray worker."""
    from dspark_launch.model.onnodes import ready_to_serve, wanted_model

    reporter.phase("checking the model weights on every node" + (" (full sha256)" if full else ""))
    serving = ready_to_serve(wanted_model(settings), spec, full, reporter)
    reporter.phase(f"model weights ready on {len(serving.reports)} node(s) "
                   f"({serving.manifest.total_size / (1 << 30):.2f} GiB, checked in {serving.seconds:.2f} s)")
    node_env = tuple((k, v) for k, v in spec.node_env if k not in dict(serving.env)) + serving.env
    return dataclasses.replace(spec, node_env=node_env), serving


def with_model(plan: ServePlan, serving: ServingModel) -> ServePlan:
    """`vllm serve` on the verified copy: the pulled commit as --revision, the hub offline."""
    args = list(plan.serve_args)
    if serving.revision:
        if "--revision" in args:
            index = args.index("--revision")
            del args[index:index + 2]
        args += ["--revision", serving.revision]
    env = {**dict(plan.env), **dict(serving.env)}
    return dataclasses.replace(plan, serve_args=tuple(args), env=tuple(sorted(env.items())))


def launch(spec: ClusterSpec, plan: ServePlan, state: Deployment,
           reporter: Reporter) -> tuple[ServerRecord, readiness.FirstAnswer]:
    """`vllm serve` on the head (through its agent), recorded at once, then waited for."""
    log = str(spec.state_dir / "logs" / SERVER_LOG)
    head = spec.head.agent(reporter)
    marker = f"dspark-{secrets.token_hex(4)}-server"
    reporter.phase(f"launching vllm serve on {spec.head.label}: {plan.model} as {plan.served_name}")
    server = ServerRecord(marker=marker, log=log, url=plan.base_url, served_name=plan.served_name, model=plan.model,
                          started_at=time.time(), settings=dict(plan.settings), digest=plan.settings_digest,
                          cap=plan.cap, profile=plan.profile, decisions=[d.line for d in plan.decisions],
                          chat=plan.chat, drain_s=plan.drain_timeout_s, control_file=plan.control_file)
    if plan.control_file:  # a new scheduler starts from the plan's values, never a past reload's
        head.scheduler_control(plan.control_file, remove=True)
    try:
        # Inside the try: an interrupt while the agent spawns still stops the server (found by its marker).
        answer = head.spawn(Spawn(tuple(plan.argv), plan.full_env(), marker, log, rotate_log=True), "vllm serve")
        server.pid, server.start_time, server.boot_id = answer.process.pid, answer.process.start_time, answer.process.boot_id
        server.sessions = [answer.session]
        state.server = server
        save_state(spec.state_dir, state)
        ready = wait_until_serving(spec, plan, server, head, reporter)
    except BaseException:
        stop_server(spec, server)
        state.server = None
        save_state(spec.state_dir, state)
        raise
    server.kv_cache_tokens = logscan.kv_cache_tokens(ready.log)
    server.scheduler_cap = logscan.hotfix_cap(ready.log)
    save_state(spec.state_dir, state)
    return server, ready.first_answer


@dataclass(frozen=True)
class Ready:
    log: str  # the server log when it was found ready
    first_answer: readiness.FirstAnswer


def wait_until_serving(spec: ClusterSpec, plan: ServePlan, server: ServerRecord, head: NodeAgent,
                       reporter: Reporter, backoff: readiness.Backoff | None = None) -> Ready:
    """/health, then /v1/models listing the served name, then a one-token (chat) completion, retried while it
    gets no answer; all within START_TIMEOUT_S of launch, a server that exits meanwhile a failure at once."""
    log = LogReader(head, server.log)
    start = time.monotonic()

    def exited() -> ServeFailure:
        final = log.refresh()  # read again: the last lines were written as it died
        return ServeFailure(f"vllm serve exited during start (phase: {logscan.phase(final)}): "
                            f"{logscan.failure(final)}; log {server.log}", tails(spec, server, state=None))

    while True:
        elapsed = time.monotonic() - start
        text = log.refresh()
        if not server_alive(spec, server):
            raise exited()
        if _server_healthy(plan.base_url, plan.client_key, plan.served_name, plan.health_timeout_s):
            break
        if elapsed > plan.start_timeout_s:
            raise ServeFailure(f"vllm serve not ready after {plan.start_timeout_s} s (phase: {logscan.phase(text)}); "
                               f"log {server.log}", tails(spec, server, state=None))
        reporter.waiting(f"vllm serve: {logscan.phase(text)}", elapsed, plan.start_timeout_s)
        time.sleep(0.5)
    kind = "chat completion" if plan.chat else "completion"
    reporter.phase(f"sending a one-token {kind}")
    ask = http.chat if plan.chat else http.complete
    answer = readiness.first_answer(
        lambda timeout: ask(plan.base_url, plan.client_key, plan.served_name, "Hello", 1, timeout),
        lambda: server_alive(spec, server), f"the one-token {kind}", start, plan.start_timeout_s, reporter,
        backoff or readiness.Backoff(first_timeout_s=max(30, plan.health_timeout_s)))
    if answer.outcome == readiness.DIED:
        raise exited()
    if answer.outcome == readiness.REFUSED:
        raise ServeFailure(f"the one-token {kind} failed: HTTP {answer.reply.status} {answer.reply.body[:200]}",
                           tails(spec, server, state=None))
    if answer.outcome == readiness.NO_ANSWER:
        last = f"HTTP {answer.reply.status}" if answer.reply.status else "no answer"
        raise ServeFailure(f"vllm serve not ready after {plan.start_timeout_s} s: the API is up but the one-token "
                           f"{kind} got no answer in {answer.attempts} attempt(s) (the last: {last} after "
                           f"{answer.latency_s:.0f} s); log {server.log}", tails(spec, server, state=None))
    reporter.phase(f"the one-token {kind} answered in {answer.latency_s:.1f} s (attempt {answer.attempts})")
    text = log.refresh()
    cap = logscan.hotfix_cap(text)
    if cap != plan.cap:
        raise ServeFailure(f"the EngineCore's scheduler reported cap {cap}, expected {plan.cap}: "
                           "the hotfix is not active in the served vLLM; refusing to serve",
                           tails(spec, server, state=None))
    return Ready(text, answer)


def tails(spec: ClusterSpec, server: ServerRecord | None, state: Deployment | None, lines: int = 30) -> list[str]:
    """The end of the server log and of each node's Ray logs, for a failure report."""
    out: list[str] = []
    if server:
        out += spec.head.agent().tail([server.log], lines)
    state = state or load_state(spec.state_dir)
    for node in spec.nodes:
        record = state.node(node.name) if state else None
        if record is None:
            continue
        try:
            out += node.agent().tail(rc.ray_log_paths(node, record), 10)
        except ClusterFailure as exc:
            out.append(f"({exc})")
    return out


def stop_server(spec: ClusterSpec, server: ServerRecord, grace_s: float = 15.0, drain_s: float = 0.0) -> StopAnswer:
    process = server.process
    return spec.head.agent().stop(Stop(server.marker, (process,) if process else (), tuple(server.sessions), grace_s,
                                       drain_s), "stop server")


# After vLLM's own drain timeout: its API server's teardown (Ray executor, sockets) before the usual stop.
DRAIN_TEARDOWN_S = 30.0
DRAIN_PROBE_S = 2.0


def drain_server(spec: ClusterSpec, server: ServerRecord, reporter: Reporter) -> StopAnswer:
    """`stop_server`, letting in-flight requests finish first when the server was started with a drain
    timeout (vLLM's --shutdown-timeout); says how many finished and how many were cut."""
    from dspark_launch.serve.drain import drained_stop
    from dspark_launch.serve.logfollow import END

    if server.drain_s <= 0:
        return stop_server(spec, server)
    reporter.phase(f"vllm serve: draining in-flight requests (up to {server.drain_s} s; new ones are refused; "
                   "`dspark stop --now` aborts them)")
    log = LogReader(spec.head.agent(), server.log)
    log.offset = spec.head.agent().read(server.log, END).offset
    answer, report = drained_stop(lambda: stop_server(spec, server, drain_s=server.drain_s + DRAIN_TEARDOWN_S),
                                  server.url, server.drain_s, DRAIN_PROBE_S, log.new_text)
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


def stop_run(spec: ClusterSpec, reporter: Reporter, marker: str) -> bool:
    """Stop everything, but only while the record still holds the run whose server has `marker` (a
    supervisor's own run); False, and nothing touched, when an operator's command replaced it."""
    with lifecycle.locked_deployment(spec.state_dir) as state:
        if state is None or state.server is None or state.server.marker != marker:
            return False
        stop_locked(spec, reporter, state)
        return True


def stop_locked(spec: ClusterSpec, reporter: Reporter, state: Deployment | None, now: bool = False,
                remove: bool = False) -> list[str]:
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


@dataclass(frozen=True)
class Drift:
    name: str
    running: str | None
    configured: str


@dataclass(frozen=True)
class ServerView:
    state: str  # down | up | unhealthy | dead
    pid: int | None = None
    url: str | None = None
    model: str | None = None
    served_name: str | None = None
    uptime_s: int | None = None
    healthy: bool = False
    cap: int | None = None  # the cap the EngineCore's scheduler reported
    kv_cache_tokens: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    drift: tuple[Drift, ...] = ()
    profile: str = ""
    decisions: tuple[str, ...] = ()  # the profile's decision lines at start
    live: dict[str, str] = field(default_factory=dict)  # live settings `dspark reload` changed since the start
    live_since: float | None = None  # when they were in force


@dataclass(frozen=True)
class ServiceStatus:
    """`dspark status`: the cluster view plus the server (JSON shape in docs/cluster.md)."""
    state: str
    ray_address: str
    config_digest: str | None
    started_at: float | None
    checked_at: float
    problems: tuple[str, ...]
    nodes: tuple[lifecycle.NodeView, ...]
    server: ServerView
    fabric_warnings: tuple[str, ...] = ()  # per node at start, e.g. NCCL falls back to TCP
    warnings: tuple[str, ...] = ()  # about the settings now, e.g. an image named by a tag


def drift(started_with: dict[str, str], now: dict[str, str]) -> tuple[Drift, ...]:
    """Settings that differ between the running server and the env file now."""
    return tuple(Drift(name, started_with.get(name), value) for name, value in now.items()
                 if started_with.get(name) != value)


def _server_view(settings: Settings, spec: ClusterSpec, server: ServerRecord | None) -> ServerView:

    if server is None:
        return ServerView("down")
    probe = settings.int("HEALTH_TIMEOUT_S")
    alive = _alive_or_container_gone(spec, server)
    healthy = alive and _server_healthy(server.url, api_key(settings), server.served_name, probe)
    return ServerView(
        state="up" if healthy else ("unhealthy" if alive else "dead"), pid=server.pid, url=server.url,
        model=server.model, served_name=server.served_name,
        uptime_s=round(time.time() - server.started_at) if alive else None, healthy=healthy,
        cap=server.scheduler_cap if server.scheduler_cap is not None else server.cap,
        kv_cache_tokens=server.kv_cache_tokens, metrics=http.metrics(server.url, probe) if healthy else {},
        drift=drift(server.running_settings, settings.public_values()), profile=server.profile,
        decisions=tuple(server.decisions), live=dict(server.live), live_since=server.live_since)


def _server_log(spec: ClusterSpec, server: ServerRecord) -> str:
    try:
        return LogReader(spec.head.agent(), server.log).refresh()
    except ClusterFailure:
        if not spec.containers:
            raise
        return ""  # the head's container is gone: its problem line says so


def status(settings: Settings, spec: ClusterSpec) -> ServiceStatus:
    """The record is read once, without the lock; the cluster and the server are asked at once."""
    state = load_state(spec.state_dir)
    server = state.server if state else None
    cluster = Background(lambda: lifecycle.cluster_status(spec, state))
    view = _server_view(settings, spec, server)
    data = cluster.result()
    problems = list(data.problems)
    if server and view.state == "dead":
        text = _server_log(spec, server)
        problems.append(f"vllm serve (pid {server.pid}) is not running: {logscan.failure(text)}; "
                        f"log {server.log}; `dspark restart` starts it again")
    elif server and view.state == "unhealthy":
        problems.append(f"vllm serve (pid {server.pid}) runs but {server.url}/health does not answer "
                        f"within {settings.int('HEALTH_TIMEOUT_S')} s; log {server.log}")
    overall = "degraded" if server and data.state == "up" and view.state != "up" else data.state
    return ServiceStatus(overall, data.ray_address, data.config_digest, data.started_at, data.checked_at,
                         tuple(problems), data.nodes, view,
                         tuple(w for record in (state.nodes if state else ()) for w in record.fabric_warnings),
                         image_warnings(settings))


def image_warnings(settings: Settings) -> tuple[str, ...]:
    """`plan` and `status`: the container image should be pinned by digest."""
    from dspark_launch.config.container_args import unpinned_image_warning

    entry = settings.entries["DSPARK_IMAGE"]
    line = unpinned_image_warning(settings["DSPARK_RUNTIME"], entry.value, entry.source)
    return (line,) if line else ()
