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
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from dspark_launch.errors import ConfigError
from dspark_launch.node.manifest import Manifest, ManifestFile, read_manifest, write_manifest
from dspark_launch.node.model_files import verify_model
from dspark_launch.node.model_paths import UnsafeModelPath, read_bounded, require_relative, resolve_inside
from dspark_launch.node.safe_path import write_private

from .errors import ModelAccessError, ModelError, ModelIncomplete
from .head_hash import hash_folder_files
from .location import ModelLocation, hub_cache_location

HUB_LISTING = "the hub's listing"  # where a pulled file's name came from, in a refusal


@dataclass(frozen=True)
class HubSource:
    repo_id: str
    revision: str  # commit, tag or branch; "" = main
    cache_dir: str  # the hub cache (models--org--name/ folders), same path on every node
    endpoint: str = ""  # "" = huggingface_hub's default (HF_ENDPOINT, else huggingface.co)
    token: str | None = field(default=None, repr=False)  # never printed
    proxy: bool = False  # DSPARK_HUB_PROXY=1: the environment's proxy variables apply
    token_withheld: str = ""  # why a token found was not sent (shown when the hub asks for one)


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
    home = environ.get("HF_HOME") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    path = environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")
    with contextlib.suppress(OSError):
        return Path(path).read_text().strip() or None
    return None


def default_cache_dir(environ: Mapping[str, str]) -> str:
    """The hub's own cache folder: HF_HUB_CACHE, else $HF_HOME/hub."""
    if environ.get("HF_HUB_CACHE"):
        return environ["HF_HUB_CACHE"]
    home = environ.get("HF_HOME") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return os.path.join(home, "hub")


DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit: the snapshot folder's name


def hub_token(endpoint: str, token: str | None, to_endpoint: bool, trusted_http: str = "") -> tuple[str | None, str]:
    """The token to send to `endpoint` ("" = the default hub) and, when withheld, why. Only the default
    hub gets it unless DSPARK_HUB_TOKEN_TO_ENDPOINT=1; never over plain http, loopback included (a mirror
    that is down leaves its port to any local user), unless DSPARK_HUB_TRUSTED_HTTP_ENDPOINT names
    exactly this endpoint: ConfigError, nothing sent."""
    if token is None:
        return None, ""
    url = urlsplit(endpoint or DEFAULT_ENDPOINT)
    if (endpoint or DEFAULT_ENDPOINT).rstrip("/") != DEFAULT_ENDPOINT and not to_endpoint:
        return None, (
            f"the token is not sent to HF_ENDPOINT={endpoint} (only to {DEFAULT_ENDPOINT}; "
            "DSPARK_HUB_TOKEN_TO_ENDPOINT=1 sends it there)"
        )
    trusted = bool(trusted_http) and endpoint.rstrip("/") == trusted_http.rstrip("/")
    if url.scheme != "https" and not (url.scheme == "http" and trusted):
        raise ConfigError(
            f"HF_ENDPOINT={endpoint} from environment: the hub token would travel in clear text; "
            "nothing was sent; allowed: an https:// endpoint, this exact endpoint named in "
            "DSPARK_HUB_TRUSTED_HTTP_ENDPOINT, or no token (DSPARK_HUB_TOKEN_TO_ENDPOINT=0)"
        )
    return token, ""


def _use_http_client(proxy: bool) -> None:
    """huggingface_hub's shared HTTP client without the environment's proxies (trust_env off) unless
    DSPARK_HUB_PROXY=1: a proxy would see the token and every file. Set once per choice."""
    global _HTTP_PROXY
    if _HTTP_PROXY is proxy:
        return
    import httpx2
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import hf_request_event_hook

    set_client_factory(
        lambda: httpx2.Client(
            event_hooks={"request": [hf_request_event_hook]}, follow_redirects=True, timeout=None, trust_env=proxy
        )
    )
    _HTTP_PROXY = proxy


