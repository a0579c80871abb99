"""`dspark start`: the weights checked, Ray up on every node, `vllm serve` launched on the head, health.

One sequence for both runtimes (a venv on each host, or one container per node):
`start_locked` takes the runtime's own steps from a `HostRuntime` or `ContainerRuntime`.
The deployment record is loaded once under the state lock, held for the whole start (a
second launcher fails at once naming the holder); the serve spec is built once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field

from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.protocol import MemoryAnswer, MemoryQuery, PortHolderAnswer, SchedulerControl
from dspark_launch.cluster import lifecycle
from dspark_launch.cluster import ray_cluster as rc
from dspark_launch.cluster.parallel import Background, on_each, settle
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import (
    Deployment,
    HotfixRecord,
    ServerRecord,
    SessionRecord,
    load_state,
    recorded,
    save_state,
)
from dspark_launch.config.settings import Settings
from dspark_launch.errors import DsparkError
from dspark_launch.model.onnodes import ModelWeights, ServingModel, pulled_config
from dspark_launch.report import Reporter, report_measured
from dspark_launch.serve import http, logscan, readiness
from dspark_launch.serve.api_holder import api_holder, foreign_line, healthy, keyed
from dspark_launch.serve.logfollow import LogReader
from dspark_launch.serve.running_server import SERVER_LOG, ServeFailure, server_alive, serving, tails
from dspark_launch.serve.serve_spec import ServeSpec, api_key, build_serve_spec
from dspark_launch.serve.stop import stop_server
from dspark_launch.serve.warm_start import GO_MARGIN_S, WarmServer, cancel_warm, new_marker, start_warm, tell_to_serve


@dataclass
class StartResult:
    serve_spec: ServeSpec
    server: ServerRecord
    cluster_started: bool
    hotfix: dict[str, HotfixRecord] = field(default_factory=dict)
    first_answer: readiness.FirstAnswer | None = None  # readiness's one-token request that answered


def resolved_serve_spec(
    settings: Settings, spec: ClusterSpec, reporter: Reporter, ray_env: dict[str, str], model: ServingModel
) -> ServeSpec:
    """The profile resolved against the head's installed vLLM (through its agent), the head's own fabric
    environment beside it; the serve spec built once from both, on the verified copy of the weights (`model`:
    its commit as --revision, the hub offline). ConfigError (exit 2) for a flag it lacks."""
    from dspark_launch.cluster.hotfix_rollout import node_gpus
    from dspark_launch.config.profile_resolve import resolve_selected

    reporter.phase(
        f"resolving profile {settings.dspark_profile} against the vLLM on {spec.head.label} and every node's GPU"
    )
    head_fabric = Background(lambda: rc.node_fabric(spec, spec.head))
    gpus = Background(lambda: node_gpus(spec, reporter))
    offer = spec.head.agent(reporter).describe_vllm(pulled_config(model.location.folder))
    resolved = resolve_selected(offer, settings, gpus.result(), revision=model.revision)
    if resolved.unjudged:  # as `dspark plan` refuses: never a flag the dry boot could not judge
        raise DsparkError(resolved.unjudged[0])
    serve_spec = build_serve_spec(settings, spec, ray_env, resolved, head_fabric.result(), model.env)
    reporter.phase(
        f"profile {serve_spec.profile} on vLLM {resolved.vllm_version}: {len(serve_spec.decisions)} decision(s)"
    )
    for decision in serve_spec.decisions:
        reporter.phase(f"  {decision.line}")
    return serve_spec


def node_memory(spec: ClusterSpec) -> dict[str, MemoryAnswer]:
    """Every node's memory (MemTotal, MemAvailable, GPU or not) by its label, asked at once (read-only)."""
    return {
        spec.node(name).label: answer
        for name, answer in on_each(spec.nodes, lambda n: n.agent().call(MemoryQuery())).items()
    }


