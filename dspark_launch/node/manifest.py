"""The manifest file: every file of a model (path, size, sha256) and a stamp over them (`protocol.Manifest`).

Written beside the weights as `.dspark-manifest.json`. Stdlib only: nodes read it.
For LFS files the sha256 is the hub's own; for small files it is computed after the
download (the hub publishes a git sha1 for those, checked at pull time).
"""

from __future__ import annotations

from pathlib import Path

from dspark_launch.node.safe_path import write_private

from .values import Manifest, ManifestFile  # noqa: F401 (the values' home)

MANIFEST_NAME = ".dspark-manifest.json"


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    """Atomically write the manifest into `folder` (the snapshot or local model folder): a new file
    with a unique name (never a planted link) renamed over the old one."""
    path = Path(folder) / MANIFEST_NAME
    write_private(path, manifest.to_json())
    return path


def read_manifest(folder: Path) -> Manifest | None:
    """The manifest in `folder`, or None when absent or unreadable."""
    try:
        return Manifest.from_json((Path(folder) / MANIFEST_NAME).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None
