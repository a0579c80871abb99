"""Free-space pre-flight on every node, and placing a verified copy on a worker (launcher side).

Node operations go through `NodeModelOps` (the agent runs agent.model_files' functions on
that node); the copy itself is rsync from the head over SSH.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dspark_launch.node.manifest import Manifest
from dspark_launch.node.model_files import STALE, DiskSpace, NodePlacement, VerifyReport

from .copy import CopyProgress, CopyResult, SSHTarget, effective_streams, rsync_to
from .errors import InsufficientDisk, ModelIncomplete
from .location import ModelLocation


class NodeModelOps(Protocol):
    """The node-side operations, on one node (dspark_launch.node.model_files run there)."""

    name: str

    def placement(self, folder: str, root: str, manifest: Manifest) -> NodePlacement: ...

    def verify(
        self, folder: str, manifest: Manifest, full: bool, only: tuple[str, ...] | None = None
    ) -> VerifyReport: ...

    def fast_check(self, folder: str, stamp: str) -> VerifyReport: ...


@dataclass(frozen=True)
class DiskMargin:
    """Room kept free beyond the model: a share of it, at least a floor (logs, temp files, vLLM caches)."""

    fraction: float = 0.05
    floor_bytes: int = 1 << 30

    def required(self, payload: int) -> int:
        return payload + max(int(payload * self.fraction), self.floor_bytes) if payload else 0


@dataclass(frozen=True)
class DiskCheck:
    node: str
    space: DiskSpace
    payload_bytes: int  # bytes of the model this node still lacks
    required_bytes: int  # payload plus the margin
    sizes: VerifyReport  # the size check the payload was counted from
    verified_stamp: str  # the stamp of the manifest this node last verified ("" never)

    @property
    def ok(self) -> bool:
        return self.space.free_bytes >= self.required_bytes

    def describe(self) -> str:
        gib = 1 << 30
        return (
            f"{self.node}: {self.space.checked} has {self.space.free_bytes / gib:.2f} GiB free, the model needs "
            f"{self.required_bytes / gib:.2f} GiB there ({self.payload_bytes / gib:.2f} GiB of files + margin)"
        )


@dataclass(frozen=True)
class WorkerSync:
    node: str
    copy: CopyResult
    repair: CopyResult | None  # files re-sent after the worker's checksum named them
    # the worker's full verify after the copy (clean); its size check before the copy when nothing
    # was sent to a node that had verified this manifest (nothing to hash)
    report: VerifyReport


def missing_bytes(manifest: Manifest, report: VerifyReport) -> int:
    """Bytes a node still needs, from a size check: every missing, partial or oversized file, whole."""
    sizes = {f.path: f.size for f in manifest.files}
    return sum(sizes.get(p.path, 0) for p in report.problems if p.kind != STALE)


def check_disk(
    location: ModelLocation, manifest: Manifest, nodes: Sequence[NodeModelOps], margin: DiskMargin = DiskMargin()
) -> list[DiskCheck]:
    """Every node's free space against what it lacks of `manifest` (a hub listing before the pull), all
    nodes at once, one agent call each; InsufficientDisk naming each short node, before anything is written."""
    from dspark_launch.cluster.parallel import on_each

    found = on_each(nodes, lambda node: node.placement(location.folder, location.root, manifest))
    checks = []
    for node in nodes:
        state = found[node.name]
        payload = missing_bytes(manifest, state.sizes)
        checks.append(
            DiskCheck(node.name, state.space, payload, margin.required(payload), state.sizes, state.verified_stamp)
        )
    short = [c for c in checks if not c.ok]
    if short:
        raise InsufficientDisk(
            "not enough disk: "
            + "; ".join(c.describe() for c in short)
            + ". Free space there or set DSPARK_MODEL_CACHE to a larger disk; nothing was written"
        )
    return checks


def sync_worker(
    location: ModelLocation,
    manifest: Manifest,
    target: SSHTarget,
    node: NodeModelOps,
    streams: int = 4,
    margin: DiskMargin = DiskMargin(),
    progress: Callable[[str], None] | None = None,
    full: bool = False,
    checked: DiskCheck | None = None,
) -> WorkerSync:
    """Free-space check (`checked`: the one the caller just made of this node for the same files), copy
    what is missing or differs, sha256 there of what the copy sent (of every file when `full`, or when
    this node never verified this manifest), re-send what the verify names (once), then the manifest
    last: its presence with the right stamp means verified here. A node already verified whose sizes
    were all right and that is sent nothing gets nothing more: no hashing, no manifest, no further call.
    `progress` gets a line (bytes, rate, ETA) every few seconds of the copy."""
    if checked is None:
        checked = check_disk(location, manifest, [node], margin)[0]
    # This manifest was verified here before (sizes may have changed since: rsync re-sends those).
    verified_before = not full and checked.verified_stamp == manifest.stamp
    streams = effective_streams(streams)
    meter = CopyProgress(node.name, checked.payload_bytes, progress) if progress else None
    copy = rsync_to(
        target, location.root, location.storage_paths(manifest) + location.ref_paths(), streams, progress=meter
    )
    only = sent_files(location, manifest, copy.files_sent) if verified_before else None
    if only == () and not copy.files_sent and checked.sizes.ok:
        # rsync compared every file's size and mtime and sent nothing; the sizes matched the manifest
        # this node verified: there is nothing to hash and nothing to write.
        return WorkerSync(node.name, copy, None, checked.sizes)
    report = node.verify(location.folder, manifest, True, only)
    repair = None
    if report.bad_paths:
        repair = rsync_to(
            target, location.root, location.storage_paths(manifest, report.bad_paths), streams, force=True
        )
        report = node.verify(location.folder, manifest, True, report.bad_paths)
    if not report.ok:
        raise ModelIncomplete(
            f"{node.name}: {report.problems[0].describe()} in {location.folder} after the copy "
            f"({len(report.problems)} file(s) bad)"
        )
    if not (verified_before and only == () and repair is None):
        rsync_to(target, location.root, [location.manifest_path], 1, force=True)
    return WorkerSync(node.name, copy, repair, report)


def sent_files(location: ModelLocation, manifest: Manifest, sent: Sequence[str]) -> tuple[str, ...]:
    """The manifest files (model-folder paths) whose file or blob is among `sent` (root-relative)."""
    sent_set = set(sent)
    return tuple(f.path for f in manifest.files if sent_set & set(location.storage_paths(manifest, (f.path,))))


def require_ready(reports: Sequence[tuple[str, VerifyReport]], fix: str = "dspark model pull") -> None:
    """The start pre-flight: ModelIncomplete naming the first node whose check failed, its first bad
    file and the command that fixes it (exit 1, nothing started)."""
    for node, report in reports:
        if not report.ok:
            others = sum(1 for _, r in reports if not r.ok) - 1
            more = f"; {others} other node(s) too" if others else ""
            raise ModelIncomplete(
                f"{node}: model not ready: {report.problems[0].describe()} "
                f"({len(report.problems)} problem(s) in {report.folder}{more}); run `{fix}`"
            )