def preflight_memory(
    spec: ClusterSpec,
    serve_spec: ServeSpec,
    weights: ModelWeights,
    memory: dict[str, MemoryAnswer],
    reporter: Reporter,
    force: bool,
) -> None:
    """Weights ÷ TP + overhead + KV at MAX_MODEL_LEN against every node's `memory` (node_memory), and each node's
    free memory against the installed vLLM release's rule (0.32/0.33's start-up gate, 0.34's KV cache sized after
    warmup), before anything starts: unified memory that runs out freezes the host, and a node that fails the
    rule fails vLLM's start. Refused unless `force`. `weights`: what the weights pre-flight just verified on every
    node."""
    from dspark_launch.serve.memory_preflight import estimate, kv_size_fixed

    found = estimate(
        serve_spec.profile,
        weights,
        serve_spec.kv_cache_dtype,
        serve_spec.max_model_len,
        serve_spec.tensor_parallel_size,
        serve_spec.gpu_memory_utilization,
        memory,
        kv_size_fixed(serve_spec.serve_args, serve_spec.full_env()),
        serve_spec.vllm_version,
        serve_spec.serve_args,
    )
    for finding in found.findings:
        reporter.phase(f"memory pre-flight: {finding.line}")
        if finding.free_line:
            reporter.phase(f"memory pre-flight: {finding.free_line}")
    bad = [f for f in found.findings if not f.fits]
    if bad and not force:
        raise ServeFailure(
            f"memory pre-flight: {bad[0].problem}; unified memory that runs out freezes the "
            f"host: {bad[0].fix}, or pass --force",
            [f"memory pre-flight: {f.problem}; {f.fix}" for f in bad[1:]]
            + [f"memory pre-flight: {note}" for note in found.notes],
        )
    for finding in bad:
        reporter.warn(f"memory pre-flight: {finding.problem} (--force: starting anyway)")


def start(
    settings: Settings, spec: ClusterSpec, reporter: Reporter, force: bool = False, verify: bool = False
) -> StartResult:
    """Ray on every node and `vllm serve` started warm on the head at once (it imports vLLM and checks its
    arguments meanwhile), then told to serve; one record saved."""
    with lifecycle.locked_deployment(spec.state_dir) as state:
        if state and state.server and serving(spec, state.server, api_key(settings), settings.health_timeout_s):
            raise lifecycle.AlreadyRunning(
                f"already running and healthy at {state.server.url}; `dspark status` shows it"
            )
        runtime = ContainerRuntime() if spec.containers else HostRuntime()
        return start_locked(settings, spec, reporter, force, verify, state, runtime)


def start_locked(
    settings: Settings,
    spec: ClusterSpec,
    reporter: Reporter,
    force: bool,
    verify: bool,
    previous: Deployment | None,
    runtime: HostRuntime | ContainerRuntime,
) -> StartResult:
    """The start sequence, for a caller that holds the lock; `runtime` adds its own steps. A failure undoes
    what `runtime` says this run brought up."""
    from dspark_launch.cluster import platform_check

    runtime.prepare(settings, spec, reporter, previous)
    launching = False
    try:
        platform = Background(lambda: platform_check.node_platforms(spec))  # asked beside the weights and the profile
        try:
            spec, serve_spec, weights, memory = checked_serve_spec(settings, spec, reporter, verify)
        except BaseException as exc:
            settle(platform, exc)
            raise
        facts = platform.result()
        platform_check.preflight(spec, facts, reporter)  # a refusal: exit 2, before anything is stopped or started
        runtime.clear_server(spec, previous)
        preflight_memory(spec, serve_spec, weights, memory, reporter, force)
        # The server's interpreter starts beside Ray: it cannot serve before go (after the hotfix is verified on
        # every node), and nothing it imports before go loads vLLM's scheduler module (the hotfix's file).
        marker = new_marker()
        warm = Background(
            lambda: start_warm(
                spec,
                serve_spec,
                settings.source_of("vllm_extra_args"),
                reporter,
                "Ray starts",
                serve_spec.start_timeout_s + GO_MARGIN_S,
                marker,
            )
        )
        try:
            state = runtime.cluster_up(spec, reporter, previous)
            state.platform = platform_check.recorded(facts)  # what `status` compares the nodes with later
            save_state(spec.state_dir, state)
            ready = warm.result()
        except BaseException as exc:
            settle(warm, exc)
            with contextlib.suppress(Exception):  # a head we cannot reach has no server of this run to stop
                cancel_warm(spec, None, marker)
            raise
        launching = True
        server, answer = launch(spec, serve_spec, state, reporter, ready)
    except BaseException as exc:
        stopped = runtime.roll_back(spec, reporter)
        if isinstance(exc, DsparkError):
            exc.stopped = (*(("vllm serve",) if launching else ()), *stopped)
        raise
    return StartResult(serve_spec, server, runtime.cluster_started, state.hotfix, answer)


