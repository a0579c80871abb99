"""Pull a model from the Hugging Face hub on the head (launcher side; huggingface_hub imported lazily).

The listing (sizes, the hub's sha256 of LFS files, git sha1 of the others) comes first,
so every node's free space can be checked before the first byte. The download is
huggingface_hub's own snapshot_download into the configured cache at the pinned
commit: a connection cut mid-file resumes with an HTTP Range; after an interrupted run,
files already complete stay in the cache and the next pull fetches only the rest (the
client restarts a file it had not finished). Then every file is checked against the
hub, a bad one is fetched again once, and the manifest is written beside the weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ModelAccessError, ModelError, ModelIncomplete
from .location import ModelLocation, hub_cache_location
from .head_hash import hash_folder_files
from .manifest import Manifest, ManifestFile, read_manifest, write_manifest
from .node_check import verify_model


@dataclass(frozen=True)
class HubSource:
    repo_id: str
    revision: str  # commit, tag or branch; "" = main
    cache_dir: str  # the hub cache (models--org--name/ folders), same path on every node
    endpoint: str = ""  # "" = huggingface_hub's default (HF_ENDPOINT, else huggingface.co)
    token: str | None = field(default=None, repr=False)  # never printed


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str  # the hub's sha256 for LFS files, "" for small (git) files
    blob_id: str  # git blob sha1


@dataclass(frozen=True)
class HubListing:
    repo_id: str
    commit: str
    files: tuple[HubFile, ...]

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def expected(self) -> Manifest:
        """What the hub promises, before the download: sizes, and sha256 where the hub gives one."""
        return Manifest(self.repo_id, self.commit, tuple(ManifestFile(f.path, f.size, f.sha256) for f in self.files))


@dataclass(frozen=True)
class PulledModel:
    location: ModelLocation
    manifest: Manifest
    refetched: tuple[str, ...]  # files that failed the hub's checksum and were fetched again
    hashed_bytes: int = 0  # bytes the head read to hash (0 on a re-pull of an unchanged model)


def resolve_token(environ: Mapping[str, str]) -> str | None:
    """HF_TOKEN, else the hub's token file (HF_TOKEN_PATH, else $HF_HOME/token). Never logged."""
    token = environ.get("HF_TOKEN", "").strip()
    if token:
        return token
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                  "huggingface")
    path = environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")
    with contextlib.suppress(OSError):
        return Path(path).read_text().strip() or None
    return None


def default_cache_dir(environ: Mapping[str, str]) -> str:
    """The hub's own cache folder: HF_HUB_CACHE, else $HF_HOME/hub."""
    if environ.get("HF_HUB_CACHE"):
        return environ["HF_HUB_CACHE"]
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                  "huggingface")
    return os.path.join(home, "hub")


@contextlib.contextmanager
def _hub_errors(source: HubSource):
    """One line per hub failure; the token never appears (the client's messages carry URLs only)."""
    from huggingface_hub import errors

    name = source.repo_id + (f"@{source.revision}" if source.revision else "")
    try:
        yield
    except errors.RevisionNotFoundError:
        raise ModelAccessError(f"model {name}: revision {source.revision!r} not found on the hub") from None
    except errors.GatedRepoError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        if source.token is None:
            why = "gated and no token found (set HF_TOKEN or run `hf auth login` on the head)"
        else:
            why = "gated and the token was refused (request access on the model page, or check HF_TOKEN)"
        raise ModelAccessError(f"model {name}: {why} (HTTP {status})") from None
    except errors.RepositoryNotFoundError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        raise ModelAccessError(f"model {name}: not found, or private and the token has no access "
                               f"(HTTP {status})") from None
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        raise ModelAccessError(f"model {name}: the hub answered HTTP {status}") from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as exc:
        raise ModelError(f"model {name}: cannot reach the hub ({type(exc).__name__}); "
                         "check the network or HF_ENDPOINT, and that HF_HUB_OFFLINE is 0 for a pull") from None
    except OSError as exc:
        raise ModelError(f"model {name}: {exc.strerror or exc}") from None
    except Exception as exc:  # httpx2 transport errors (connect, timeout) are not OSError
        if type(exc).__module__.startswith("httpx"):
            raise ModelError(f"model {name}: cannot reach the hub ({type(exc).__name__})") from None
        raise


def _api(source: HubSource):
    from huggingface_hub import HfApi

    return HfApi(endpoint=source.endpoint or None, token=source.token if source.token else False)


def list_model(source: HubSource) -> HubListing:
    """The commit the revision points at, and every file's size and hashes (one API call)."""
    with _hub_errors(source):
        info = _api(source).model_info(source.repo_id, revision=source.revision or None, files_metadata=True)
    files = tuple(HubFile(s.rfilename, int(s.size or 0), s.lfs.sha256 if s.lfs else "", s.blob_id or "")
                  for s in info.siblings or ())
    if not info.sha:
        raise ModelError(f"model {source.repo_id}: the hub gave no commit for revision {source.revision or 'main'}")
    return HubListing(source.repo_id, info.sha, files)


