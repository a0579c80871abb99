"""The model commands on the configured cluster (launcher side): which model the settings ask for,
each node's checks through its agent, and what `dspark model pull|verify|status` and the start
pre-flight call. Every node is reached through its agent, the head included."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.protocol import ModelFastCheck, ModelPlacementQuery, ModelVerify
from dspark_launch.node.manifest import Manifest, read_manifest
from dspark_launch.node.model_files import NodePlacement, VerifyReport

from .copy import SSHTarget
from .distribute import require_ready
from .errors import ModelIncomplete
from .hub import HubSource, hub_source, is_local_folder
from .location import ModelLocation, local_location
from .workflow import Placement, Worker, check_everywhere, place_local, pull_everywhere, pulled_model

PULL_FIX = "dspark model pull"


@dataclass(frozen=True)
class AgentModelOps:
    """`distribute.NodeModelOps` over one node's agent (agent.model_files runs on that node)."""

    name: str
    agent: NodeAgent
    caches: tuple[str, ...] = ()  # checked there with the model folder (DSPARK_CONTAINER_MODEL_CACHE)

    def placement(self, folder: str, root: str, manifest: Manifest) -> NodePlacement:
        return self.agent.call(ModelPlacementQuery(folder, root, manifest, self.caches))

    def verify(self, folder: str, manifest: Manifest, full: bool, only: tuple[str, ...] | None = None) -> VerifyReport:
        return self.agent.call(ModelVerify(folder, manifest, full, only, self.caches))

    def fast_check(self, folder: str, stamp: str) -> VerifyReport:
        return self.agent.call(ModelFastCheck(folder, stamp, self.caches))


@dataclass(frozen=True)
class WantedModel:
    """The model the settings (and the selected profile) serve: a hub repo at a revision, or a folder."""

    name: str  # DSPARK_MODEL as given
    revision: str  # the profile's pin or DSPARK_MODEL_REVISION; "" for a folder
    source: HubSource | None  # None for a local folder
    streams: int

    @property
    def local(self) -> bool:
        return self.source is None


@dataclass(frozen=True)
class ModelWeights:
    """The weights as a manifest states them, for the memory pre-flight: no lookup and no read of its own."""

    folder: str  # the model folder, the same path on every node (config.json beside the weights)
    size_bytes: int  # the safetensors files when there are any, else every file


def manifest_weights(location: ModelLocation, manifest: Manifest) -> ModelWeights:
    shards = [f.size for f in manifest.files if f.path.endswith(".safetensors")]
    return ModelWeights(location.folder, sum(shards) if shards else manifest.total_size)


@dataclass(frozen=True)
class ServingModel:
    """A model verified on every node: how `vllm serve` and the Ray workers load it with the hub offline."""

    location: ModelLocation
    manifest: Manifest
    env: tuple[tuple[str, str], ...]  # HF_HUB_OFFLINE=1 (+ HF_HUB_CACHE for a hub model)
    revision: str  # the pulled commit for --revision; "" for a folder
    reports: tuple[tuple[str, VerifyReport], ...]
    seconds: float  # the check's wall time

    @property
    def weights(self) -> ModelWeights:
        """What every node was just checked to hold."""
        return manifest_weights(self.location, self.manifest)


def wanted_model(settings, environ: Mapping[str, str] | None = None) -> WantedModel:
    """From the resolved settings: DSPARK_MODEL and the revision by the profile's rule, the cache, the token."""
    from dspark_launch.config.profile_resolve import served_model

    environ = dict(os.environ if environ is None else environ)
    if settings.hf_token:
        environ["HF_TOKEN"] = settings.hf_token
    model, revision = served_model(settings)
    streams = settings.dspark_model_copy_streams
    if is_local_folder(model):
        return WantedModel(model, "", None, streams)
    source = hub_source(
        model,
        revision,
        settings.dspark_model_cache,
        environ,
        token_to_endpoint=settings.dspark_hub_token_to_endpoint,
        proxy=settings.dspark_hub_proxy,
        trusted_http=settings.dspark_hub_trusted_http_endpoint,
    )
    return WantedModel(model, revision, source, streams)


def require_mounted(settings, spec) -> None:
    """With a container runtime, the weights vLLM is told to read must lie inside the host folder mounted
    into every container (DSPARK_CONTAINER_MODEL_CACHE): ConfigError (exit 2) naming both settings."""
    if not spec.containers:
        return
    from dspark_launch.errors import ConfigError
    from dspark_launch.node.safe_path import within

    wanted = wanted_model(settings)
    field = "dspark_model" if wanted.local else "dspark_model_cache"
    served = os.path.abspath(os.path.expanduser(wanted.name if wanted.local else wanted.source.cache_dir))
    mounted = os.path.abspath(spec.containers.model_cache)
    if not within(served, mounted):
        entry, mount = settings.entry(field), settings.source_of("dspark_container_model_cache")
        raise ConfigError(
            f"{entry.name}={served} ({entry.source}) is not inside DSPARK_CONTAINER_MODEL_CACHE={mounted} "
            f"({mount}), the host folder mounted into the containers; allowed: a path inside it"
        )


def node_ops(spec, reporter=None) -> list[AgentModelOps]:
    """Every node's checks through its agent (with a container runtime: inside the running containers)."""
    caches = model_caches(spec)
    return [AgentModelOps(node.label, node.agent(reporter), caches) for node in spec.nodes]


