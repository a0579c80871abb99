"""The manifest: every file of a model (path, size, sha256) and a stamp over them.

Written beside the weights as `.dspark-manifest.json`. Stdlib only: nodes read it.
For LFS files the sha256 is the hub's own; for small files it is computed after the
download (the hub publishes a git sha1 for those, checked at pull time).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from dspark_launch.agent.safe_path import write_private

from .model_paths import require_relative

MANIFEST_NAME = ".dspark-manifest.json"
FORMAT = 1


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative to the model folder, "/"-separated
    size: int
    sha256: str  # "" while unknown (a hub listing before the download): size-only checks
    # The head's stat when it hashed the file (0: unknown): an unchanged file is not hashed again.
    # Not part of the stamp (they differ between nodes).
    mtime_ns: int = 0
    inode: int = 0

    def __post_init__(self) -> None:
        require_relative(self.path, "manifest")  # whoever built it: a listing, a file, a verify request
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"manifest: {self.path!r} has size {self.size!r}; allowed: a whole number >= 0")


@dataclass(frozen=True)
class Manifest:
    source: str  # hub repo id, or the local folder it was built from
    revision: str  # hub commit, or "local"
    files: tuple[ManifestFile, ...]

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def stamp(self) -> str:
        """Identifies this exact content: equal stamps mean equal paths, sizes and hashes."""
        canonical = json.dumps([self.source, self.revision, [[f.path, f.size, f.sha256] for f in self.files]],
                               separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "source": self.source, "revision": self.revision, "stamp": self.stamp,
                           "files": [{"path": f.path, "size": f.size, "sha256": f.sha256, "mtime_ns": f.mtime_ns,
                                      "inode": f.inode} for f in self.files]},
                          indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a manifest of format {FORMAT}")
        manifest = cls(str(data["source"]), str(data["revision"]),
                       tuple(ManifestFile(str(f["path"]), int(f["size"]), str(f["sha256"]), int(f.get("mtime_ns", 0)),
                                          int(f.get("inode", 0))) for f in data["files"]))
        if data.get("stamp") != manifest.stamp:
            raise ValueError("manifest stamp does not match its content")
        return manifest


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
