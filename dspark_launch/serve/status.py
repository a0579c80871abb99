"""`dspark status`: the cluster view, the server's health and metrics, drift from the env file."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from dspark_launch.agent.codec import to_data
from dspark_launch.cluster import lifecycle, platform_check
from dspark_launch.cluster.parallel import Background
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import Deployment, ServerRecord, load_state
from dspark_launch.config.secret_digest import compared_values
from dspark_launch.config.settings import Settings, recorded_value
from dspark_launch.errors import ClusterFailure
from dspark_launch.node.vllm_releases import untested_note
from dspark_launch.serve import http, stall
from dspark_launch.serve.api_holder import api_holder, foreign_line, keyed
from dspark_launch.serve.api_holder import healthy as api_healthy
from dspark_launch.serve.memory_guard import MemoryWatch
from dspark_launch.serve.recovery import Recovery, recent_recoveries


@dataclass(frozen=True)
class Drift:
    name: str
    running: str | None
    configured: str


ServerState = Literal["down", "up", "unhealthy", "dead"]


@dataclass(frozen=True, kw_only=True)
class ServerView:
    state: ServerState
    pid: int | None = None
    url: str | None = None
    model: str | None = None
    served_name: str | None = None
    uptime_s: int | None = None
    healthy: bool = False
    cap: int | None = None  # the cap the EngineCore's scheduler reported
    kv_cache_tokens: int | None = None
    metrics: http.ServerMetrics = field(default_factory=http.ServerMetrics)
    drift: tuple[Drift, ...] = ()
    profile: str = ""
    decisions: tuple[str, ...] = ()  # the profile's decision lines at start
    live: dict[str, str] = field(default_factory=dict)  # live settings `dspark reload` changed since the start
    live_since: float | None = None  # when they were in force
    listener: str = ""  # another process holds the API port (never sent the key)
    engine: stall.EngineWatch | None = None  # is the engine producing (serve/stall.py); None: not asked


@dataclass(frozen=True, kw_only=True)
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
    ray_source: lifecycle.RaySource | None = None  # where the nodes' registered IP and GPUs came from
    hotfix: str | None = None  # DSPARK_HOTFIX at start, from the record: "required", "off"; None without one
    recoveries: tuple[Recovery, ...] = ()  # the supervisor's recoveries within the last hour (serve/recovery.py)
    memory: MemoryWatch | None = None  # every node's memory as the supervisor sampled it last, and its guard

    def to_data(self) -> dict[str, Any]:
        """The JSON document of `dspark status --json` (docs/cluster.md): the metrics by their gauge names."""
        data: dict[str, Any] = to_data(self)
        data["server"]["metrics"] = self.server.metrics.as_prometheus()
        return data

    @property
    def deployed(self) -> bool:
        """A deployment record exists (a cluster or a server was started from this state folder)."""
        return self.config_digest is not None or self.started_at is not None or self.server.pid is not None


def drift(started_with: dict[str, str], now: dict[str, str]) -> tuple[Drift, ...]:
    """Settings that differ between the running server and the env file now."""
    return tuple(
        Drift(name, started_with.get(name), value) for name, value in now.items() if started_with.get(name) != value
    )


def _server_view(settings: Settings, spec: ClusterSpec, server: ServerRecord | None) -> ServerView:
    """The head's agent is asked only whether the recorded process lives (answered in this process when the head
    is this machine: agent/client.py); the rest comes from the API and the record."""
    from dspark_launch.serve.serve_spec import api_key

    if server is None:
        return ServerView(state="down")
    probe = settings.health_timeout_s
    holder = api_holder(spec, server)  # the key goes only to the recorded server's socket
    alive = holder.recorded_alive
    key = keyed(spec, server, api_key(settings), holder)  # checked again before each request it goes with
    healthy = alive and api_healthy(holder, server.url, key, server.served_name, probe)
    hotfix_off = recorded_value(server.settings, "dspark_hotfix") == "off"  # vLLM's own scheduler: no cap
    return ServerView(
        state="up" if healthy else ("unhealthy" if alive else "dead"),
        pid=server.pid,
        url=server.url,
        model=server.model,
        served_name=server.served_name,
        uptime_s=round(time.time() - server.started_at) if alive else None,
        healthy=healthy,
        cap=None if hotfix_off else (server.scheduler_cap if server.scheduler_cap is not None else server.cap),
        kv_cache_tokens=server.kv_cache_tokens,
        metrics=http.metrics(server.url, probe, key) if healthy else http.ServerMetrics(),
        drift=drift(server.running_settings, compared_values(settings, server.secrets)),
        profile=server.profile,
        decisions=tuple(server.decisions),
        live=dict(server.live),
        live_since=server.live_since,
        listener=foreign_line(server, holder) if holder.verdict == holder.FOREIGN else "",
        engine=_engine(spec, server, key, probe, settings.dspark_stall_timeout_s) if healthy else None,
    )


def _engine(spec: ClusterSpec, server: ServerRecord, key: http.Keyed, probe: float, now_s: int) -> stall.EngineWatch:
    """The engine judged from /metrics against the progress point the supervisor (or an earlier status) kept, with the
    stall timeout the server runs with (`now_s`, the env file's, for a record that has none)."""
    timeout = int(recorded_value(server.settings, "dspark_stall_timeout_s", str(now_s)))
    return stall.look(spec.state_dir, server.marker, stall.metrics_text(server.url, probe, key), timeout)


def _server_log(spec: ClusterSpec, server: ServerRecord) -> str:
    from dspark_launch.serve.logfollow import LogReader

    try:
        return LogReader(spec.head.agent(), server.log).refresh()
    except ClusterFailure:
        if not spec.containers:
            raise
        return ""  # the head's container is gone: its problem line says so


def status(settings: Settings, spec: ClusterSpec, deep: bool = False) -> ServiceStatus:
    """The record is read once, without the lock; the cluster and the server are asked at once. `deep`: Ray's
    node table is read even when the record answers it (lifecycle.ray_source)."""
    state = load_state(spec.state_dir)
    server = state.server if state else None
    cluster = Background(lambda: lifecycle.cluster_status(spec, state, deep))
    at_start = state.platform if state else {}
    platform = Background(lambda: platform_check.drift_lines(spec, at_start) if at_start else [])  # since start
    view = _server_view(settings, spec, server)
    data = cluster.result()
    problems = list(data.problems)
    if view.listener:
        problems.append(view.listener)
    if server and view.state == "dead":
        from dspark_launch.serve import logscan

        text = _server_log(spec, server)
        problems.append(
            f"vllm serve (pid {server.pid}) is not running: {logscan.failure(text)}; "
            f"log {server.log}; `dspark restart` starts it again"
        )
    elif server and view.state == "unhealthy":
        problems.append(
            f"vllm serve (pid {server.pid}) runs but {server.url}/health does not answer "
            f"within {settings.health_timeout_s} s; log {server.log}"
        )
    engine = view.engine
    stalled = engine is not None and engine.stalled
    if server and engine is not None and engine.stalled:
        problems.append(
            f"vllm serve (pid {server.pid}) answers but its {engine.line}; the supervisor (`start "
            "--foreground`, the systemd unit) restarts it; by hand: `dspark restart --now`"
        )
    overall = "degraded" if server and data.state == "up" and (view.state != "up" or stalled) else data.state
    mode = hotfix_mode(state)
    return ServiceStatus(
        state=overall,
        ray_address=data.ray_address,
        config_digest=data.config_digest,
        started_at=data.started_at,
        checked_at=data.checked_at,
        problems=tuple(problems),
        nodes=data.nodes,
        server=view,
        fabric_warnings=tuple(w for record in (state.nodes if state else ()) for w in record.fabric_warnings),
        warnings=(*record_notes(state, mode), *image_warnings(settings), *platform.result()),
        ray_source=data.ray_source,
        hotfix=mode,
        recoveries=tuple(recent_recoveries(spec.state_dir)),
        memory=_memory(spec, server),
    )


def _memory(spec: ClusterSpec, server: ServerRecord | None) -> MemoryWatch | None:
    """The supervisor's last memory sample of this server, when it is recent (a supervisor samples every few
    seconds; an older one is of a supervisor no longer running)."""
    from dspark_launch.serve.memory_guard import MEMORY_CHECK_S, load

    watch = load(spec.state_dir)
    if watch is None or server is None or watch.marker != server.marker or time.time() - watch.at > 6 * MEMORY_CHECK_S:
        return None
    return watch


def hotfix_mode(state: Deployment | None) -> str | None:
    """DSPARK_HOTFIX as the start applied it: "off" when it reverted instead of applying (hotfix_rollout.hotfix_off),
    "required" when it applied; None without a record of it."""
    if state is None or not state.hotfix:
        return None
    return "off" if any(record.apply.action == "revert" for record in state.hotfix.values()) else "required"


def record_notes(state: Deployment | None, mode: str | None) -> tuple[str, ...]:
    """What the record says an operator should know: the hotfix off, a node on an untested vLLM release."""
    notes = (
        [
            "the scheduler hotfix is OFF on every node (DSPARK_HOTFIX=off at start): vLLM's own scheduler, without "
            "the in-flight prefill cap"
        ]
        if mode == "off"
        else []
    )
    by_version: dict[str, list[str]] = {}
    for name, versions in state.versions.items() if state else ():
        by_version.setdefault(versions.vllm or "", []).append(name)
    notes += [note for version, names in by_version.items() if (note := untested_note(", ".join(names), version))]
    return tuple(notes)


def image_warnings(settings: Settings) -> tuple[str, ...]:
    """`plan` and `status`: the container image should be pinned by digest."""
    from dspark_launch.config.container_args import unpinned_image_warning

    entry = settings.entry("dspark_image")
    line = unpinned_image_warning(settings.dspark_runtime, entry.value, entry.source)
    return (line,) if line else ()
