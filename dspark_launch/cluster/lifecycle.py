"""`cluster up`, `cluster down` and the cluster half of `status`, each on a record loaded once.

Callers hold the state lock (`locked_deployment`), load the record once and pass it
down; the functions here return the new record and the caller saves it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Literal

from dspark_launch import __version__
from dspark_launch.agent.protocol import Hello, RayNode
from dspark_launch.cluster import containers
from dspark_launch.cluster import ray_cluster as rc
from dspark_launch.cluster.hotfix_rollout import NodeChecks, versions_and_hotfix
from dspark_launch.cluster.parallel import Background, on_each, settle
from dspark_launch.cluster.spec import ClusterSpec, Node
from dspark_launch.cluster.state import (
    Deployment,
    HotfixRecord,
    RayRegistrationRecord,
    VersionsRecord,
    clear_state,
    ensure_state_dir,
    load_state,
    lock_holder,
    on_wire,
    recorded,
    save_state,
    state_lock,
)
from dspark_launch.errors import EXIT_ALREADY_RUNNING, ClusterFailure, DsparkError
from dspark_launch.node.values import VersionRow
from dspark_launch.node.versions import matrix_lines
from dspark_launch.report import Reporter


class AlreadyRunning(DsparkError):
    exit_code = EXIT_ALREADY_RUNNING


@dataclass
class UpResult:
    state: Deployment
    repaired: list[str] = field(default_factory=list)
    matrix: list[str] = field(default_factory=list)


@contextmanager
def locked_deployment(state_dir: Path) -> Iterator[Deployment | None]:
    """The state folder's lock, held for the block, and the record read once under it."""
    ensure_state_dir(state_dir)
    with state_lock(state_dir):
        yield load_state(state_dir)


def _unreachable_because(node: Node) -> str:
    """Why the node's agent does not answer; empty when it does."""
    try:
        node.agent().call(Hello())
        return ""
    except ClusterFailure as exc:
        return exc.detail or "no answer"


def node_health(spec: ClusterSpec, state: Deployment | None, details: dict[str, str] | None = None) -> dict[str, str]:
    """Per node, asked of all nodes at once: "alive", "dead" or "unreachable", from the recorded Ray daemons.

    `details`, when given, receives the reason for each node found unreachable.
    """

    def health_of(node: Node) -> tuple[str, str]:
        record = state.node(node.name) if state else None
        if record is None:
            why = _unreachable_because(node)
            return ("unreachable" if why else "dead"), why
        try:
            return ("alive" if rc.node_alive(node, record) else "dead"), ""
        except ClusterFailure as exc:
            return "unreachable", exc.detail

    results = on_each(spec.nodes, health_of)
    if details is not None:
        details.update({name: why for name, (health, why) in results.items() if health == "unreachable" and why})
    return {name: health for name, (health, _) in results.items()}


def cluster_up(spec: ClusterSpec, reporter: Reporter) -> UpResult:
    """`dspark cluster up`: under the lock, bring up (or repair) and save the record."""
    with locked_deployment(spec.state_dir) as existing:
        result = cluster_up_locked(spec, reporter, existing)
        save_state(spec.state_dir, result.state)
        return result


def cluster_up_locked(
    spec: ClusterSpec, reporter: Reporter, existing: Deployment | None, image_id: str | None = None
) -> UpResult:
    """Bring the cluster up (or repair a half-up one) for a caller that holds the lock; nothing is saved.

    With a container runtime, `image_id` says the caller already made the containers (prepare_containers).
    """
    for warning in rc.security_warnings(spec):
        reporter.warn(warning)
    if spec.containers:
        return _up_in_containers(spec, reporter, existing, image_id)
    repair: list[str] = []
    if existing is not None:
        health = node_health(spec, existing)
        if all(h == "alive" for h in health.values()) and existing.config_digest == spec.config_digest:
            raise AlreadyRunning(f"the cluster is already up ({existing.ray_address}); `dspark status` shows it")
        if health.get("head") == "alive" and existing.config_digest == spec.config_digest:
            repair = [name for name, h in health.items() if h != "alive"]
            reporter.warn(f"half-up cluster: {', '.join(repair)} down; repairing")
            stop_leftovers(spec, existing, reporter, only=repair)
        else:
            stop_leftovers(spec, existing, reporter)
            clear_state(spec.state_dir)
            existing = None
    return _bring_up(spec, reporter, existing, repair)