class HostRuntime:
    """Ray and `vllm serve` in each host's Python: a Ray cluster already up is reused (and left up when the
    start fails); a recorded server that is not healthy is stopped first."""

    def __init__(self) -> None:
        self.cluster_started = False

    def prepare(self, settings: Settings, spec: ClusterSpec, reporter: Reporter, previous: Deployment | None) -> None:
        pass

    def clear_server(self, spec: ClusterSpec, previous: Deployment | None) -> None:
        if previous and previous.server:
            stop_server(spec, previous.server)
            previous.server = None
            save_state(spec.state_dir, previous)

    def cluster_up(self, spec: ClusterSpec, reporter: Reporter, previous: Deployment | None) -> Deployment:
        try:
            state = lifecycle.cluster_up_locked(spec, reporter, previous).state
        except lifecycle.AlreadyRunning:
            reporter.phase("the Ray cluster is already up; reusing it")
            return previous  # type: ignore[return-value]  # AlreadyRunning: a record with every node up
        self.cluster_started = True
        return state

    def roll_back(self, spec: ClusterSpec, reporter: Reporter) -> tuple[str, ...]:
        """What it stopped, for the failure's report."""
        if not self.cluster_started:
            return ()
        lifecycle.cluster_down_locked(spec, reporter, load_state(spec.state_dir))
        return ("Ray on every node",)


class ContainerRuntime:
    """Every node's container made ready first (the agent runs in it: reused when unchanged), Ray started in
    them; a failure removes them."""

    cluster_started = True

    def __init__(self) -> None:
        self.image_id = ""

    def prepare(self, settings: Settings, spec: ClusterSpec, reporter: Reporter, previous: Deployment | None) -> None:
        from dspark_launch.model.onnodes import require_mounted

        require_mounted(settings, spec)
        self.image_id = lifecycle.prepare_containers(spec, reporter, previous)

    def clear_server(self, spec: ClusterSpec, previous: Deployment | None) -> None:
        pass  # prepare_containers recreated any container a recorded run was left in

    def cluster_up(self, spec: ClusterSpec, reporter: Reporter, previous: Deployment | None) -> Deployment:
        return lifecycle.cluster_up_locked(spec, reporter, None, self.image_id).state

    def roll_back(self, spec: ClusterSpec, reporter: Reporter) -> tuple[str, ...]:
        lifecycle.cluster_down_locked(spec, reporter, None, remove=True)
        return ("the node containers",)


def checked_serve_spec(
    settings: Settings, spec: ClusterSpec, reporter: Reporter, verify: bool
) -> tuple[ClusterSpec, ServeSpec, ModelWeights, dict[str, MemoryAnswer]]:
    """The weights checked on every node, then the serve spec resolved against the head's vLLM (under the lock:
    a first start writes the Ray token); the verified weights and every node's memory (asked meanwhile)
    for the memory pre-flight."""
    memory = Background(lambda: node_memory(spec))
    try:
        spec, serving = model_preflight(settings, spec, reporter, verify)
        serve_spec = resolved_serve_spec(settings, spec, reporter, rc.auth_env(spec, create=True), serving)
    except BaseException as exc:
        settle(memory, exc)
        raise
    return spec, serve_spec, serving.weights, memory.result()


