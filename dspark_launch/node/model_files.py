"""Checks that run on each node (stdlib only; the agent calls them): verify, fast check, free space."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .manifest import MANIFEST_NAME, Manifest, ManifestFile, read_manifest
from .model_paths import check_all_inside, open_regular
from .values import (  # noqa: F401 (the values' home)
    CORRUPT,
    MISSING,
    OVERSIZED,
    PARTIAL,
    SPECIAL,
    STALE,
    DiskSpace,
    FileProblem,
    NodePlacement,
    VerifyReport,
)

_CHUNK = 8 << 20
# Pure tensor files (no code, no pickle): sized at every start, hashed by `dspark model verify`.
TENSOR_ONLY = (".safetensors", ".gguf")


def sha256_file(path: Path, limit: int | None = None, on_bytes: Callable[[int], None] | None = None) -> str:
    """sha256 of regular file `path` (OSError for anything else: a FIFO or device is never read); with
    `limit`, "" when it holds more than `limit` bytes (read no further). Its pages are dropped from the
    page cache afterwards (posix_fadvise DONTNEED), so verifying 160 GB does not fill a unified-memory
    node's cache just before vLLM sizes its memory."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as handle:
        if limit is None:
            limit = os.fstat(fd).st_size
        digest, read = hashlib.sha256(), 0
        while read <= limit and (chunk := handle.read(min(_CHUNK, limit + 1 - read))):
            digest.update(chunk)
            read += len(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return "" if read > limit else digest.hexdigest()


def hash_workers() -> int:
    """Files hashed at once: one per core (sha256 runs outside the GIL), at most 16."""
    return max(1, min(16, os.cpu_count() or 1))


def hash_files(
    paths: Sequence[Path],
    workers: int = 0,
    on_bytes: Callable[[int], None] | None = None,
    limits: Sequence[int] | None = None,
) -> list[str]:
    """sha256 of every path, several files at once (bounded by cores), in the order given; with
    `limits`, each read no further than its limit ("" for a file longer than that: see sha256_file)."""
    if not paths:
        return []
    bounds = list(limits) if limits is not None else [None] * len(paths)
    with ThreadPoolExecutor(max_workers=workers or hash_workers()) as pool:
        return list(pool.map(lambda pair: sha256_file(pair[0], pair[1], on_bytes), zip(paths, bounds)))


@dataclass
class HashProgress:
    """Bytes hashed so far on a node, reported as one line every `every_s` seconds (thread-safe)."""

    node: str
    total_bytes: int
    report: Callable[[str], None]
    every_s: float = 5.0
    done: int = 0
    _started: float = field(default_factory=time.monotonic)
    _last: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, count: int) -> None:
        with self._lock:
            self.done += count
            now = time.monotonic()
            if now - self._last >= self.every_s:
                self._last = now
                rate = self.done / max(now - self._started, 1e-6)
                self.report(
                    f"{self.node}: sha256 {self.done / (1 << 30):.2f} of {self.total_bytes / (1 << 30):.2f} GiB "
                    f"({rate / 1e6:.0f} MB/s)"
                )


def _size_problem(folder: Path, entry: ManifestFile) -> FileProblem | None:
    try:
        st = (folder / entry.path).stat()  # follows the hub cache's symlinks to blobs
    except OSError:
        return FileProblem(entry.path, MISSING, entry.size, -1)
    if not stat.S_ISREG(st.st_mode):
        return FileProblem(entry.path, SPECIAL, entry.size, -1)
    size = st.st_size
    if size < entry.size:
        return FileProblem(entry.path, PARTIAL, entry.size, size)
    if size > entry.size:
        return FileProblem(entry.path, OVERSIZED, entry.size, size)
    return None


def _hash_problem(
    folder: Path, entry: ManifestFile, on_bytes: Callable[[int], None] | None = None
) -> FileProblem | None:
    try:
        digest = sha256_file(folder / entry.path, entry.size, on_bytes)
    except OSError:
        return FileProblem(entry.path, MISSING, entry.size, -1)
    return None if digest == entry.sha256 else FileProblem(entry.path, CORRUPT, entry.size, entry.size)


def verify_model(
    folder: str,
    manifest: Manifest,
    full: bool = True,
    workers: int = 0,
    only: Sequence[str] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Every manifest file in `folder`: size, and with `full` its sha256 (several files hashed at once,
    bounded by cores); `only`: the sha256 of those files alone (what a copy just sent), sizes of all."""
    root = Path(folder)
    check_all_inside(root, (f.path for f in manifest.files), f"model check of {folder}")
    problems = [p for p in (_size_problem(root, f) for f in manifest.files) if p]
    hashed = 0
    if full:
        bad = {p.path for p in problems}
        wanted = set(only) if only is not None else None
        todo = [f for f in manifest.files if f.path not in bad and f.sha256 and (wanted is None or f.path in wanted)]
        with ThreadPoolExecutor(max_workers=workers or hash_workers()) as pool:
            problems += [p for p in pool.map(lambda f: _hash_problem(root, f, on_bytes), todo) if p]
        hashed = sum(f.size for f in todo)
    order = {f.path: i for i, f in enumerate(manifest.files)}
    problems.sort(key=lambda p: order[p.path])
    return VerifyReport(str(root), full, len(manifest.files), hashed, tuple(problems))


def fast_check(folder: str, expected_stamp: str) -> VerifyReport:
    """The pre-start check: this node's manifest has `expected_stamp` (it was verified here after the
    pull or copy), every file it lists has its size, and every file but the tensor shards (the code,
    configs and tokenizer vLLM runs and reads: small) has its sha256. No reads of the weights."""
    local = read_manifest(Path(folder))
    if local is None or local.stamp != expected_stamp:
        return VerifyReport(str(folder), False, 0, 0, (FileProblem(MANIFEST_NAME, STALE, 0, -1),))
    sizes = verify_model(folder, local, full=False)
    if not sizes.ok:
        return sizes
    small = [f for f in local.files if f.sha256 and not f.path.endswith(TENSOR_ONLY)]
    problems = tuple(p for p in (_hash_problem(Path(folder), f) for f in small) if p)
    return VerifyReport(str(folder), False, len(local.files), sum(f.size for f in small), problems)


def placement(folder: str, root: str, manifest: Manifest) -> NodePlacement:
    """Before a copy: sizes (no reads of the weights), free space under `root`, this node's manifest stamp."""
    local = read_manifest(Path(folder))
    return NodePlacement(
        verify_model(folder, manifest, full=False), free_space(root), local.stamp if local is not None else ""
    )


def free_space(path: str) -> DiskSpace:
    """Free bytes (for an unprivileged writer) on the filesystem that holds or would hold `path`."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    stats = os.statvfs(probe)
    return DiskSpace(str(path), str(probe), stats.f_bavail * stats.f_frsize)