def prepare_containers(spec: ClusterSpec, reporter: Reporter, existing: Deployment | None) -> str:
    """Container runtime: check the settings and the image on every node, then make every node's container
    ready; returns the image id. A container running from the same image id, mounts and arguments with
    nothing of a run inside is kept (its JIT caches warm); any other is recreated. After a run that was
    never stopped (a record left), every container is recreated. The caller clears the record."""
    containers.check_settings(spec)
    reporter.phase(f"resolving {spec.containers.image} on every node")
    image_id = containers.same_image(spec)
    if existing is not None:
        reporter.phase("removing the previous run's containers")
        remove_containers(spec, reporter)
        clear_state(spec.state_dir)
    try:
        states = containers.up(spec, list(spec.nodes), image_id, reporter)
    except BaseException:
        remove_containers(spec, reporter)
        raise
    for name, state in states.items():
        if state.reused:
            reporter.phase(
                f"{spec.node(name).label}: reusing container {state.name} (image, mounts and arguments unchanged)"
            )
    return image_id


def remove_containers(spec: ClusterSpec, reporter: Reporter) -> list[str]:
    """Every node's container removed at once (ending every process of ours there); returns the nodes where not."""

    def remove_one(node: Node) -> bool:
        try:
            removed = containers.down(spec, [node])[node.name]
        except DsparkError as exc:
            reporter.warn(f"{node.label}: {exc}")
            return False
        if removed:
            reporter.phase(f"{node.label}: removed container {spec.containers.name(node.name)}")
        return True

    results = on_each(spec.nodes, remove_one)
    return [name for name, ok in results.items() if not ok]


def _up_in_containers(
    spec: ClusterSpec, reporter: Reporter, existing: Deployment | None, image_id: str | None
) -> UpResult:
    """Every start recreates the containers: the hotfix meets a pristine image's vLLM, in every container."""
    if image_id is None:
        if (
            existing is not None
            and existing.config_digest == spec.config_digest
            and all(h == "alive" for h in node_health(spec, existing).values())
        ):
            raise AlreadyRunning(f"the cluster is already up ({existing.ray_address}); `dspark status` shows it")
        image_id = prepare_containers(spec, reporter, existing)
    try:
        result = _bring_up(spec, reporter, None, [])
    except BaseException:
        remove_containers(spec, reporter)
        raise
    for record in result.state.nodes:
        record.container_name, record.container_runtime, record.container_image_id = (
            spec.containers.name(record.name),
            spec.containers.runtime,
            image_id,
        )
    result.state.versions = {name: replace(row, image=image_id) for name, row in result.state.versions.items()}
    result.matrix = matrix_lines({n.name: on_wire(VersionRow, result.state.versions[n.name]) for n in spec.nodes})
    return result


def stop_leftovers(spec: ClusterSpec, state: Deployment, reporter: Reporter, only: list[str] | None = None) -> None:
    """Stop what is left of a previous run (all nodes, or `only` these), by marker, session and start time."""

    def stop_one(node: Node) -> None:
        try:
            answer = rc.stop_node(node, state.node(node.name))
            if answer.stopped:
                reporter.warn(f"{node.label}: stopped {len(answer.stopped)} leftover process(es) of a previous run")
        except ClusterFailure as exc:
            reporter.warn(f"{exc}; leftover processes there may remain")

    on_each([n for n in spec.nodes if state.node(n.name) and (only is None or n.name in only)], stop_one)


