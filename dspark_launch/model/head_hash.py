"""Hashing on the head, once: several files at once (bounded by cores), and a file whose size, mtime
and inode still match the manifest that hashed it keeps its recorded sha256 (unless `rehash`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dspark_launch.node.manifest import Manifest, ManifestFile
from dspark_launch.node.model_files import HashProgress, hash_files
from dspark_launch.node.model_paths import resolve_inside

from .errors import ModelError


@dataclass(frozen=True)
class Hashed:
    files: tuple[ManifestFile, ...]  # in the order asked, with the stat they were hashed at
    hashed_bytes: int  # bytes read to hash (0 when every file was unchanged)
    hashed_paths: tuple[str, ...]  # the files read (the others kept their recorded sha256)


def unchanged(entry: ManifestFile | None, stat: os.stat_result) -> bool:
    return (
        entry is not None
        and bool(entry.sha256)
        and entry.inode != 0
        and entry.size == stat.st_size
        and entry.mtime_ns == stat.st_mtime_ns
        and entry.inode == stat.st_ino
    )


def hash_folder_files(
    folder: Path,
    paths: Sequence[str],
    previous: Manifest | None = None,
    rehash: bool = False,
    progress: Callable[[str], None] | None = None,
    origin: str = "manifest",
) -> Hashed:
    """sha256 of each of `paths` (relative to `folder`, links resolved and required to stay inside the
    model's root: UnsafeModelPath naming `origin`), reusing `previous`'s digest of a file that has not
    changed since; each file read no further than the size it was found with (regular files only);
    `progress` gets a line every few seconds while hashing."""
    known = {f.path: f for f in previous.files} if previous is not None and not rehash else {}
    real = [resolve_inside(folder, p, origin) for p in paths]
    stats = [r.stat() for r in real]
    todo = [i for i, (p, st) in enumerate(zip(paths, stats)) if not unchanged(known.get(p), st)]
    total = sum(stats[i].st_size for i in todo)
    meter = HashProgress("head", total, progress) if progress and total else None
    digests = dict(
        zip(todo, hash_files([real[i] for i in todo], on_bytes=meter, limits=[stats[i].st_size for i in todo]))
    )
    grown = [paths[i] for i, digest in digests.items() if not digest]
    if grown:
        raise ModelError(f"{folder / grown[0]} grew while it was hashed; nothing was written, run the command again")
    files = tuple(
        ManifestFile(p, st.st_size, digests[i] if i in digests else known[p].sha256, st.st_mtime_ns, st.st_ino)
        for i, (p, st) in enumerate(zip(paths, stats))
    )
    return Hashed(files, total, tuple(paths[i] for i in todo))