_HTTP_PROXY: bool | None = None  # the choice the shared client was made with (None: not yet)


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
        if source.token is None and source.token_withheld:
            why = f"gated and {source.token_withheld}"
        elif source.token is None:
            why = "gated and no token found (set HF_TOKEN or run `hf auth login` on the head)"
        else:
            why = "gated and the token was refused (request access on the model page, or check HF_TOKEN)"
        raise ModelAccessError(f"model {name}: {why} (HTTP {status})") from None
    except errors.RepositoryNotFoundError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        raise ModelAccessError(
            f"model {name}: not found, or private and the token has no access (HTTP {status})"
        ) from None
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        raise ModelAccessError(f"model {name}: the hub answered HTTP {status}") from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as exc:
        raise ModelError(
            f"model {name}: cannot reach the hub ({type(exc).__name__}); "
            "check the network or HF_ENDPOINT, and that HF_HUB_OFFLINE is 0 for a pull"
        ) from None
    except OSError as exc:
        raise ModelError(f"model {name}: {exc.strerror or exc}") from None
    except Exception as exc:  # httpx2 transport errors (connect, timeout) are not OSError
        if type(exc).__module__.startswith("httpx"):
            raise ModelError(f"model {name}: cannot reach the hub ({type(exc).__name__})") from None
        raise


def _api(source: HubSource):
    from huggingface_hub import HfApi

    _use_http_client(source.proxy)
    return HfApi(endpoint=source.endpoint or None, token=source.token if source.token else False)


def list_model(source: HubSource) -> HubListing:
    """The commit the revision points at, and every file's size and hashes (one API call)."""
    with _hub_errors(source):
        info = _api(source).model_info(source.repo_id, revision=source.revision or None, files_metadata=True)
    files = tuple(
        HubFile(s.rfilename, int(s.size or 0), s.lfs.sha256 if s.lfs else "", s.blob_id or "")
        for s in info.siblings or ()
    )
    _require_safe_names(source, files)
    if not COMMIT.fullmatch(info.sha or ""):
        raise ModelError(
            f"model {source.repo_id}: the hub gave no commit for revision {source.revision or 'main'} "
            f"(got {info.sha!r}; allowed: 40 hex digits, the snapshot folder's name)"
        )
    return HubListing(source.repo_id, info.sha, files)


def _require_safe_names(source: HubSource, files: tuple[HubFile, ...]) -> None:
    """Every listed name a relative path inside the snapshot, every size a whole number >= 0; else the
    whole listing is refused (one line, nothing downloaded or deleted)."""
    origin = f"model {source.repo_id}: the hub's listing ({source.endpoint or 'default endpoint'})"
    try:
        for f in files:
            require_relative(f.path, origin)
            if f.size < 0:
                raise UnsafeModelPath(f"{origin}: {f.path!r} has size {f.size}")
    except UnsafeModelPath as exc:
        raise ModelError(f"{exc}; refusing the whole listing, nothing downloaded or deleted") from None


def git_blob_sha1(path: Path, size: int) -> str:
    """git's blob id of regular file `path`, read no further than `size` bytes ("" when longer)."""
    data = b"".join(read_bounded(path, size, 8 << 20))
    return "" if len(data) > size else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _check_against_hub(
    folder: Path,
    listing: HubListing,
    previous: Manifest | None = None,
    rehash: bool = False,
    progress: Callable[[str], None] | None = None,
) -> tuple[Manifest, list[str], int]:
    """The manifest (sha256 of every file), the files whose content is not what the hub lists, and the
    bytes hashed: files hashed at once, one unchanged since `previous` (size, mtime, inode) not again."""
    sizes = verify_model(str(folder), listing.expected(), full=False)
    bad = list(sizes.bad_paths)
    present = [f for f in listing.files if f.path not in bad]
    hashed = hash_folder_files(folder, [f.path for f in present], previous, rehash, progress, HUB_LISTING)
    done = {entry.path: entry for entry in hashed.files}
    fresh = set(hashed.hashed_paths)  # an unchanged small file passed its git sha1 check when hashed
    entries = []
    for f in listing.files:
        if f.path in bad:
            entries.append(ManifestFile(f.path, f.size, f.sha256))
            continue
        entry = done[f.path]
        if (
            f.sha256
            and entry.sha256 != f.sha256
            or (
                not f.sha256
                and f.blob_id
                and f.path in fresh
                and git_blob_sha1(resolve_inside(folder, f.path, HUB_LISTING), f.size) != f.blob_id
            )
        ):
            bad.append(f.path)
        entries.append(entry)
    return Manifest(listing.repo_id, listing.commit, tuple(entries)), bad, hashed.hashed_bytes


