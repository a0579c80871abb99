"""Where a model's files live on a node, and which paths a copy must carry.

A hub model lives in the hub cache (`models--org--name/`): the snapshot folder holds
symlinks into `blobs/`, so a copy carries both. A local model is a plain folder.
The path is the same on every node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dspark_launch.node.manifest import MANIFEST_NAME, Manifest


@dataclass(frozen=True)
class ModelLocation:
    root: str  # the folder copied as a whole (the repo's cache folder, or the local model folder)
    folder_rel: str  # the model folder inside root ("snapshots/<commit>", or "")

    @property
    def folder(self) -> str:
        return str(Path(self.root) / self.folder_rel) if self.folder_rel else self.root

    def storage_paths(self, manifest: Manifest, only: tuple[str, ...] | None = None) -> list[str]:
        """Paths relative to root that hold the manifest's files (`only`: those files): the file, and
        for a hub cache symlink its blob too. The manifest file itself is never in the list."""
        root, wanted = Path(self.root), set(only) if only is not None else None
        paths: list[str] = []
        for entry in manifest.files:
            if wanted is not None and entry.path not in wanted:
                continue
            rel = Path(self.folder_rel, entry.path) if self.folder_rel else Path(entry.path)
            paths.append(rel.as_posix())
            link = root / rel
            if link.is_symlink():
                target = Path(os.path.normpath(link.parent / os.readlink(link)))
                if target.is_relative_to(root):
                    paths.append(target.relative_to(root).as_posix())
        return paths

    def ref_paths(self) -> list[str]:
        """The hub cache's refs (branch or tag -> commit), so an offline load by branch name finds the
        snapshot on a worker too. Empty for a local folder."""
        refs = Path(self.root) / "refs"
        if not self.folder_rel or not refs.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in refs.rglob("*") if p.is_file())

    @property
    def manifest_path(self) -> str:
        """The manifest file, relative to root."""
        return (Path(self.folder_rel) / MANIFEST_NAME).as_posix() if self.folder_rel else MANIFEST_NAME


def hub_cache_location(cache_dir: str, repo_id: str, commit: str) -> ModelLocation:
    root = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    return ModelLocation(str(root), f"snapshots/{commit}")


def local_location(folder: str) -> ModelLocation:
    return ModelLocation(str(Path(folder).absolute()), "")