def _bring_up(spec: ClusterSpec, reporter: Reporter, existing: Deployment | None, repair: list[str]) -> UpResult:
    bringup = rc.Bringup(spec, reporter)
    to_start = [n for n in spec.nodes if existing is None or n.name in repair]
    workers = [n for n in to_start if not n.is_head]
    pending: list[Background] = []  # work beside the bring-up, ended before a rollback
    try:
        # Every node's pre-flight at once, and all of it before any Ray starts: a node that fails it
        # leaves nothing started anywhere (the head's Ray would otherwise start beside it).
        bringup.fabric.update(on_each(to_start, lambda node: rc.preflight_node(spec, node, reporter)))
        # The version rows and the hotfix need no Ray: every node's agent does them while Ray starts;
        # the workers' Ray temp folders are prepared (over SSH) while the head's Ray starts.
        checked: Background[NodeChecks] = Background(lambda: versions_and_hotfix(spec, reporter))
        prepared = Background(lambda: on_each(workers, bringup.prepare))
        pending += [checked, prepared]
        stale: tuple[str, ...] = ()
        if spec.head in to_start:
            bringup.prepare(spec.head)
            bringup.start_ray(spec.head)
        else:
            # Repairing beside a live head: Ray may still list the lost nodes' old registrations
            # as alive for a few seconds; remember them so the wait never takes one for the new node.
            stale = tuple(
                n.node_id for n in rc.ray_view(spec, existing.node(spec.head.name)) if n.ip in {m.ip for m in workers}
            )
        prepared.result()
        on_each(workers, bringup.start_ray)
        registered = bringup.checks(stale, existing.node(spec.head.name) if existing else None)
        checks = checked.result()
    except BaseException as exc:
        try:
            for work in pending:
                settle(work, exc)
        finally:  # a signal during that wait still rolls back
            for problem in bringup.rollback():
                reporter.warn(f"rollback: {problem}")
        raise
    if existing is None:
        state = Deployment(
            ray_address=spec.ray_address,
            config_digest=spec.config_digest,
            started_at=time.time(),
            launcher_version=__version__,
            nodes=[bringup.records[n.name] for n in spec.nodes],
        )
    else:
        state = existing
        state.nodes = [bringup.records.get(n.name) or existing.node(n.name) for n in spec.nodes]
    record_registrations(state, spec, registered.nodes)
    state.versions = {name: recorded(VersionsRecord, row) for name, row in checks.versions.items()}
    state.hotfix = {name: recorded(HotfixRecord, report) for name, report in checks.hotfix.items()}
    return UpResult(state, repair, matrix_lines({n.name: checks.versions[n.name] for n in spec.nodes}))


def record_registrations(state: Deployment, spec: ClusterSpec, registered: tuple[RayNode, ...]) -> None:
    """Each node's Ray registration as the checks found it (in the order of spec.nodes), kept in its record:
    `status` answers registered IP and GPUs from it while the node's recorded Ray daemons live."""
    for node, ray_node in zip(spec.nodes, registered):
        record = state.node(node.name)
        if record is not None:
            record.ray = RayRegistrationRecord(ray_node.node_id, ray_node.ip, ray_node.gpus)


def cluster_down(spec: ClusterSpec, reporter: Reporter) -> list[str]:
    """`dspark cluster down`: stop what we started on every node; returns the nodes that could not be stopped."""
    with locked_deployment(spec.state_dir) as state:
        return cluster_down_locked(spec, reporter, state)


def cluster_down_locked(
    spec: ClusterSpec, reporter: Reporter, state: Deployment | None, remove: bool = False
) -> list[str]:
    """Stop Ray on every node at once; the record is cleared when all stopped. With a container runtime
    the containers stay (idle, warm for the next start) unless `remove`, or unless stopping inside failed."""
    if spec.containers:
        # Named from the state folder: found (and removed) with or without a record.
        unreachable = remove_containers(spec, reporter) if remove else _stop_in_containers(spec, reporter, state)
        if not unreachable:
            clear_state(spec.state_dir)
        return unreachable
    if state is None:
        reporter.phase("nothing to stop: no cluster started from this state folder")
        return []

    def stop_one(node: Node) -> bool:
        try:
            answer = rc.stop_node(node, state.node(node.name))
        except ClusterFailure as exc:
            reporter.warn(str(exc))
            return False
        reporter.phase(f"{node.label}: stopped {len(answer.stopped)} process(es)")
        if answer.left:
            reporter.warn(f"{node.label}: pids {list(answer.left)} did not stop")
        return not answer.left

    stopped = on_each([n for n in spec.nodes if state.node(n.name)], stop_one)
    unreachable = [name for name, ok in stopped.items() if not ok]
    if not unreachable:
        clear_state(spec.state_dir)
    return unreachable