def _forget(folder: Path, path: str) -> None:
    """Remove a cached file and its blob so the client fetches it again (both inside the repo's cache
    folder, checked before anything is removed)."""
    link = folder / path
    target = resolve_inside(folder, path, HUB_LISTING)
    with contextlib.suppress(OSError):
        if link.is_symlink():
            target.unlink()
        link.unlink()


def pull(
    source: HubSource,
    listing: HubListing,
    tqdm_class=None,
    rehash: bool = False,
    progress: Callable[[str], None] | None = None,
) -> PulledModel:
    """Download `listing.commit` into the cache (what is there already is kept), check every file
    against the hub, fetch a bad one again once, write the manifest. `tqdm_class`: the progress bar
    (None: huggingface_hub's own, on stderr). A file unchanged since the last manifest is not hashed
    again unless `rehash`; `progress` gets a line every few seconds while hashing."""
    from huggingface_hub import snapshot_download

    location = hub_cache_location(source.cache_dir, listing.repo_id, listing.commit)
    folder = Path(location.folder)

    def download() -> None:
        _use_http_client(source.proxy)
        with _hub_errors(source):
            snapshot_download(
                listing.repo_id,
                revision=listing.commit,
                cache_dir=source.cache_dir,
                endpoint=source.endpoint or None,
                token=source.token if source.token else False,
                tqdm_class=tqdm_class,
            )

    download()
    try:
        previous = read_manifest(folder)
        manifest, bad, hashed = _check_against_hub(folder, listing, previous, rehash, progress)
        refetched = tuple(bad)
        if bad:
            for path in bad:
                _forget(folder, path)
            download()
            manifest, bad, again = _check_against_hub(folder, listing, manifest, False, progress)
            hashed += again
    except UnsafeModelPath as exc:
        raise ModelError(f"model {listing.repo_id}: {exc}") from None
    if bad:
        raise ModelIncomplete(
            f"model {listing.repo_id}@{listing.commit[:12]}: {bad[0]} differs from the hub "
            f"after a second download ({len(bad)} file(s) bad in {folder})"
        )
    _write_ref(Path(location.root), source.revision or "main", listing.commit)
    if previous is None or manifest.to_json() != previous.to_json():
        write_manifest(folder, manifest)
    return PulledModel(location, manifest, refetched, hashed)


def _write_ref(repo_root: Path, revision: str, commit: str) -> None:
    """refs/<branch or tag> -> commit, as the hub cache records it (the download by commit does not),
    so a later offline load by that name finds the snapshot."""
    if revision == commit:
        return
    ref = repo_root / "refs" / require_relative(revision, "the revision")
    ref.parent.mkdir(parents=True, exist_ok=True)
    write_private(ref, commit)


def is_local_folder(model: str) -> bool:
    """DSPARK_MODEL names a folder (absolute, ./ or ~ path, or an existing directory), not a hub id."""
    return model.startswith(("/", "./", "../", "~")) or os.path.isdir(model)


def hub_source(
    model: str,
    revision: str,
    cache_setting: str,
    environ: Mapping[str, str],
    token_to_endpoint: bool = False,
    proxy: bool = False,
    trusted_http: str = "",
) -> HubSource:
    """The pull's source from the settings: DSPARK_MODEL, the revision (profile pin or
    DSPARK_MODEL_REVISION), DSPARK_MODEL_CACHE, HF_ENDPOINT / HF_TOKEN / the token file (sent by
    `hub_token`'s rule), DSPARK_HUB_PROXY."""
    endpoint = environ.get("HF_ENDPOINT", "")
    token, withheld = hub_token(endpoint, resolve_token(environ), token_to_endpoint, trusted_http)
    return HubSource(model, revision, cache_setting or default_cache_dir(environ), endpoint, token, proxy, withheld)
