"""Checks that run on each node (stdlib only; the agent calls them): verify, fast check, free space."""

from __future__ import annotations

import hashlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .manifest import MANIFEST_NAME, Manifest, ManifestFile, read_manifest
from .paths import check_all_inside, open_regular, read_bounded

MISSING, PARTIAL, OVERSIZED, CORRUPT, STALE = "missing", "partial", "oversized", "corrupt", "stale"
SPECIAL = "special"  # not a regular file (a FIFO, a device): never read
_CHUNK = 8 << 20
# Pure tensor files (no code, no pickle): sized at every start, hashed by `dspark model verify`.
TENSOR_ONLY = (".safetensors", ".gguf")


@dataclass(frozen=True)
class FileProblem:
    path: str
    kind: str  # missing | partial (too short) | oversized | corrupt (sha256 differs) | stale (manifest) | special
    expected_size: int
    actual_size: int  # -1 when missing

    def describe(self) -> str:
        if self.kind == MISSING:
            return f"{self.path}: missing"
        if self.kind in (PARTIAL, OVERSIZED):
            return f"{self.path}: {self.kind} ({self.actual_size} of {self.expected_size} bytes)"
        if self.kind == SPECIAL:
            return f"{self.path}: not a regular file (never read)"
        if self.kind == STALE:
            return f"{self.path}: no manifest of this model (never verified here, or another revision)"
        return f"{self.path}: corrupt (sha256 differs)"


@dataclass(frozen=True)
class VerifyReport:
    folder: str
    full: bool  # True: sizes and sha256; False: sizes only (plus the stamp for a fast check)
    files_checked: int
    bytes_checked: int  # bytes hashed (0 for size-only checks)
    problems: tuple[FileProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_paths(self) -> tuple[str, ...]:
        return tuple(p.path for p in self.problems if p.kind != STALE)


@dataclass(frozen=True)
class DiskSpace:
    path: str  # the path asked about
    checked: str  # the nearest existing folder, whose filesystem was measured
    free_bytes: int


def sha256_file(path: Path, limit: int | None = None) -> str:
    """sha256 of regular file `path` (OSError for anything else); with `limit`, "" when it holds more
    than `limit` bytes (read no further)."""
    if limit is None:
        fd = open_regular(path)
        limit = os.fstat(fd).st_size
        os.close(fd)
    digest, read = hashlib.sha256(), 0
    for chunk in read_bounded(path, limit, _CHUNK):
        digest.update(chunk)
        read += len(chunk)
    return "" if read > limit else digest.hexdigest()


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


def _hash_problem(folder: Path, entry: ManifestFile) -> FileProblem | None:
    try:
        digest = sha256_file(folder / entry.path, entry.size)
    except OSError:
        return FileProblem(entry.path, MISSING, entry.size, -1)
    return None if digest == entry.sha256 else FileProblem(entry.path, CORRUPT, entry.size, entry.size)


def verify_model(folder: str, manifest: Manifest, full: bool = True, workers: int = 0) -> VerifyReport:
    """Every manifest file in `folder`: size, and with `full` its sha256 (several files hashed at once)."""
    root = Path(folder)
    check_all_inside(root, (f.path for f in manifest.files), f"model check of {folder}")
    problems = [p for p in (_size_problem(root, f) for f in manifest.files) if p]
    hashed = 0
    if full:
        bad = {p.path for p in problems}
        todo = [f for f in manifest.files if f.path not in bad and f.sha256]
        with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
            problems += [p for p in pool.map(lambda f: _hash_problem(root, f), todo) if p]
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


def free_space(path: str) -> DiskSpace:
    """Free bytes (for an unprivileged writer) on the filesystem that holds or would hold `path`."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    stats = os.statvfs(probe)
    return DiskSpace(str(path), str(probe), stats.f_bavail * stats.f_frsize)