def model_preflight(
    settings: Settings, spec: ClusterSpec, reporter: Reporter, full: bool
) -> tuple[ClusterSpec, ServingModel]:
    """The weights on every node (fast check, or sha256 with `full`) before anything starts; the
    spec whose node environment keeps the hub offline for every Ray worker."""
    from dspark_launch.model.onnodes import ready_to_serve, wanted_model

    reporter.phase("checking the model weights on every node" + (" (full sha256)" if full else ""))
    serving = ready_to_serve(wanted_model(settings), spec, full, reporter)
    reporter.phase(
        f"model weights ready on {len(serving.reports)} node(s) "
        f"({serving.manifest.total_size / (1 << 30):.2f} GiB, checked in {serving.seconds:.2f} s)"
    )
    node_env = tuple((k, v) for k, v in spec.node_env if k not in dict(serving.env)) + serving.env
    return dataclasses.replace(spec, node_env=node_env), serving


def launch(
    spec: ClusterSpec, serve_spec: ServeSpec, state: Deployment, reporter: Reporter, warm: WarmServer
) -> tuple[ServerRecord, readiness.FirstAnswer]:
    """The `warm` server on the head told to serve, recorded at once, then waited for."""
    log = str(spec.state_dir / "logs" / SERVER_LOG)
    head = spec.head.agent(reporter)
    marker = warm.marker
    reporter.phase(
        f"launching vllm serve on {spec.head.label}: {serve_spec.model} as {serve_spec.served_name}"
        " (warm: vLLM imported, arguments checked)"
    )
    server = ServerRecord(
        marker=marker,
        log=log,
        url=serve_spec.base_url,
        served_name=serve_spec.served_name,
        model=serve_spec.model,
        started_at=time.time(),
        settings=dict(serve_spec.settings),
        digest=serve_spec.settings_digest,
        cap=serve_spec.cap,
        profile=serve_spec.profile,
        decisions=[d.line for d in serve_spec.decisions],
        chat=serve_spec.chat,
        drain_s=serve_spec.drain_timeout_s,
        control_file=serve_spec.control_file,
        secrets=dict(serve_spec.secret_digests),
    )
    taken = api_holder(spec, server)  # no process recorded yet: whoever listens there is someone else
    if taken.verdict == PortHolderAnswer.FOREIGN:
        raise ServeFailure(foreign_line(server, taken))
    if serve_spec.control_file:  # a new scheduler starts from the serve spec's values, never a past reload's
        head.call(SchedulerControl(serve_spec.control_file, remove=True))
    try:
        # Inside the try: an interrupt while the agent tells it to serve still stops the server (by its marker).
        tell_to_serve(spec, warm)
        process, session = warm.process, warm.session
        server.pid, server.start_time, server.boot_id = process.pid, process.start_time, process.boot_id
        server.sessions = [recorded(SessionRecord, session)]
        state.server = server
        save_state(spec.state_dir, state)
        ready = wait_until_serving(spec, serve_spec, server, head, reporter)
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