def _stop_in_containers(spec: ClusterSpec, reporter: Reporter, state: Deployment | None) -> list[str]:
    """Ray stopped inside each running container by the record; a container that is not running, or in
    which something was left, is removed (that ends every process in it). Returns nodes not cleaned."""
    boxes = containers.inspect(spec)

    def stop_one(node: Node) -> bool:
        record = state.node(node.name) if state else None
        if boxes[node.name].running and record is not None:
            try:
                answer = rc.stop_node(node, record)
                reporter.phase(f"{node.label}: stopped {len(answer.stopped)} process(es); container kept")
                if not answer.left:
                    return True
            except ClusterFailure as exc:
                reporter.warn(f"{exc}; removing the container")
        elif boxes[node.name].running:
            return True  # idle since the last stop
        elif boxes[node.name].status == "absent":
            return True
        try:
            containers.down(spec, [node])
        except DsparkError as exc:
            reporter.warn(f"{node.label}: {exc}")
            return False
        reporter.phase(f"{node.label}: removed container {spec.containers.name(node.name)}")
        return True

    results = on_each(spec.nodes, stop_one)
    return [name for name, ok in results.items() if not ok]


@dataclass(frozen=True, kw_only=True)
class NodeView:
    name: str
    ip: str
    ssh_host: str | None
    reachable: bool
    ray_alive: bool
    registered_ip: str | None  # from Ray's node table; None when Ray does not list it
    gpus: float | None
    pids: tuple[int, ...]  # the node's Ray daemons (raylet, gcs_server)
    versions: VersionsRecord | None
    hotfix: str | None  # the hotfix state at start: applied, not-applied, ...; off: DSPARK_HOTFIX=off
    container: str | None = None  # DSPARK_RUNTIME=docker|podman: the node's container,
    container_status: str | None = None  # its state (running, exited, absent, ...)
    image_id: str | None = None  # and the image id it runs
    unreachable_reason: str | None = None  # why its agent did not answer (reachable False)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.ip})"


RaySource = Literal["record", "ray"]


@dataclass(frozen=True)
class ClusterView:
    """The cluster half of `status` (JSON shape in docs/cluster.md)."""

    state: str  # down | starting | up | degraded
    ray_address: str
    config_digest: str | None
    started_at: float | None
    nodes: tuple[NodeView, ...]
    problems: tuple[str, ...]
    checked_at: float
    ray_source: RaySource | None = None  # where the nodes' registered IP and GPUs came from


def ray_source(
    state: Deployment | None, spec: ClusterSpec, deep: bool, health: dict[str, str] | None = None
) -> RaySource | None:
    """Where `status` takes each node's Ray registration (registered IP, GPUs) from: the record, when every
    node's registration was recorded at start and (once `health` is known) every node's recorded Ray daemons
    are still the same live processes; else Ray's node table ("ray", also for `--deep`); None without a record."""
    if state is None:
        return None
    if deep:
        return "ray"
    records = [state.node(node.name) for node in spec.nodes]
    if not all(record is not None and record.ray is not None for record in records):
        return "ray"
    if health is not None and not all(health.get(node.name) == "alive" for node in spec.nodes):
        return "ray"
    return "record"


def _ask_ray(spec: ClusterSpec, state: Deployment) -> Background:
    return Background(lambda: rc.ray_view(spec, state.node(spec.head.name), RAY_VIEW_TIMEOUT_S))