def model_caches(spec) -> tuple[str, ...]:
    """The container model cache, checked on every node with the model folder (agent.model_folder)."""
    return (spec.containers.model_cache,) if spec.containers and spec.containers.model_cache else ()


def where_weights_live(spec, reporter=None) -> list[AgentModelOps]:
    """The model commands' node checks, on the host folder that holds the weights, whether or not the
    node containers are up: the nodes' own agents on hosts; with a container runtime, the head's in the
    launcher's Python and each worker's in a `--rm` container from the checked image."""
    if not spec.containers:
        return node_ops(spec, reporter)
    from dspark_launch.agent.client import NodeAgent
    from dspark_launch.cluster.containers import model_transports

    transports = model_transports(spec)
    caches = model_caches(spec)
    return [
        AgentModelOps(node.label, NodeAgent(node.label, transports[node.name], reporter), caches) for node in spec.nodes
    ]


def copy_target(node) -> SSHTarget:
    """How the head's rsync reaches a worker: its copy address (the fabric IP by default), the agent's SSH settings."""
    from dspark_launch.cluster.spec import copy_ssh

    return SSHTarget.from_transport(copy_ssh(node))


def _workers(spec, ops: list[AgentModelOps]) -> list[Worker]:
    return [Worker(copy_target(node), op) for node, op in zip(spec.workers, ops[1:])]


def pull(wanted: WantedModel, spec, reporter=None, tqdm_class=None, verify: bool = False) -> Placement:
    """`dspark model pull`: every node's disk checked first, the head's pull (or the local folder's
    manifest), the copy to every worker and its verify there."""
    ops = where_weights_live(spec, reporter)
    from dspark_launch.report import PhaseLines

    progress = PhaseLines(reporter) if reporter is not None else None
    if wanted.local:
        return place_local(
            str(Path(wanted.name).expanduser()),
            ops[0],
            _workers(spec, ops),
            wanted.streams,
            rehash=verify,
            progress=progress,
        )
    return pull_everywhere(
        wanted.source,
        ops[0],
        _workers(spec, ops),
        wanted.streams,
        tqdm_class=tqdm_class,
        progress=progress,
        verify=verify,
    )


def placed(wanted: WantedModel) -> tuple[ModelLocation, Manifest]:
    """The head's placed copy and its manifest (no network); ModelIncomplete naming the fix when none."""
    if wanted.local:
        location = local_location(str(Path(wanted.name).expanduser()))
        manifest = read_manifest(Path(location.folder))
        if manifest is None:
            raise ModelIncomplete(
                f"head: model folder {location.folder} was never placed on the nodes (no manifest); run `{PULL_FIX}`"
            )
        return location, manifest
    found = pulled_model(wanted.source)
    if found is None:
        rev = f"@{wanted.revision}" if wanted.revision else ""
        raise ModelIncomplete(
            f"head: model {wanted.name}{rev} was never pulled into {wanted.source.cache_dir}; run `{PULL_FIX}`"
        )
    return found


def check(wanted: WantedModel, spec, full: bool, reporter=None) -> list[tuple[str, VerifyReport]]:
    """Every node's files against the head's manifest: `full` sha256 (`verify`), else the fast check
    (this node's manifest stamp and the sizes: `status` and the start pre-flight)."""
    location, manifest = placed(wanted)
    return _check_placed(location, manifest, where_weights_live(spec, reporter), full)


def _check_placed(
    location: ModelLocation, manifest: Manifest, ops: list[AgentModelOps], full: bool
) -> list[tuple[str, VerifyReport]]:
    if full:
        return check_everywhere(location, manifest, ops, True)
    with ThreadPoolExecutor(max_workers=len(ops)) as pool:
        reports = pool.map(lambda op: op.fast_check(location.folder, manifest.stamp), ops)
        return list(zip((op.name for op in ops), reports))


def ready_to_serve(wanted: WantedModel, spec, full: bool = False, reporter=None) -> ServingModel:
    """The start pre-flight: ModelIncomplete (exit 1, nothing started) naming the node, its first bad
    file and `dspark model pull`; else how to serve the verified copy with the hub offline."""
    t0 = time.monotonic()
    location, manifest = placed(wanted)
    reports = _check_placed(location, manifest, node_ops(spec, reporter), full)
    require_ready(reports, PULL_FIX)
    env = [("HF_HUB_OFFLINE", "1")]
    if not wanted.local:
        env.append(("HF_HUB_CACHE", wanted.source.cache_dir))
    return ServingModel(
        location, manifest, tuple(env), "" if wanted.local else manifest.revision, tuple(reports), time.monotonic() - t0
    )


def pulled_config(folder: str | None) -> str:
    """The placed model folder's config.json for the dry boot ("" when not placed or it has none: the
    profile's shipped copy is judged), so `plan` and `start` judge the bytes they will serve."""
    if not folder:
        return ""
    path = Path(folder) / "config.json"
    return str(path) if path.is_file() else ""


def placed_weights(wanted: WantedModel) -> ModelWeights | None:
    """The head's placed copy from its manifest, unchecked on the nodes (`dspark plan`, which starts
    nothing); None when never placed."""
    try:
        return manifest_weights(*placed(wanted))
    except ModelIncomplete:
        return None