def wait_until_serving(
    spec: ClusterSpec,
    serve_spec: ServeSpec,
    server: ServerRecord,
    head: NodeAgent,
    reporter: Reporter,
    backoff: readiness.Backoff | None = None,
) -> Ready:
    """/health, then /v1/models listing the served name, then a one-token (chat) completion, retried while it
    gets no answer; all within START_TIMEOUT_S of launch, a server that exits meanwhile a failure at once."""
    log = LogReader(head, server.log)
    start = time.monotonic()

    def exited() -> ServeFailure:
        final = log.refresh()  # read again: the last lines were written as it died
        return ServeFailure(
            f"vllm serve exited during start (phase: {logscan.phase(final)}): "
            f"{logscan.failure(final)}; log {server.log}",
            tails(spec, server, state=None),
        )

    while True:
        elapsed = time.monotonic() - start
        text = log.refresh()
        holder = api_holder(spec, server)  # the key only once the port is the server's (serve/api_holder.py)
        if holder.verdict == PortHolderAnswer.FOREIGN:
            raise ServeFailure(foreign_line(server, holder), tails(spec, server, state=None))
        if not holder.recorded_alive:
            raise exited()
        key = keyed(spec, server, serve_spec.client_key, holder)  # checked again before each request
        if healthy(holder, serve_spec.base_url, key, serve_spec.served_name, serve_spec.health_timeout_s):
            break
        if elapsed > serve_spec.start_timeout_s:
            raise ServeFailure(
                f"vllm serve not ready after {serve_spec.start_timeout_s} s "
                f"(phase: {logscan.phase(text)}); log {server.log}",
                tails(spec, server, state=None),
            )
        now_in = logscan.phase(text)
        shards = logscan.shards_loaded(text) if now_in == "loading weights" else None
        if shards:
            report_measured(
                reporter, "vllm serve: loading weights", *shards, "shards", elapsed, serve_spec.start_timeout_s
            )
        else:
            reporter.waiting(f"vllm serve: {now_in}", elapsed, serve_spec.start_timeout_s)
        time.sleep(0.5)
    kind = "chat completion" if serve_spec.chat else "completion"
    reporter.phase(f"sending a one-token {kind}")
    ask = http.chat if serve_spec.chat else http.complete
    answer = readiness.first_answer(
        lambda timeout: ask(serve_spec.base_url, key, serve_spec.served_name, "Hello", 1, timeout),
        lambda: server_alive(spec, server),
        f"the one-token {kind}",
        start,
        serve_spec.start_timeout_s,
        reporter,
        backoff or readiness.Backoff(first_timeout_s=max(30, serve_spec.health_timeout_s)),
    )
    if answer.outcome == readiness.DIED:
        raise exited()
    if answer.outcome == readiness.REFUSED:
        raise ServeFailure(
            f"the one-token {kind} failed: HTTP {answer.reply.status} {answer.reply.body[:200]}",
            tails(spec, server, state=None),
        )
    if answer.outcome == readiness.NO_ANSWER:
        last = f"HTTP {answer.reply.status}" if answer.reply.status else "no answer"
        raise ServeFailure(
            f"vllm serve not ready after {serve_spec.start_timeout_s} s: the API is up but the "
            f"one-token {kind} got no answer in {answer.attempts} attempt(s) (the last: {last} after "
            f"{answer.latency_s:.0f} s); log {server.log}",
            tails(spec, server, state=None),
        )
    text = log.refresh()
    cap = logscan.hotfix_cap(text)
    if spec.hotfix == "off":  # DSPARK_HOTFIX=off: vLLM's own scheduler, as cluster/hotfix_rollout.py left it
        reporter.phase(
            f"the one-token {kind} answered (attempt {answer.attempts}); serving vLLM's own scheduler "
            "(DSPARK_HOTFIX=off)"
        )
        if cap is not None:
            reporter.warn(f"DSPARK_HOTFIX=off, yet the EngineCore's scheduler reported the hotfix active (cap {cap})")
        return Ready(text, answer)
    reporter.phase(
        f"the one-token {kind} answered (attempt {answer.attempts}); checking that the served scheduler runs the hotfix"
    )
    if cap != serve_spec.cap:
        raise ServeFailure(
            f"the EngineCore's scheduler reported cap {cap}, expected {serve_spec.cap}: "
            "the hotfix is not active in the served vLLM; refusing to serve",
            tails(spec, server, state=None),
        )
    return Ready(text, answer)
