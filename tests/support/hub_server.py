"""A Hugging Face hub look-alike on loopback, for tests that run the real huggingface_hub client.

It answers what huggingface_hub 2.4 asks when downloading a model repository
(read from the installed client's source):

* ``GET /api/models/{repo}[/revision/{rev}][?blobs=true]``: model info (``sha`` = the
  commit; ``siblings`` with size, blobId and ``lfs.sha256`` when ``blobs`` is set);
* ``GET /api/models/{repo}/tree/{rev}?recursive=true``: the file listing
  snapshot_download uses (``oid``, ``size``, ``lfs.oid`` = sha256);
* ``HEAD|GET /{repo}/resolve/{rev}/{path}``: small files answered directly (ETag = git
  blob sha1), LFS files redirected (302) to a CDN-like URL on the same server with
  ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``; ``X-Repo-Commit`` always;
* ``GET /cdn/{sha256}``: the LFS bytes, with ``Range`` (206) so a cut download resumes.

Gated mode: the API and resolve endpoints answer 401 without a token and 403 with a
wrong one (``X-Error-Code: GatedRepo``), like the hub. ``extra_siblings``: entries added to
the model-info listing as given (a malicious or broken hub). Hooks: ``cut_next`` closes the
connection after N bytes of a file's next download; ``stall_next`` sends N bytes and
then waits (the test kills the client meanwhile). Every request is logged (method,
file, Range) without the token.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class RepoFile:
    path: str
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def blob_id(self) -> str:
        return git_blob_sha1(self.data)


@dataclass(frozen=True)
class HubRepo:
    repo_id: str
    commit: str
    files: tuple[RepoFile, ...]
    gated_token: str = ""  # non-empty: the only token the hub accepts

    @classmethod
    def from_folder(cls, repo_id: str, folder: Path, commit: str = "", gated_token: str = "") -> "HubRepo":
        files = tuple(
            RepoFile(p.relative_to(folder).as_posix(), p.read_bytes(), p.name.endswith(LFS_SUFFIXES))
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        )
        commit = commit or hashlib.sha1(b"".join(f.blob_id.encode() for f in files)).hexdigest()
        return cls(repo_id, commit, files, gated_token)

    def file(self, path: str) -> RepoFile | None:
        return next((f for f in self.files if f.path == path), None)

    def by_sha256(self, sha: str) -> RepoFile | None:
        return next((f for f in self.files if f.lfs and f.sha256 == sha), None)

    @property
    def total_size(self) -> int:
        return sum(len(f.data) for f in self.files)


def write_tiny_model(folder: Path, shards: int = 3, shard_bytes: int = 300_000, seed: int = 7) -> Path:
    """A model-shaped folder: config, tokenizer files, an index and `shards` safetensors-named shards.

    The shards are random bytes (never loaded), distinct per shard."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))
    index = {"metadata": {"total_size": shards * shard_bytes}, "weight_map": {f"w{i}": n for i, n in enumerate(names)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    for i, name in enumerate(names):
        seed_bytes = hashlib.sha256(f"{seed}-{i}".encode()).digest()
        block = b"".join(hashlib.sha256(seed_bytes + n.to_bytes(4, "big")).digest() for n in range(2048))
        (folder / name).write_bytes((block * (shard_bytes // len(block) + 1))[:shard_bytes])
    return folder


@dataclass
class _Hooks:
    cut: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before closing
    stall: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before waiting
    release: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # repo file path for resolve/cdn requests, else the URL path
    kind: str  # "api", "tree", "resolve", "cdn"
    range: str
    status: int


class HubServer:
    """Threaded, loopback-only, ephemeral port. Use as a context manager."""

    def __init__(self, repo: HubRepo):
        self.repo = repo
        self.hooks = _Hooks()
        self.requests: list[Request] = []
        self.extra_siblings: list[dict] = []  # listed by model info as given, served by nothing
        self.authorizations: list[str] = []  # the Authorization headers received, in order
        self._lock = threading.Lock()
        # Two listeners: the hub, and a "CDN" on another origin (the client stops following
        # redirects at a foreign origin and reads the file's metadata from the 302 itself).
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self)) for _ in range(2)]
        for httpd in self._servers:
            httpd.daemon_threads = True
        self._threads = [
            threading.Thread(target=h.serve_forever, name="hub-server", daemon=True) for h in self._servers
        ]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def __enter__(self) -> "HubServer":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.release.set()
        for httpd in self._servers:
            httpd.shutdown()
            httpd.server_close()

    def cut_next(self, path: str, after_bytes: int) -> None:
        """The next download of `path` sends `after_bytes` bytes, then the connection closes."""
        with self._lock:
            self.hooks.cut[path] = after_bytes

    def stall_next(self, path: str, after_bytes: int) -> None:
        """The next download of `path` sends `after_bytes` bytes, then waits until the server closes."""
        with self._lock:
            self.hooks.stall[path] = after_bytes

    def take_hook(self, table: dict[str, int], path: str) -> int | None:
        with self._lock:
            return table.pop(path, None)

    def log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def downloads(self, path: str) -> list[Request]:
        """GETs that carried bytes of `path` (resolve of a small file, or the CDN for an LFS file)."""
        return [
            r
            for r in self.requests
            if r.method == "GET" and r.path == path and r.kind in ("resolve", "cdn") and r.status in (200, 206)
        ]


def _handler_for(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002  (quiet: pytest captures stderr anyway)
            pass

        def do_HEAD(self):
            self._route(head=True)

        def do_GET(self):
            self._route(head=False)

        # ------------------------------------------------------------ routing

        def _route(self, head: bool) -> None:
            if self.headers.get("Authorization"):
                hub.authorizations.append(self.headers["Authorization"])
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            path = unquote(url.path)
            repo = hub.repo
            api = f"/api/models/{repo.repo_id}"
            if path.startswith("/cdn/"):
                return self._cdn(path[len("/cdn/") :], head)
            if path == api or path.startswith(api + "/"):
                if not self._authorised("api", path):
                    return
                rest = path[len(api) :]
                if rest == "" or re.fullmatch(r"/revision/[^/]+", rest):
                    rev = rest.split("/")[-1] if rest else "main"
                    return self._model_info(rev, blobs=query.get("blobs", ["false"])[0].lower() == "true")
                m = re.fullmatch(r"/tree/([^/]+)", rest)
                if m:
                    return self._tree(m.group(1))
            prefix = f"/{repo.repo_id}/resolve/"
            if path.startswith(prefix):
                rev, _, file_path = path[len(prefix) :].partition("/")
                if not self._authorised("resolve", file_path):
                    return
                return self._resolve(rev, file_path, head)
            self._error(404, "RepoNotFound", "Repository not found", "api", path)

        def _authorised(self, kind: str, path: str) -> bool:
            token = hub.repo.gated_token
            if not token:
                return True
            sent = self.headers.get("Authorization", "")
            if not sent:
                self._error(401, "GatedRepo", "Access to this gated repository requires a token", kind, path)
                return False
            if sent != f"Bearer {token}":
                self._error(403, "GatedRepo", "Your token has no access to this gated repository", kind, path)
                return False
            return True

        def _known_revision(self, rev: str) -> bool:
            return rev in ("main", hub.repo.commit)

        # ------------------------------------------------------------ answers

        def _model_info(self, rev: str, blobs: bool) -> None:
            if not self._known_revision(rev):
                return self._error(404, "RevisionNotFound", "Invalid rev id", "api", rev)
            repo = hub.repo
            siblings = []
            for f in repo.files:
                entry = {"rfilename": f.path}
                if blobs:
                    entry.update(size=len(f.data), blobId=f.blob_id)
                    if f.lfs:
                        entry["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": 134}
                siblings.append(entry)
            siblings += hub.extra_siblings
            body = {
                "_id": "0" * 24,
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": "manual" if repo.gated_token else False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
                "lastModified": "2026-07-31T00:00:00.000Z",
                "createdAt": "2026-07-31T00:00:00.000Z",
            }
            self._json(body, "api", f"revision/{rev}")

        def _tree(self, rev: str) -> None:
            if not self._known_revision(rev):
                return self._error(404, "RevisionNotFound", "Invalid rev id", "tree", rev)
            entries = []
            for f in hub.repo.files:
                entry = {"type": "file", "path": f.path, "size": len(f.data), "oid": f.blob_id}
                if f.lfs:
                    entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
                entries.append(entry)
            self._json(entries, "tree", rev)

        def _resolve(self, rev: str, file_path: str, head: bool) -> None:
            repo = hub.repo
            f = repo.file(file_path)
            if not self._known_revision(rev):
                return self._error(404, "RevisionNotFound", "Invalid rev id", "resolve", file_path)
            if f is None:
                return self._error(404, "EntryNotFound", "Entry not found", "resolve", file_path)
            common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
            if f.lfs:
                location = f"{hub.cdn}/cdn/{f.sha256}"
                self._send(
                    302,
                    {
                        **common,
                        "Location": location,
                        "ETag": f'"{f.blob_id}"',
                        "X-Linked-Etag": f'"{f.sha256}"',
                        "X-Linked-Size": str(len(f.data)),
                        "Content-Length": "0",
                    },
                    b"",
                    "resolve",
                    file_path,
                )
                return
            self._file_body(f, {**common, "ETag": f'"{f.blob_id}"'}, head, "resolve")

        def _cdn(self, sha: str, head: bool) -> None:
            f = hub.repo.by_sha256(sha)
            if f is None:
                return self._error(404, "EntryNotFound", "Entry not found", "cdn", sha)
            self._file_body(f, {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes"}, head, "cdn")

        def _file_body(self, f: RepoFile, headers: dict, head: bool, kind: str) -> None:
            data, status, rng = f.data, 200, self.headers.get("Range", "")
            m = _RANGE.match(rng) if rng else None
            if m:
                start = int(m.group(1))
                end = int(m.group(2)) if m.group(2) else len(f.data) - 1
                if start >= len(f.data):
                    return self._send(
                        416, {"Content-Range": f"bytes */{len(f.data)}", "Content-Length": "0"}, b"", kind, f.path
                    )
                data, status = f.data[start : end + 1], 206
                headers = {**headers, "Content-Range": f"bytes {start}-{start + len(data) - 1}/{len(f.data)}"}
            headers = {**headers, "Content-Length": str(len(data)), "Content-Type": "application/octet-stream"}
            if head:
                return self._send(status, headers, b"", kind, f.path)
            cut = hub.take_hook(hub.hooks.cut, f.path)
            stall = hub.take_hook(hub.hooks.stall, f.path)
            limit = cut if cut is not None else stall
            self._send(status, headers, data if limit is None else data[:limit], kind, f.path, rng)
            if stall is not None:
                hub.hooks.release.wait(timeout=120)
            if limit is not None:
                self.close_connection = True
                self.connection.shutdown(2)

        # ------------------------------------------------------------ plumbing

        def _json(self, body, kind: str, path: str) -> None:
            raw = json.dumps(body).encode()
            self._send(200, {"Content-Type": "application/json", "Content-Length": str(len(raw))}, raw, kind, path)

        def _error(self, status: int, code: str, message: str, kind: str, path: str) -> None:
            raw = json.dumps({"error": message}).encode()
            self._send(
                status,
                {
                    "X-Error-Code": code,
                    "X-Error-Message": message,
                    "Content-Type": "application/json",
                    "Content-Length": str(len(raw)),
                },
                raw if self.command != "HEAD" else b"",
                kind,
                path,
            )

        def _send(self, status: int, headers: dict, body: bytes, kind: str, path: str, rng: str = "") -> None:
            hub.log(Request(self.command, path, kind, rng or self.headers.get("Range", ""), status))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                try:
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

    return Handler


if __name__ == "__main__":  # a quick manual check: python -m tests.support.hub_server /tmp/folder
    import sys
    import time

    src = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else write_tiny_model(Path(os.environ.get("TMPDIR", "/tmp")) / "tiny-hub")
    )
    with HubServer(HubRepo.from_folder("test-org/tiny", src)) as server:
        print(server.endpoint, flush=True)
        time.sleep(3600)


def online_hub(monkeypatch) -> None:
    """The hub client online in this test, whatever ran before in the session: huggingface_hub reads
    HF_HUB_OFFLINE once, at import, and the tiny model's build or vLLM may have imported it offline."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


TINY_REPO_ID = "test-org/tiny"


@contextlib.contextmanager
def tiny_hub(folder: Path):
    """A loopback hub serving a freshly written tiny model (written under `folder`) as TINY_REPO_ID."""
    with HubServer(HubRepo.from_folder(TINY_REPO_ID, write_tiny_model(folder))) as server:
        yield server


def tiny_hub_source(server: HubServer, tmp_path: Path, revision: str = "", token: str | None = None):
    """The launcher's HubSource for TINY_REPO_ID on `server`, cached under tmp_path/cache."""
    from dspark_launch.model.hub import HubSource

    return HubSource(TINY_REPO_ID, revision, str(tmp_path / "cache"), server.endpoint, token)
