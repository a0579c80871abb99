"""`dspark plan`: what `start` would run on each node, and why, with nothing started.

The head's agent (a local child, never a network address) reads the installed vLLM
and the head's sysfs and memory; each worker is asked for its fabric and memory,
unless its address is the example file's placeholder or it cannot be reached: then
it is in the plan as not probed. Every probed node's scheduler gets the hotfix's own
check (read-only, `hotfix_check`), so a node whose scheduler start's apply would refuse
is a refusal here too. Nothing is written (a Ray token that start would generate shows
as set).
"""

from __future__ import annotations

from dataclasses import replace

from dspark_launch.agent.protocol import (
    HotfixCheck,
    HotfixCheckAnswer,
    HotfixResult,
    MemoryAnswer,
    MemoryQuery,
    VersionQuery,
)
from dspark_launch.cluster import platform_check
from dspark_launch.cluster import ray_cluster as rc
from dspark_launch.cluster.hotfix_rollout import OFF_LINE, what_to_do
from dspark_launch.cluster.parallel import Background, on_each
from dspark_launch.cluster.spec import ClusterSpec, Node, cluster_spec, placeholder
from dspark_launch.config.profile_resolve import resolve_selected
from dspark_launch.config.settings import Settings
from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.model.onnodes import placed_weights, pulled_config, wanted_model
from dspark_launch.node.fabric import FabricEnv
from dspark_launch.node.platform import judge
from dspark_launch.node.ray_dirs import shown_private_root
from dspark_launch.node.values import PlatformFacts, VersionRow
from dspark_launch.node.versions import modules_of
from dspark_launch.node.vllm_releases import policy_line, untested_note
from dspark_launch.profiles.gpu import GpuTarget, gpu_target
from dspark_launch.report import Reporter
from dspark_launch.serve.memory_preflight import estimate, kv_size_fixed
from dspark_launch.serve.plan_report import (
    NOT_PROBED_EXAMPLE,
    NodePlan,
    Plan,
    env_entries,
    not_probed,
    profile_decisions,
)
from dspark_launch.serve.serve_spec import ServeSpec, build_serve_spec
from dspark_launch.serve.status import image_warnings

GENERATED = "generated at start"


def _probe(
    spec: ClusterSpec, node: Node
) -> tuple[FabricEnv, MemoryAnswer, VersionRow, HotfixCheckAnswer, PlatformFacts] | str:
    """The node's fabric environment, memory, version row (GPU compute capability, driver, packages), the
    hotfix's check of its scheduler and its platform (kernel, driver, firmware), or why it was not probed."""
    try:
        return (
            rc.node_fabric(spec, node),
            node.agent().call(MemoryQuery()),
            node.agent().call(VersionQuery()),
            node.agent().call(HotfixCheck()),
            platform_check.node_platform(spec, node),
        )
    except ConfigError:
        raise
    except DsparkError as exc:
        return f"not probed: {exc}"


def _node_plan(
    spec: ClusterSpec, node: Node, fabric: FabricEnv, ray_env: dict[str, str], serve: ServeSpec | None
) -> NodePlan:
    own = dict(fabric.env)
    ray = {k: v for k, v in rc.node_env(spec, node, ray_env, fabric).items() if k not in own}
    # The folder the node's agent prepares at start (`ray_temp_dir`), shown for this user's id.
    temp_dir = f"{shown_private_root()}/{rc.ray_temp_dir_name(spec, node)}"
    commands = [tuple(rc.ray_start_argv(spec, node, temp_dir))]
    env = env_entries(fabric.env, "ray start: fabric (sysfs)") + env_entries(sorted(ray.items()), "ray start")
    if serve is not None:
        commands.append(tuple(serve.argv))
        env += env_entries(sorted(serve.full_env().items()), "vllm serve")
    return NodePlan(
        node=node.name,
        address=node.ip,
        probed=True,
        status="probed",
        commands=tuple(commands),
        env=env,
        fabric_notes=fabric.notes,
        warnings=fabric.warnings,
    )


def hotfix_setting_line(settings: Settings) -> str:
    source = settings.source_of("dspark_hotfix")
    if settings.dspark_hotfix == "off":
        return f"scheduler hotfix: OFF (DSPARK_HOTFIX=off from {source}): {OFF_LINE.split(': ', 1)[1]}"
    return (
        f"scheduler hotfix: required (DSPARK_HOTFIX, {source}): start applies and verifies it on every node "
        "and refuses a vLLM it cannot patch"
    )


def hotfix_verdict(mode: str, label: str, check: HotfixResult) -> tuple[str, str | None]:
    """(the node's line, start's refusal or None) from the hotfix's read-only check of its scheduler: the verdict
    start reaches with DSPARK_HOTFIX `mode` (cluster/hotfix_rollout.py)."""
    version = check.vllm_version or "unknown"
    if mode == "off":
        if check.state == "damaged":
            return (
                f"{label}: {check.state}",
                f"hotfix: {label}: vLLM {version}: DSPARK_HOTFIX=off, but its "
                f"scheduler keeps this hotfix's code ({check.message}); start refuses this: {what_to_do(check)}",
            )
        if check.applied_patch_version is not None:
            return (
                f"{label}: start reverts the hotfix an earlier start left (patch v{check.applied_patch_version}) "
                f"and serves vLLM {version}'s own scheduler"
            ), None
        if check.state == "foreign":
            return f"{label}: its scheduler carries another patch, served as it is: {check.message}", None
        return f"{label}: vLLM {version}'s own scheduler, served as installed", None
    if check.code == 0:
        return f"{label}: {check.state}: start can apply patch v{check.patch_version} (vLLM {version})", None
    return (
        f"{label}: refused ({check.state})",
        f"hotfix: {label}: vLLM {version}: {check.message}; start refuses this (exit 1): {what_to_do(check)}",
    )


