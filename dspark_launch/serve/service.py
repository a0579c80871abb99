"""The whole service: config check, cluster up, `vllm serve` on the head, health; stop; status.

The state lock is held for the whole start, so a second launcher waits for nothing
and fails naming the holder.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field

from dspark_launch.cluster import lifecycle
from dspark_launch.cluster import ray_cluster as rc
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ClusterState, ensure_state_dir, load_state, save_state, state_lock
from dspark_launch.config.settings import Settings
from dspark_launch.errors import DsparkError
from dspark_launch.serve import http, logscan
from dspark_launch.serve.plan import ServePlan, api_key, serve_plan

SERVER_LOG = "vllm-serve.log"


class ServeFailure(DsparkError):
    """vllm serve did not come up; `extra` holds the log tails to print."""

    def __init__(self, message: str, extra: list[str] | None = None):
        super().__init__(message)
        self.extra = extra or []


@dataclass
class StartResult:
    plan: ServePlan
    server: dict
    cluster_started: bool
    hotfix: dict = field(default_factory=dict)


def build_plan(settings: Settings, spec: ClusterSpec, with_ray_token: bool = True) -> ServePlan:
    """The serve plan; without the Ray token nothing is written (the token may be generated)."""
    forwarded = {name: os.environ[name] for name in spec.forward_env if name in os.environ}
    ray_env = rc.auth_env(spec) if with_ray_token else {"RAY_AUTH_MODE": spec.auth_mode}
    return serve_plan(settings, spec, forwarded, ray_env)


def preflight_serve(settings: Settings, spec: ClusterSpec, plan: ServePlan, reporter, strict: bool) -> None:
    """Checks that need no running cluster: the installed vLLM's parser, memory."""
    from dspark_launch.serve.argcheck import check_serve_args
    from dspark_launch.serve.memory import fit_report, hf_cache_snapshot, weights_bytes
    from dspark_launch.serve.plan import local_model_dir

    reporter.phase("checking the vllm serve arguments with the installed vLLM")
    check_serve_args(list(plan.serve_args), settings.entries["VLLM_EXTRA_ARGS"].source)
    folder = local_model_dir(plan.model) or hf_cache_snapshot(plan.model, settings["DSPARK_MODEL_REVISION"])
    weights = weights_bytes(folder) if folder else None
    if weights is None:
        return
    memory = {n.label: rc.call(n, {"op": "meminfo"}, "memory")["total_bytes"] for n in spec.nodes}
    problems = fit_report(weights, plan.tensor_parallel_size, memory, settings.float("GPU_MEMORY_UTILIZATION"))
    for problem in problems:
        if strict:
            raise ServeFailure(f"memory pre-flight: {problem} (--strict); unified memory that runs out freezes the host")
        reporter.warn(f"memory pre-flight: {problem}; unified memory that runs out freezes the host")


def server_alive(spec: ClusterSpec, server: dict) -> bool:
    if not server.get("pid"):
        return False
    answer = rc.call(spec.head, {"op": "alive", "processes": [server]}, "server status", 30)
    return all(answer["alive"])


def _server_healthy(plan_url: str, key: str, served_name: str, timeout: float) -> bool:
    return (http.request(f"{plan_url}/health", key, timeout=timeout).status == 200
            and served_name in http.served_models(plan_url, key, timeout))


def start(settings: Settings, spec: ClusterSpec, reporter, strict: bool = False) -> StartResult:
    preflight_serve(settings, spec, build_plan(settings, spec, with_ray_token=False), reporter, strict)
    ensure_state_dir(spec.state_dir)
    plan = build_plan(settings, spec)
    with state_lock(spec.state_dir):
        state = load_state(spec.state_dir)
        if state and state.server and server_alive(spec, state.server):
            url = state.server["url"]
            if _server_healthy(url, api_key(settings), state.server["served_name"], settings.int("HEALTH_TIMEOUT_S")):
                raise lifecycle.AlreadyRunning(f"already running and healthy at {url}; `dspark status` shows it")
        if state and state.server:
            _stop_server(spec, state.server)
            state.server = {}
            save_state(spec.state_dir, state)
        cluster_started = True
        try:
            lifecycle.cluster_up_locked(spec, reporter)
        except lifecycle.AlreadyRunning:
            cluster_started = False
            reporter.phase("the Ray cluster is already up; reusing it")
        state = load_state(spec.state_dir)
        try:
            server = launch(settings, spec, plan, state, reporter)
        except BaseException:
            if cluster_started:
                lifecycle.cluster_down_locked(spec, reporter)
            raise
        return StartResult(plan, server, cluster_started, state.hotfix)


def launch(settings: Settings, spec: ClusterSpec, plan: ServePlan, state: ClusterState, reporter) -> dict:
    log = spec.state_dir / "logs" / SERVER_LOG
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if log.exists():
        os.replace(log, log.with_name(SERVER_LOG + ".1"))
    marker = f"dspark-{secrets.token_hex(4)}-server"
    reporter.phase(f"launching vllm serve on {spec.head.label}: {plan.model} as {plan.served_name}")
    server = {"pid": None, "start_time": None, "marker": marker, "sessions": [], "log": str(log),
              "url": plan.base_url, "served_name": plan.served_name, "model": plan.model, "started_at": time.time(),
              "settings": settings.public_values(), "digest": settings.digest(), "cap": plan.cap}
    try:
        # Inside the try: an interrupt while the agent spawns still stops the server (found by its marker).
        answer = rc.call(spec.head, {"op": "spawn", "argv": plan.argv, "env": plan.full_env(), "marker": marker,
                                     "log": str(log)}, "vllm serve")
        server.update(pid=answer["pid"], start_time=answer["start_time"], boot_id=answer.get("boot_id"),
                      sessions=[answer["session"]])
        state.server = server
        save_state(spec.state_dir, state)
        wait_until_serving(settings, spec, plan, server, reporter)
    except BaseException:
        _stop_server(spec, server)
        state.server = {}
        save_state(spec.state_dir, state)
        raise
    text = log.read_text(errors="replace")
    server["kv_cache_tokens"] = logscan.kv_cache_tokens(text)
    server["scheduler_cap"] = logscan.hotfix_cap(text)
    save_state(spec.state_dir, state)
    return server


