"""DSPARK_MODEL as a local folder: the head's folder is the truth; its manifest is built by hashing."""

from __future__ import annotations

from pathlib import Path

from .errors import ModelError
from .location import ModelLocation, local_location
from .manifest import MANIFEST_NAME, Manifest, ManifestFile, read_manifest, write_manifest
from .node_check import sha256_file, verify_model
from .paths import UnsafeModelPath, check_all_inside


def local_manifest(folder: str) -> Manifest:
    """Every file of the folder but the manifest itself, hashed; ModelError when a link leads out of it."""
    root = Path(folder).absolute()
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(MANIFEST_NAME))
    check_all_inside(root, (p.relative_to(root).as_posix() for p in files), f"model folder {root}")
    return Manifest(str(root), "local", tuple(ManifestFile(p.relative_to(root).as_posix(), p.stat().st_size,
                                                           sha256_file(p)) for p in files))


def prepare_local(folder: str, rehash: bool = False) -> tuple[ModelLocation, Manifest]:
    """The folder's location and manifest: the one written there when its sizes still match (and not
    `rehash`), else a fresh one, written beside the files."""
    location = local_location(folder)
    try:
        current = read_manifest(Path(location.folder))
        if current is not None and not rehash and verify_model(location.folder, current, full=False).ok:
            return location, current
        manifest = local_manifest(location.folder)
    except UnsafeModelPath as exc:
        raise ModelError(str(exc)) from None
    write_manifest(Path(location.folder), manifest)
    return location, manifest