def git_blob_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _check_against_hub(folder: Path, listing: HubListing, previous: Manifest | None = None, rehash: bool = False,
                       progress: Callable[[str], None] | None = None) -> tuple[Manifest, list[str], int]:
    """The manifest (sha256 of every file), the files whose content is not what the hub lists, and the
    bytes hashed: files hashed at once, one unchanged since `previous` (size, mtime, inode) not again."""
    sizes = verify_model(str(folder), listing.expected(), full=False)
    bad = list(sizes.bad_paths)
    present = [f for f in listing.files if f.path not in bad]
    hashed = hash_folder_files(folder, [f.path for f in present], previous, rehash, progress)
    done = {entry.path: entry for entry in hashed.files}
    fresh = set(hashed.hashed_paths)  # an unchanged small file passed its git sha1 check when hashed
    entries = []
    for f in listing.files:
        if f.path in bad:
            entries.append(ManifestFile(f.path, f.size, f.sha256))
            continue
        entry = done[f.path]
        if f.sha256 and entry.sha256 != f.sha256 or (not f.sha256 and f.blob_id and f.path in fresh
                                                      and git_blob_sha1(folder / f.path) != f.blob_id):
            bad.append(f.path)
        entries.append(entry)
    return Manifest(listing.repo_id, listing.commit, tuple(entries)), bad, hashed.hashed_bytes


def _forget(folder: Path, path: str) -> None:
    """Remove a cached file and its blob so the client fetches it again."""
    link = folder / path
    with contextlib.suppress(OSError):
        if link.is_symlink():
            (link.parent / os.readlink(link)).unlink()
        link.unlink()


def pull(source: HubSource, listing: HubListing, tqdm_class=None, rehash: bool = False,
         progress: Callable[[str], None] | None = None) -> PulledModel:
    """Download `listing.commit` into the cache (what is there already is kept), check every file
    against the hub, fetch a bad one again once, write the manifest. `tqdm_class`: the progress bar
    (None: huggingface_hub's own, on stderr). A file unchanged since the last manifest is not hashed
    again unless `rehash`; `progress` gets a line every few seconds while hashing."""
    from huggingface_hub import snapshot_download

    location = hub_cache_location(source.cache_dir, listing.repo_id, listing.commit)
    folder = Path(location.folder)

    def download() -> None:
        with _hub_errors(source):
            snapshot_download(listing.repo_id, revision=listing.commit, cache_dir=source.cache_dir,
                              endpoint=source.endpoint or None, token=source.token if source.token else False,
                              tqdm_class=tqdm_class)

    download()
    previous = read_manifest(folder)
    manifest, bad, hashed = _check_against_hub(folder, listing, previous, rehash, progress)
    refetched = tuple(bad)
    if bad:
        for path in bad:
            _forget(folder, path)
        download()
        manifest, bad, again = _check_against_hub(folder, listing, manifest, False, progress)
        hashed += again
    if bad:
        raise ModelIncomplete(f"model {listing.repo_id}@{listing.commit[:12]}: {bad[0]} differs from the hub "
                              f"after a second download ({len(bad)} file(s) bad in {folder})")
    _write_ref(Path(location.root), source.revision or "main", listing.commit)
    if previous is None or manifest.to_json() != previous.to_json():
        write_manifest(folder, manifest)
    return PulledModel(location, manifest, refetched, hashed)


def _write_ref(repo_root: Path, revision: str, commit: str) -> None:
    """refs/<branch or tag> -> commit, as the hub cache records it (the download by commit does not),
    so a later offline load by that name finds the snapshot."""
    if revision == commit:
        return
    ref = repo_root / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(ref.name + ".tmp")
    tmp.write_text(commit)
    tmp.replace(ref)



def is_local_folder(model: str) -> bool:
    """DSPARK_MODEL names a folder (absolute, ./ or ~ path, or an existing directory), not a hub id."""
    return model.startswith(("/", "./", "../", "~")) or os.path.isdir(model)


def hub_source(model: str, revision: str, cache_setting: str, environ: Mapping[str, str]) -> HubSource:
    """The pull's source from the settings: DSPARK_MODEL, the revision (profile pin or
    DSPARK_MODEL_REVISION), DSPARK_MODEL_CACHE, and HF_ENDPOINT / HF_TOKEN / the token file."""
    return HubSource(model, revision, cache_setting or default_cache_dir(environ), environ.get("HF_ENDPOINT", ""),
                     resolve_token(environ))