def wait_until_serving(settings: Settings, spec: ClusterSpec, plan: ServePlan, server: dict, reporter) -> None:
    """/health, then /v1/models listing the served name, then a one-token completion."""
    key = api_key(settings)
    timeout = settings.int("START_TIMEOUT_S")
    probe = settings.int("HEALTH_TIMEOUT_S")
    log = server["log"]
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        text = _read(log)
        if not server_alive(spec, server):
            final = _read(log)  # read again: the last lines were written as it died
            raise ServeFailure(f"vllm serve exited during start (phase: {logscan.phase(final)}): "
                               f"{logscan.failure(final)}; log {log}", tails(spec, server))
        if _server_healthy(plan.base_url, key, plan.served_name, probe):
            break
        if elapsed > timeout:
            raise ServeFailure(f"vllm serve not ready after {timeout} s (phase: {logscan.phase(text)}); log {log}",
                               tails(spec, server))
        reporter.waiting(f"vllm serve: {logscan.phase(text)}", elapsed, timeout)
        time.sleep(1.0)
    reporter.phase("sending a one-token completion")
    reply = http.complete(plan.base_url, key, plan.served_name, "Hello", 1, max(30, probe))
    if reply.status != 200:
        raise ServeFailure(f"the one-token completion failed: HTTP {reply.status}", tails(spec, server))
    cap = logscan.hotfix_cap(_read(log))
    if cap != plan.cap:
        raise ServeFailure(f"the EngineCore's scheduler reported cap {cap}, expected {plan.cap}: "
                           "the hotfix is not active in the served vLLM; refusing to serve", tails(spec, server))


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def tails(spec: ClusterSpec, server: dict | None, lines: int = 30) -> list[str]:
    """The end of the server log and of each node's Ray logs, for a failure report."""
    out: list[str] = []
    if server:
        out += rc.call(spec.head, {"op": "tail", "paths": [server["log"]], "lines": lines}, "logs")["lines"]
    state = load_state(spec.state_dir)
    for node in spec.nodes:
        record = state.node(node.name) if state else None
        if record is None:
            continue
        try:
            out += rc.call(node, {"op": "tail", "paths": rc.ray_log_paths(node, record), "lines": 10}, "logs")["lines"]
        except rc.ClusterFailure as exc:
            out.append(f"({exc})")
    return out


def _stop_server(spec: ClusterSpec, server: dict) -> dict:
    processes = [server] if server.get("pid") else []
    return rc.call(spec.head, {"op": "stop", "marker": server["marker"], "processes": processes,
                               "sessions": server.get("sessions", []), "grace_s": 15}, "stop server", 90)


def stop(spec: ClusterSpec, reporter) -> list[str]:
    """The server, then Ray on every node; idempotent. Returns nodes that could not be stopped."""
    ensure_state_dir(spec.state_dir)
    with state_lock(spec.state_dir):
        state = load_state(spec.state_dir)
        if state and state.server:
            answer = _stop_server(spec, state.server)
            reporter.phase(f"vllm serve: stopped {len(answer['stopped'])} process(es)")
            state.server = {}
            save_state(spec.state_dir, state)
        return lifecycle.cluster_down_locked(spec, reporter)


def drift(started_with: dict[str, str], now: dict[str, str]) -> list[dict]:
    """Settings that differ between the running server and the env file now."""
    return [{"name": name, "running": started_with.get(name), "configured": value}
            for name, value in now.items() if started_with.get(name) != value]


def status(settings: Settings, spec: ClusterSpec) -> dict:
    data = lifecycle.cluster_status(spec)
    state = load_state(spec.state_dir)
    server = state.server if state else {}
    view = {"state": "down", "pid": None, "url": None, "uptime_s": None, "healthy": False, "metrics": {},
            "cap": None, "kv_cache_tokens": None, "drift": []}
    if server:
        alive = server_alive(spec, server)
        probe = settings.int("HEALTH_TIMEOUT_S")
        healthy = alive and _server_healthy(server["url"], api_key(settings), server["served_name"], probe)
        view.update({"state": "up" if healthy else ("unhealthy" if alive else "dead"), "pid": server["pid"],
                     "url": server["url"], "model": server["model"], "served_name": server["served_name"],
                     "uptime_s": round(time.time() - server["started_at"]) if alive else None,
                     "healthy": healthy, "cap": server.get("scheduler_cap", server.get("cap")),
                     "kv_cache_tokens": server.get("kv_cache_tokens"),
                     "metrics": http.metrics(server["url"], probe) if healthy else {},
                     "drift": drift(server["settings"], settings.public_values())})
    data["server"] = view
    if server and view["state"] == "dead":
        why = logscan.failure(_read(server["log"]))
        data["problems"].append(f"vllm serve (pid {server['pid']}) is not running: {why}; log {server['log']}; "
                                "`dspark restart` starts it again")
    elif server and view["state"] == "unhealthy":
        data["problems"].append(f"vllm serve (pid {server['pid']}) runs but {server['url']}/health does not answer "
                                f"within {settings.int('HEALTH_TIMEOUT_S')} s; log {server['log']}")
    cluster_state = data["state"]
    if server and cluster_state == "up" and view["state"] != "up":
        data["state"] = "degraded"
    elif server and cluster_state == "down":
        data["state"] = "down"
    return data
