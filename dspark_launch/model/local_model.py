"""DSPARK_MODEL as a local folder: the head's folder is the truth; its manifest is built by hashing
(a file unchanged since the last manifest keeps its sha256: head_hash)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dspark_launch.node.manifest import MANIFEST_NAME, Manifest, read_manifest, write_manifest
from dspark_launch.node.model_paths import UnsafeModelPath

from .errors import ModelError
from .head_hash import hash_folder_files
from .location import ModelLocation, local_location


def local_manifest(
    folder: str, previous: Manifest | None = None, rehash: bool = False, progress: Callable[[str], None] | None = None
) -> tuple[Manifest, int]:
    """Every file of the folder but the manifest itself, hashed (unless unchanged since `previous`);
    with the bytes hashed. UnsafeModelPath when a link leads out of the folder."""
    root = Path(folder).absolute()
    paths = sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.name.startswith(MANIFEST_NAME)
    )
    hashed = hash_folder_files(root, paths, previous, rehash, progress, f"model folder {root}")
    return Manifest(str(root), "local", hashed.files), hashed.hashed_bytes


def prepare_local_counted(
    folder: str, rehash: bool = False, progress: Callable[[str], None] | None = None
) -> tuple[ModelLocation, Manifest, int]:
    """The folder's location, its manifest (written beside the files when it changed) and the bytes hashed."""
    location = local_location(folder)
    try:
        current = read_manifest(Path(location.folder))
        manifest, hashed = local_manifest(location.folder, current, rehash, progress)
    except UnsafeModelPath as exc:
        raise ModelError(str(exc)) from None
    if manifest.to_json() != (current.to_json() if current is not None else None):
        write_manifest(Path(location.folder), manifest)
    return location, manifest, hashed


def prepare_local(folder: str, rehash: bool = False) -> tuple[ModelLocation, Manifest]:
    location, manifest, _ = prepare_local_counted(folder, rehash)
    return location, manifest