def _nodes_gpu(found: dict, forced: GpuTarget | None) -> GpuTarget:
    """What the probed nodes report (capability, driver, packages); `forced` (`--gpu`) replaces the capability
    as if every node reported it, the packages still the nodes' own."""
    rows = {name: probe[2] for name, probe in found.items() if not isinstance(probe, str)}
    packages = {name: modules_of(row.packages) for name, row in rows.items()}
    if forced is not None:
        reported = gpu_target({}, packages=packages)
        return replace(forced, packages=reported.packages, lacking=reported.lacking)
    return gpu_target(
        {name: row.compute_capability for name, row in rows.items()},
        {name: row.driver for name, row in rows.items()},
        packages,
    )


def build_plan(settings: Settings, reporter: Reporter, forced: GpuTarget | None = None) -> Plan:
    """The plan; ConfigError (exit 2) for what start would refuse as configuration. `forced`: `dspark plan --gpu`,
    every node judged as if it reported that compute capability."""
    spec = cluster_spec(settings, placeholders_ok=True)
    dialled = [n for n in spec.workers if not placeholder(settings, "dspark_worker_hosts")]
    reporter.phase(f"asking {', '.join(n.label for n in (spec.head, *dialled))}")
    probes = Background(lambda: on_each((spec.head, *dialled), lambda node: _probe(spec, node)))
    placed = placed_weights(wanted_model(settings))
    offer = spec.head.agent(reporter).describe_vllm(pulled_config(placed.folder if placed else None))
    found = probes.result()
    head = found["head"]
    if isinstance(head, str):
        raise DsparkError(f"{spec.head.label}: {head}")
    gpu = _nodes_gpu(found, forced)
    resolved = resolve_selected(offer, settings, gpu)
    token = spec.auth_token or GENERATED
    ray_env = {"RAY_AUTH_MODE": spec.auth_mode, **({"RAY_AUTH_TOKEN": token} if spec.auth_mode == "token" else {})}
    serve = build_serve_spec(settings, spec, ray_env, resolved, head[0])
    nodes, memory, refusals = [], {}, list(resolved.unjudged)  # a decision the dry boot could not judge
    hotfix = [hotfix_setting_line(settings)]
    for node in spec.nodes:
        probe = found.get(node.name, NOT_PROBED_EXAMPLE)
        if isinstance(probe, str):
            nodes.append(not_probed(node.name, node.ip, probe))
            continue
        nodes.append(_node_plan(spec, node, probe[0], ray_env, serve if node.is_head else None))
        memory[node.name] = probe[1]
        if not probe[0].roce and not spec.allow_tcp_fabric:
            refusal = (
                f"fabric: {node.label}: {probe[0].missing}: start refuses this (exit 2) unless "
                "DSPARK_ALLOW_TCP_FABRIC=1"
            )
            refusals.append(refusal)
            nodes[-1] = replace(nodes[-1], refusals=(refusal,))
        line, refused = hotfix_verdict(settings.dspark_hotfix, node.label, probe[3].check)
        hotfix.append(line)
        note = untested_note(node.label, probe[2].vllm or "")
        if refused:
            refusals.append(refused)
            nodes[-1] = replace(nodes[-1], refusals=nodes[-1].refusals + (refused,))
        if note:
            nodes[-1] = replace(nodes[-1], warnings=nodes[-1].warnings + (note,))
    found_memory = estimate(
        serve.profile,
        placed,
        serve.kv_cache_dtype,
        serve.max_model_len,
        serve.tensor_parallel_size,
        serve.gpu_memory_utilization,
        memory,
        kv_size_fixed(serve.serve_args, serve.full_env()),
        serve.vllm_version,
        serve.serve_args,
    )
    by_node = {f.node: f for f in found_memory.findings}
    too_big = {
        f.node: f"memory: {f.problem}: start refuses this without --force; {f.fix}"
        for f in found_memory.findings
        if not f.fits
    }
    nodes = [
        replace(n, memory=by_node.get(n.node), refusals=n.refusals + tuple(filter(None, [too_big.get(n.node)])))
        for n in nodes
    ]
    warnings = [w for n in nodes for w in n.warnings] + refusals + list(too_big.values())
    warnings += image_warnings(settings)
    warnings += [OFF_LINE] if settings.dspark_hotfix == "off" else []
    platform = judge(
        platform_check.labelled(spec, {name: probe[4] for name, probe in found.items() if not isinstance(probe, str)})
    )
    refusals += platform.refusals  # start refuses them with exit 2, and so does plan (Plan.platform_refused)
    warnings += platform.lines()
    return Plan(
        profile=resolved.profile,
        vllm_version=resolved.vllm_version,
        env_file=settings.env_file_shown,
        from_example=settings.from_example,
        decisions=profile_decisions(resolved),
        nodes=tuple(nodes),
        memory=found_memory,
        warnings=tuple(warnings),
        refusals=(*_start_refusals(settings, nodes), *refusals, *too_big.values()),
        judged_for=gpu.basis,
        cuda_graph_mode=resolved.cuda_graph_mode,
        hotfix=tuple(hotfix),
        vllm_policy=policy_line(),
    )


def _start_refusals(settings: Settings, nodes: list[NodePlan]) -> list[str]:
    """What `start` would refuse before asking any node: placeholders; and a node the plan could not ask."""
    from dspark_launch.config.placeholders import placeholder_error, placeholders

    found = placeholders(settings)
    return ([placeholder_error(found)] if found else []) + [
        f"{n.node} ({n.address}): {n.status}" for n in nodes if not n.probed and n.status != NOT_PROBED_EXAMPLE
    ]
