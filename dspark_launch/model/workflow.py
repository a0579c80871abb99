"""The model commands end to end (launcher side): what `dspark model pull|verify|status` and the
start pre-flight call. Node operations come in as NodeModelOps (the agent), workers as SSH targets."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dspark_launch.node.manifest import Manifest, read_manifest
from dspark_launch.node.model_files import VerifyReport
from dspark_launch.node.model_paths import path_problem

from .copy import SSHTarget
from .distribute import DiskCheck, DiskMargin, NodeModelOps, WorkerSync, check_disk, sync_worker
from .hub import HubSource, list_model, pull
from .local_model import prepare_local_counted
from .location import ModelLocation, hub_cache_location


@dataclass(frozen=True)
class Worker:
    target: SSHTarget  # how the head's rsync reaches it
    ops: NodeModelOps  # its node-side checks


@dataclass(frozen=True)
class Placement:
    location: ModelLocation
    manifest: Manifest
    disk: tuple[DiskCheck, ...]  # head first, then the workers
    refetched: tuple[str, ...]  # head files fetched again after failing the hub's checksum
    workers: tuple[WorkerSync, ...]
    hashed_bytes: int = 0  # bytes the head hashed (0 on a re-pull of an unchanged model)


def _sync_all(
    location: ModelLocation,
    manifest: Manifest,
    workers: Sequence[Worker],
    streams: int,
    margin: DiskMargin,
    progress: Callable[[str], None] | None = None,
    full: bool = False,
    checks: Sequence[DiskCheck] = (),
    checked_files: Manifest | None = None,
) -> tuple[WorkerSync, ...]:
    """Every worker at once. `checks` (in worker order), the disk checks just made against
    `checked_files`, are reused when that lists the same files and sizes as `manifest` (else each
    worker is checked again)."""
    reuse = checked_files is not None and _same_files(checked_files, manifest) and len(checks) == len(workers)
    pairs = list(zip(workers, checks if reuse else [None] * len(workers)))
    with ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:
        return tuple(
            pool.map(
                lambda pair: sync_worker(
                    location, manifest, pair[0].target, pair[0].ops, streams, margin, progress, full, pair[1]
                ),
                pairs,
            )
        )


def _same_files(a: Manifest, b: Manifest) -> bool:
    return [(f.path, f.size) for f in a.files] == [(f.path, f.size) for f in b.files]


def pull_everywhere(
    source: HubSource,
    head: NodeModelOps,
    workers: Sequence[Worker],
    streams: int = 4,
    margin: DiskMargin = DiskMargin(),
    tqdm_class=None,
    progress: Callable[[str], None] | None = None,
    verify: bool = False,
) -> Placement:
    """List, check every node's disk (nothing written when one is short), download on the head,
    check against the hub, copy to every worker and verify there. `verify`: hash every file on every
    node, unchanged or not."""
    listing = list_model(source)
    location = hub_cache_location(source.cache_dir, listing.repo_id, listing.commit)
    expected = listing.expected()
    disk = check_disk(location, expected, [head, *(w.ops for w in workers)], margin)
    pulled = pull(source, listing, tqdm_class, verify, progress)
    return Placement(
        location,
        pulled.manifest,
        tuple(disk),
        pulled.refetched,
        _sync_all(location, pulled.manifest, workers, streams, margin, progress, verify, disk[1:], expected),
        pulled.hashed_bytes,
    )


def place_local(
    folder: str,
    head: NodeModelOps,
    workers: Sequence[Worker],
    streams: int = 4,
    margin: DiskMargin = DiskMargin(),
    rehash: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Placement:
    """DSPARK_MODEL as a folder: the head's folder hashed into a manifest, copied and verified the same way
    (`rehash`: every file hashed on every node, unchanged or not)."""
    location, manifest, hashed = prepare_local_counted(folder, rehash, progress)
    disk = check_disk(location, manifest, [head, *(w.ops for w in workers)], margin)
    return Placement(
        location,
        manifest,
        tuple(disk),
        (),
        _sync_all(location, manifest, workers, streams, margin, progress, rehash, disk[1:], manifest),
        hashed,
    )


def pulled_model(source: HubSource) -> tuple[ModelLocation, Manifest] | None:
    """The head's pulled copy of `source` without the network: the revision's ref (or the commit
    itself) in the cache, and the manifest written by the pull. None when never pulled."""
    root = Path(source.cache_dir) / ("models--" + source.repo_id.replace("/", "--"))
    ref = root / "refs" / (source.revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else source.revision
    if not commit or path_problem(commit) or "/" in commit:  # one folder name under snapshots/
        return None
    location = hub_cache_location(source.cache_dir, source.repo_id, commit)
    manifest = read_manifest(Path(location.folder))
    return (location, manifest) if manifest is not None else None


def check_everywhere(
    location: ModelLocation, manifest: Manifest, nodes: Sequence[NodeModelOps], full: bool
) -> list[tuple[str, VerifyReport]]:
    """`dspark model verify` (full) or the per-node part of `status` (sizes); pair with
    distribute.require_ready for the start pre-flight, or agent.model_files.fast_check through the agent."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return list(zip((n.name for n in nodes), pool.map(lambda n: n.verify(location.folder, manifest, full), nodes)))