def cluster_status(spec: ClusterSpec, state: Deployment | None, deep: bool = False) -> ClusterView:
    """Every node asked at once; Ray's own view asked beside them unless the record answers it (`ray_source`)."""
    busy = lock_holder(spec.state_dir) is not None
    details: dict[str, str] = {}
    # Ray's own view (the head's agent imports Ray: the slowest question) is asked while the nodes are,
    # unless every node's registration is on record: then only when a node's Ray daemons changed.
    source = ray_source(state, spec, deep)
    ray_view = _ask_ray(spec, state) if state and source == "ray" else None
    boxes = Background(lambda: containers.inspect(spec)) if spec.containers else None
    health = node_health(spec, state, details)
    if state and source == "record" and ray_source(state, spec, deep, health) == "ray":
        source, ray_view = "ray", _ask_ray(spec, state)
    nodes = []
    for node in spec.nodes:
        record = state.node(node.name) if state else None
        hotfix = state.hotfix.get(node.name) if state else None
        nodes.append(
            NodeView(
                name=node.name,
                ip=node.ip,
                ssh_host=node.ssh_host,
                reachable=health[node.name] != "unreachable",
                ray_alive=health[node.name] == "alive",
                registered_ip=None,
                gpus=None,
                pids=tuple(proc.pid for proc in rc.core_processes(record)) if record else (),
                versions=state.versions.get(node.name) if state else None,
                hotfix=("off" if hotfix.apply.action == "revert" else hotfix.status.state) if hotfix else None,
                unreachable_reason=details.get(node.name) if health[node.name] == "unreachable" else None,
            )
        )
    if boxes is not None:
        nodes = _with_containers(boxes.result(), nodes)
        if state and source == "record" and not all(n.ray_alive for n in nodes):
            source, ray_view = "ray", _ask_ray(spec, state)  # a node's container is not running
    alive = [n for n in nodes if n.ray_alive]
    if busy:
        overall = "starting"
    elif not alive:
        overall = "down"
    elif len(alive) == len(nodes):
        overall = "up"
    else:
        overall = "degraded"
    if alive and nodes[0].ray_alive and state is not None:
        if ray_view is not None:
            nodes = _with_ray_view(ray_view, nodes)
        elif all(n.ray_alive for n in nodes):
            nodes = _with_record(state, nodes)
        if overall == "up" and any(n.registered_ip != n.ip for n in nodes):
            overall = "degraded"
    problems = [foreign] if (foreign := rc.foreign_ray_port(ray_view)) else []
    if state and overall in ("up", "degraded"):
        for node in nodes:
            if node.container and node.container_status != "running":
                problems.append(
                    f"{node.label}: container {node.container} is {node.container_status}; "
                    f"`dspark logs --node {node.name}`, then `dspark restart` recreates it"
                )
            elif not node.reachable:
                problems.append(
                    f"{node.label}: unreachable ({details.get(node.name, 'no answer')}); "
                    f"check the fabric link and SSH to {node.ssh_host}"
                )
            elif not node.ray_alive:
                problems.append(
                    f"{node.label}: Ray is down (its raylet is gone); `dspark logs --node {node.name}`, "
                    "then `dspark restart`"
                )
            elif node.registered_ip not in (None, node.ip):
                problems.append(f"{node.label}: Ray does not list this node at its fabric IP")
    return ClusterView(
        overall,
        spec.ray_address,
        state.config_digest if state else None,
        state.started_at if state else None,
        tuple(nodes),
        tuple(problems),
        time.time(),
        source,
    )


RAY_VIEW_TIMEOUT_S = 20


def _with_containers(boxes: dict, nodes: list[NodeView]) -> list[NodeView]:
    """Each node's container and image id; a node whose container is not running is not alive."""
    return [
        replace(
            node,
            container=boxes[node.name].name,
            container_status=boxes[node.name].status,
            image_id=boxes[node.name].image_id or None,
            ray_alive=node.ray_alive and boxes[node.name].running,
        )
        for node in nodes
    ]


def _with_record(state: Deployment, nodes: list[NodeView]) -> list[NodeView]:
    """Registered IP and GPUs per node as recorded at start (every node's recorded Ray daemons still live)."""
    out = []
    for node in nodes:
        record = state.node(node.name)
        ray = record.ray if record else None
        out.append(replace(node, registered_ip=ray.ip, gpus=ray.gpus) if ray else node)
    return out


def _with_ray_view(ray_view: Background, nodes: list[NodeView]) -> list[NodeView]:
    """Registered IP and GPUs per node from Ray itself (unchanged if the head does not answer in time)."""
    try:
        seen = {n.ip: n for n in ray_view.result() if n.alive}
    except ClusterFailure:
        return nodes
    return [
        replace(node, registered_ip=node.ip, gpus=seen[node.ip].gpus)
        if node.ip in seen
        else replace(node, ray_alive=False)
        for node in nodes
    ]
