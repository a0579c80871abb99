"""`cluster up`, `cluster down` and the cluster half of `status`, under the state lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from dspark_launch.cluster import ray_cluster as rc
from dspark_launch.cluster.spec import ClusterSpec, Node
from dspark_launch.cluster.state import (ClusterState, clear_state, ensure_state_dir, load_state, lock_holder,
                                         save_state, state_lock)
from dspark_launch.errors import EXIT_ALREADY_RUNNING, DsparkError


class AlreadyRunning(DsparkError):
    exit_code = EXIT_ALREADY_RUNNING


@dataclass
class UpResult:
    state: ClusterState
    repaired: list[str] = field(default_factory=list)
    matrix: list[str] = field(default_factory=list)


def _python_of(node: Node) -> str:
    return node.transport.python


def _reachable(node: Node) -> bool:
    try:
        rc.call(node, {"op": "probe"}, "probe", 20)
        return True
    except rc.ClusterFailure:
        return False


def node_health(spec: ClusterSpec, state: ClusterState | None,
                details: dict[str, str] | None = None) -> dict[str, str]:
    """Per node: "alive", "dead" or "unreachable", from the recorded Ray daemons.

    `details`, when given, receives the reason for each node found unreachable.
    """
    health = {}
    for node in spec.nodes:
        record = state.node(node.name) if state else None
        if record is None:
            health[node.name] = "dead" if _reachable(node) else "unreachable"
            continue
        try:
            health[node.name] = "alive" if rc.node_alive(node, record) else "dead"
        except rc.ClusterFailure as exc:
            health[node.name] = "unreachable"
            if details is not None:
                details[node.name] = exc.detail
    return health


def cluster_up(spec: ClusterSpec, reporter: rc.Reporter) -> UpResult:
    ensure_state_dir(spec.state_dir)
    with state_lock(spec.state_dir):
        return cluster_up_locked(spec, reporter)


def cluster_up_locked(spec: ClusterSpec, reporter: rc.Reporter) -> UpResult:
    """`cluster up` for a caller that holds the state lock."""
    for warning in rc.security_warnings(spec):
        reporter.warn(warning)
    existing = load_state(spec.state_dir)
    repair: list[str] = []
    if existing is not None:
        health = node_health(spec, existing)
        if all(h == "alive" for h in health.values()) and existing.config_digest == spec.config_digest:
            raise AlreadyRunning(f"the cluster is already up ({existing.ray_address}); `dspark status` shows it")
        if health.get("head") == "alive" and existing.config_digest == spec.config_digest:
            repair = [name for name, h in health.items() if h != "alive"]
            reporter.warn(f"half-up cluster: {', '.join(repair)} down; repairing")
            _stop_leftovers(spec, existing, reporter, only=repair)
        else:
            _stop_leftovers(spec, existing, reporter)
            clear_state(spec.state_dir)
            existing = None
    return _bring_up(spec, reporter, existing, repair)


def _stop_leftovers(spec: ClusterSpec, state: ClusterState, reporter: rc.Reporter,
                    only: list[str] | None = None) -> None:
    """Stop what is left of a previous run (all nodes, or `only` these), by marker, session and start time."""
    for node in spec.nodes:
        record = state.node(node.name)
        if record is None or (only is not None and node.name not in only):
            continue
        try:
            answer = rc.stop_node(node, record)
            if answer["stopped"]:
                reporter.warn(f"{node.label}: stopped {len(answer['stopped'])} leftover process(es) of a previous run")
        except rc.ClusterFailure as exc:
            reporter.warn(f"{exc}; leftover processes there may remain")


def _bring_up(spec: ClusterSpec, reporter: rc.Reporter, existing: ClusterState | None,
              repair: list[str]) -> UpResult:
    bringup = rc.Bringup(spec, reporter, _python_of)
    to_start = [n for n in spec.nodes if existing is None or n.name in repair]
    try:
        rc.preflight(spec, reporter, to_start)
        stale: set[str] = set()
        if existing is not None:
            # Repairing beside a live head: Ray may still list the lost nodes' old registrations
            # as alive for a few seconds; remember them so the wait never takes one for the new node.
            ray = rc.ray_driver(spec, bringup.token_env)
            stale = {n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] in {m.ip for m in to_start}}
        for node in to_start:
            bringup.start_ray(node)
        ray = rc.ray_driver(spec, bringup.token_env)
        try:
            alive = rc.wait_for_nodes(spec, ray, reporter, ignore=stale)
            versions = rc.verify_nodes(spec, ray, alive, reporter)
            hotfix = rc.hotfix_all(spec, ray, alive, reporter)
        finally:
            rc.ray_shutdown(ray)
    except BaseException:
        problems = bringup.rollback()
        for problem in problems:
            reporter.warn(f"rollback: {problem}")
        raise
    if existing is None:
        state = rc.new_state(spec, bringup)
    else:
        state = existing
        state.nodes = [bringup.records.get(n.name) or existing.node(n.name) for n in spec.nodes]
    state.versions, state.hotfix = versions, hotfix
    save_state(spec.state_dir, state)
    matrix = rc.Matrix({row: {name: r.get(row) for name, r in versions.items()} for row in rc.VERSION_ROWS})
    return UpResult(state, repair, matrix.lines([n.name for n in spec.nodes]))


def cluster_down(spec: ClusterSpec, reporter: rc.Reporter) -> list[str]:
    """Stop what we started on every node; returns the nodes that could not be reached."""
    ensure_state_dir(spec.state_dir)
    with state_lock(spec.state_dir):
        return cluster_down_locked(spec, reporter)


def cluster_down_locked(spec: ClusterSpec, reporter: rc.Reporter) -> list[str]:
    state = load_state(spec.state_dir)
    if state is None:
        reporter.phase("nothing to stop: no cluster started from this state folder")
        return []
    unreachable = []
    for node in reversed(spec.nodes):
        record = state.node(node.name)
        if record is None:
            continue
        try:
            answer = rc.stop_node(node, record)
            reporter.phase(f"{node.label}: stopped {len(answer['stopped'])} process(es)")
            if answer["left"]:
                unreachable.append(node.name)
                reporter.warn(f"{node.label}: pids {answer['left']} did not stop")
        except rc.ClusterFailure as exc:
            unreachable.append(node.name)
            reporter.warn(str(exc))
    if not unreachable:
        clear_state(spec.state_dir)
    return unreachable


def cluster_status(spec: ClusterSpec) -> dict:
    """The cluster view for `status`: a stable, documented JSON shape."""
    state = load_state(spec.state_dir)
    busy = _lock_busy(spec)
    nodes = []
    details: dict[str, str] = {}
    health = node_health(spec, state, details)
    for node in spec.nodes:
        record = state.node(node.name) if state else None
        versions = (state.versions.get(node.name) if state else None) or {}
        hotfix = (state.hotfix.get(node.name) if state else None) or {}
        nodes.append({
            "name": node.name, "ip": node.ip, "ssh_host": node.ssh_host,
            "reachable": health[node.name] != "unreachable",
            "ray_alive": health[node.name] == "alive",
            "registered_ip": None, "gpus": None,
            "pids": [p["pid"] for p in rc.core_processes(record)] if record else [],
            "versions": versions,
            "hotfix": (hotfix.get("status") or {}).get("state"),
        })
    alive = [n for n in nodes if n["ray_alive"]]
    if busy:
        overall = "starting"
    elif not alive:
        overall = "down"
    elif len(alive) == len(nodes):
        overall = "up"
    else:
        overall = "degraded"
    if alive and nodes[0]["ray_alive"]:
        _add_ray_view(spec, nodes)
        if overall == "up" and any(n["registered_ip"] != n["ip"] for n in nodes):
            overall = "degraded"
    problems = []
    if state and overall in ("up", "degraded"):
        for node in nodes:
            label = f"{node['name']} ({node['ip']})"
            if not node["reachable"]:
                problems.append(f"{label}: unreachable ({details.get(node['name'], 'no answer')}); "
                                f"check the fabric link and SSH to {node['ssh_host']}")
            elif not node["ray_alive"]:
                problems.append(f"{label}: Ray is down (its raylet is gone); `dspark logs --node {node['name']}`, "
                                "then `dspark restart`")
            elif node["registered_ip"] not in (None, node["ip"]):
                problems.append(f"{label}: Ray does not list this node at its fabric IP")
    return {"state": overall, "ray_address": spec.ray_address, "config_digest": state.config_digest if state else None,
            "started_at": state.started_at if state else None, "nodes": nodes, "problems": problems,
            "checked_at": time.time()}


RAY_VIEW_TIMEOUT_S = 20


def _add_ray_view(spec: ClusterSpec, nodes: list[dict]) -> None:
    """Registered IP and GPUs per node from Ray itself (skipped if the head does not answer in time)."""
    code = ("import json,ray;ray.init(address=%r,logging_level='ERROR',log_to_driver=False);"
            "print(json.dumps([{'ip':n['NodeManagerAddress'],'alive':n['Alive'],"
            "'gpus':n.get('Resources',{}).get('GPU',0)} for n in ray.nodes()]))") % spec.ray_address
    env = {**os.environ, **rc.auth_env(spec)}
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=RAY_VIEW_TIMEOUT_S, env=env)
        seen = {n["ip"]: n for n in json.loads(out.stdout.strip().splitlines()[-1]) if n["alive"]}
    except Exception:
        return
    for node in nodes:
        if node["ip"] in seen:
            node["registered_ip"], node["gpus"] = node["ip"], seen[node["ip"]]["gpus"]
        elif node["ray_alive"]:
            node["ray_alive"] = False


def _lock_busy(spec: ClusterSpec) -> bool:
    return lock_holder(spec.state_dir) is not None
