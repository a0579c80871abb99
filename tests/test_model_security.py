"""The model files' security: names from the hub, a manifest or a
verify request (2), files written into folders others may write (3), the hub token and proxies (4).
The real huggingface_hub client against the project's loopback hub; no testbed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dspark_launch import __version__
from dspark_launch.agent import protocol as p
from dspark_launch.agent.codec import to_data
from dspark_launch.errors import ConfigError
from dspark_launch.model.errors import ModelAccessError, ModelError
from dspark_launch.model.hub import HubSource, hub_source, list_model, pull
from dspark_launch.model.local_model import prepare_local
from dspark_launch.node.manifest import MANIFEST_NAME, Manifest, ManifestFile, read_manifest, write_manifest
from dspark_launch.node.model_files import SPECIAL, verify_model
from dspark_launch.node.model_paths import UnsafeModelPath
from tests.support.hub_server import TINY_REPO_ID, HubRepo, HubServer, tiny_hub_source, write_tiny_model

REPO_ID = TINY_REPO_ID
REPO_ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("hub_online")  # the loopback hub; `hub` is a shared fixture


source = tiny_hub_source


# --- point 2: every name a relative path inside the model folder -------------------------------------

BAD_NAMES = [
    "/etc/passwd",
    "../../../victim",
    "config/../../x",
    "a\\b.json",
    "tokenizer\n.json",
    "x\x1b[2J",
    "",
    "./config.json",
    "a//b",
    "/dev/zero",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_listing_with_one_unsafe_name_is_refused_whole(hub, tmp_path, name):
    hub.extra_siblings.append({"rfilename": name, "size": 0, "blobId": "0" * 40})
    with pytest.raises(ModelError) as info:
        list_model(source(hub, tmp_path))
    message = str(info.value)
    assert "\n" not in message and "refusing the whole listing" in message and repr(name) in message
    assert not (tmp_path / "cache").exists()


def test_a_listed_absolute_path_with_a_wrong_size_is_never_deleted(hub, tmp_path):
    """The issue's reproduction: the head's cache pulled once, then the hub lists one more file, an
    absolute path outside the cache with a size that differs: the old code unlinked it."""
    src = source(hub, tmp_path)
    pull(src, list_model(src))
    victim = tmp_path / "victim.conf"
    victim.write_text("keep me")
    hub.extra_siblings.append({"rfilename": str(victim), "size": 1, "blobId": "0" * 40})
    with pytest.raises(ModelError) as info:
        pull(src, list_model(src))
    assert victim.exists() and victim.read_text() == "keep me"
    assert "refusing the whole listing" in str(info.value) and "\n" not in str(info.value)


def test_a_snapshot_link_out_of_the_repo_cache_is_refused(hub, tmp_path):
    """A cache another user could write: config.json replaced by a link to a file outside it, same
    bytes (so sizes and hashes match): verify refuses instead of reading (and vLLM loading) it."""
    src = source(hub, tmp_path)
    pulled = pull(src, list_model(src))
    outside = tmp_path / "elsewhere.json"
    link = Path(pulled.location.folder) / "config.json"
    outside.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(UnsafeModelPath, match="outside"):
        verify_model(pulled.location.folder, pulled.manifest)


def test_a_listed_fifo_is_never_read(tmp_path):
    """A FIFO listed with size 0 (as /dev/zero with size 0 was): the size check passes, and the old
    hash opened it and waited forever. Run in a child so a hang fails the test instead of the run."""
    folder = write_tiny_model(tmp_path / "m")
    os.mkfifo(folder / "pipe.json")
    manifest = Manifest(
        "local",
        "local",
        (ManifestFile("pipe.json", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),),
    )
    script = (
        "import json, sys; from dspark_launch.node.manifest import Manifest;"
        "from dspark_launch.node.model_files import verify_model;"
        "r = verify_model(sys.argv[1], Manifest.from_json(sys.argv[2]), True);"
        "print(json.dumps([[q.path, q.kind] for q in r.problems]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(folder), manifest.to_json()],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [["pipe.json", SPECIAL]]


def test_hashing_reads_no_further_than_the_listed_size(tmp_path):
    from dspark_launch.node.model_files import sha256_file

    (tmp_path / "f").write_bytes(b"a" * 100)
    assert sha256_file(tmp_path / "f", 50) == ""  # longer than listed: no digest
    assert sha256_file(tmp_path / "f", 100) == sha256_file(tmp_path / "f")


@pytest.mark.parametrize("name", ["../victim", "/etc/hostname", "a/../../b"])
def test_a_manifest_with_an_unsafe_name_is_not_a_manifest(tmp_path, name):
    folder = write_tiny_model(tmp_path / "m")
    _, manifest = prepare_local(str(folder))
    data = json.loads(manifest.to_json())
    data["files"][0]["path"] = name
    canonical = json.dumps(
        [data["source"], data["revision"], [[f["path"], f["size"], f["sha256"]] for f in data["files"]]],
        separators=(",", ":"),
    )
    data["stamp"] = hashlib.sha256(canonical.encode()).hexdigest()[:32]  # anyone can recompute it
    (folder / MANIFEST_NAME).write_text(json.dumps(data))
    assert read_manifest(folder) is None
    with pytest.raises(ValueError, match="file name"):
        ManifestFile(name, 1, "")


def test_a_verify_request_naming_a_path_outside_is_refused_by_the_agent(tmp_path):
    """The node's agent decodes the request's manifest with the same rule: one failure line, nothing read."""
    folder = write_tiny_model(tmp_path / "m")
    _, manifest = prepare_local(str(folder))
    request = to_data(p.ModelVerify(str(folder), manifest, True))
    request["manifest"]["files"][0]["path"] = "../../etc/shadow"
    line = json.dumps(
        {"protocol": p.PROTOCOL_VERSION, "launcher": __version__, "op": "model_verify", "request": request}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_launch.agent.node_end"],
        input=line + "\n",
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    answers = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    assert len(answers) == 1 and "failure" in answers[0], proc.stdout
    assert "'../../etc/shadow'" in answers[0]["failure"]["detail"]


def test_a_local_folder_with_a_link_out_is_refused(tmp_path):
    folder = write_tiny_model(tmp_path / "m")
    (tmp_path / "secret").write_text("not a model file")
    (folder / "extra.json").symlink_to(tmp_path / "secret")
    with pytest.raises(ModelError, match="outside"):
        prepare_local(str(folder))
    assert not (folder / MANIFEST_NAME).exists()


# --- point 3: nothing written through a fixed temporary name -----------------------------------------


def test_the_manifest_is_never_written_through_a_planted_temporary_link(tmp_path):
    folder = write_tiny_model(tmp_path / "m")
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    (folder / f"{MANIFEST_NAME}.tmp").symlink_to(victim)
    _, manifest = prepare_local(str(folder))
    assert victim.read_text() == "root's file"
    assert read_manifest(folder) == manifest and not (folder / MANIFEST_NAME).is_symlink()
    write_manifest(folder, manifest)
    assert victim.read_text() == "root's file"


def test_the_ref_is_never_written_through_a_planted_temporary_link(hub, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    refs = tmp_path / "cache" / "models--test-org--tiny" / "refs"
    refs.mkdir(parents=True)
    (refs / "main.tmp").symlink_to(victim)
    src = source(hub, tmp_path, revision="main")
    pulled = pull(src, list_model(src))
    assert victim.read_text() == "root's file"
    assert (refs / "main").read_text() == hub.repo.commit and not (refs / "main").is_symlink()
    assert pulled.manifest == read_manifest(Path(pulled.location.folder))


# --- point 4: the token only over https to the default hub, no proxy --------------------------------


def test_the_token_goes_to_another_endpoint_only_with_the_opt_in(tmp_path):
    env = {"HF_TOKEN": "hf_secretNeverSent", "HF_HOME": str(tmp_path)}
    default = hub_source("org/m", "", "", env)
    assert default.token == "hf_secretNeverSent" and default.endpoint == ""
    mirror = hub_source("org/m", "", "", {**env, "HF_ENDPOINT": "https://mirror.example"})
    assert mirror.token is None and "DSPARK_HUB_TOKEN_TO_ENDPOINT=1" in mirror.token_withheld
    assert (
        hub_source("org/m", "", "", {**env, "HF_ENDPOINT": "https://mirror.example"}, token_to_endpoint=True).token
        == "hf_secretNeverSent"
    )


@pytest.mark.parametrize("endpoint", ["http://hub.example", "http://10.1.2.3:8080", "ftp://hub.example"])
def test_a_token_over_plain_http_is_refused_with_one_line(tmp_path, endpoint):
    from dspark_launch.config.settings import resolve as load_settings
    from dspark_launch.model.onnodes import wanted_model

    env_file = tmp_path / "dspark.env"
    env_file.write_text(f"DSPARK_MODEL={REPO_ID}\nDSPARK_HUB_TOKEN_TO_ENDPOINT=1\n")
    settings = load_settings(env_file=str(env_file), environ={})
    with pytest.raises(ConfigError) as info:
        wanted_model(settings, {"HF_ENDPOINT": endpoint, "HF_TOKEN": "hf_secretNeverSent", "HF_HOME": str(tmp_path)})
    message = str(info.value)
    assert "\n" not in message and f"HF_ENDPOINT={endpoint}" in message and "clear text" in message
    assert "hf_secretNeverSent" not in message and info.value.exit_code == 2
    # without a token nothing can leak: the same endpoint is fine
    assert wanted_model(settings, {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path)}).source.endpoint == endpoint


def test_a_gated_hub_at_another_endpoint_gets_no_token_without_the_opt_in(tmp_path):
    secret = "hf_theRightTokenNeverSent"
    repo = HubRepo.from_folder(REPO_ID, write_tiny_model(tmp_path / "src"), gated_token=secret)
    with HubServer(repo) as server:
        env = {"HF_ENDPOINT": server.endpoint, "HF_TOKEN": secret, "HF_HOME": str(tmp_path)}
        src = hub_source(REPO_ID, "", str(tmp_path / "cache"), env)
        with pytest.raises(ModelAccessError) as info:
            list_model(src)
        assert server.authorizations == []
        assert list_model(
            hub_source(REPO_ID, "", str(tmp_path / "cache"), env, token_to_endpoint=True, trusted_http=server.endpoint)
        ).commit
    assert "DSPARK_HUB_TOKEN_TO_ENDPOINT=1" in str(info.value) and secret not in str(info.value)


class _Proxy:
    """A loopback listener standing in for the operator's proxy: records every request's headers."""

    def __init__(self):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _any(self):
                seen.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(502)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_CONNECT = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def proxy(monkeypatch):
    listener = _Proxy()
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, listener.url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield listener
    listener.close()


def test_the_pull_ignores_proxy_variables_unless_opted_in(tmp_path, proxy):
    secret = "hf_theRightTokenNeverProxied"
    repo = HubRepo.from_folder(REPO_ID, write_tiny_model(tmp_path / "src"), gated_token=secret)
    with HubServer(repo) as server:
        src = HubSource(REPO_ID, "", str(tmp_path / "cache"), server.endpoint, secret)
        pulled = pull(src, list_model(src))
        assert proxy.seen == [] and f"Bearer {secret}" in server.authorizations
        assert verify_model(pulled.location.folder, pulled.manifest).ok
        # the guard: opted in, the same client does go to the proxy (which answers 502)
        with pytest.raises(ModelError):
            list_model(HubSource(REPO_ID, "", str(tmp_path / "cache2"), server.endpoint, "hf_guard", proxy=True))
        assert any(h.get("authorization") == "Bearer hf_guard" for h in proxy.seen)
        seen = len(proxy.seen)
        assert list_model(src).commit == repo.commit and len(proxy.seen) == seen  # direct again


# --- point 6: model folders and caches trusted only when only the serving user (or root) writes them ----

NOBODY = 65534


def _fast_check(folder: Path, stamp: str, caches: tuple[str, ...] = ()):
    from dspark_launch.agent.handlers.model import model_fast_check

    return model_fast_check(p.ModelFastCheck(str(folder), stamp, caches), lambda progress: None)


def _refused(folder: Path, stamp: str, caches: tuple[str, ...] = ()) -> str:
    with pytest.raises(p.OperationFailed) as info:
        _fast_check(folder, stamp, caches)
    return info.value.failure.detail


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.fixture
def placed(tmp_path):
    folder = write_tiny_model(tmp_path / "models" / "m")
    for path in [tmp_path / "models", *folder.rglob("*"), folder]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    _, manifest = prepare_local(str(folder))
    assert _fast_check(folder, manifest.stamp).ok
    return folder, manifest


@needs_root
def test_a_model_file_of_another_user_is_refused_at_start(placed):
    folder, manifest = placed
    os.chown(folder / "tokenizer_config.json", NOBODY, NOBODY)
    detail = _refused(folder, manifest.stamp)
    assert f"{folder / 'tokenizer_config.json'} is owned by uid {NOBODY}" in detail and "\n" not in detail


@pytest.mark.parametrize("where", ["folder", "file", "subfolder"])
def test_a_model_folder_or_file_others_can_write_is_refused(placed, where):
    folder, manifest = placed
    target = {"folder": folder, "file": folder / "config.json", "subfolder": folder / "sub"}[where]
    if where == "subfolder":
        target.mkdir(mode=0o755)
    target.chmod(0o777 if where != "file" else 0o666)
    assert "group or others can write it" in _refused(folder, manifest.stamp)


def test_a_link_out_of_the_model_folder_is_refused_at_start(placed, tmp_path):
    folder, manifest = placed
    (tmp_path / "evil.py").write_text("import os\n")
    (folder / "modeling_extra.py").symlink_to(tmp_path / "evil.py")
    assert "outside" in _refused(folder, manifest.stamp)


def test_a_hub_cache_others_can_write_is_refused(hub, tmp_path):
    src = source(hub, tmp_path)
    pulled = pull(src, list_model(src))
    assert _fast_check(Path(pulled.location.folder), pulled.manifest.stamp).ok
    (tmp_path / "cache").chmod(0o777)  # DSPARK_MODEL_CACHE: anyone could plant a repo folder there
    assert f"model cache {tmp_path / 'cache'} has mode 0777" in _refused(
        Path(pulled.location.folder), pulled.manifest.stamp
    )


@needs_root
def test_the_container_model_cache_is_checked_too(placed, tmp_path):
    folder, manifest = placed
    cache = tmp_path / "hf-home"
    cache.mkdir(mode=0o755)
    assert _fast_check(folder, manifest.stamp, (str(cache),)).ok
    os.chown(cache, NOBODY, NOBODY)
    assert f"model cache {cache} is owned by uid {NOBODY}" in _refused(folder, manifest.stamp, (str(cache),))


@needs_root
def test_in_a_launcher_container_the_state_folders_owner_may_own_the_model(placed, tmp_path, monkeypatch):
    """A root agent in a rootful container: the operator's folders are theirs on the host (safe_path.log_owner)."""
    from dspark_launch.node.safe_path import CONTAINER_STATE_VAR

    folder, manifest = placed
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    assert "is owned by uid" in _refused(folder, manifest.stamp)
    monkeypatch.setenv(CONTAINER_STATE_VAR, str(state))
    assert _fast_check(folder, manifest.stamp).ok


def test_the_start_check_hashes_code_config_and_tokenizer(placed):
    """Same size, other bytes (a Python module or config swapped in): found at every start, while a
    shard's bytes are only sized there (`dspark model verify` hashes them)."""
    from dspark_launch.node.model_files import CORRUPT

    folder, manifest = placed
    config = folder / "config.json"
    text = config.read_text()
    config.write_text(text.replace("64", "65"))
    report = _fast_check(folder, manifest.stamp)
    assert [(q.path, q.kind) for q in report.problems] == [("config.json", CORRUPT)]
    assert report.bytes_checked == sum(f.size for f in manifest.files if not f.path.endswith(".safetensors"))


@needs_root
def test_the_copy_belongs_to_the_receiving_user_and_nobody_else_can_write_it(tmp_path):
    """The real rsync options (local to local, as root): the head's file of another user, group-writable,
    arrives as the receiver's, without group/other write (rsync -a alone kept uid 65534 and mode 0664)."""
    from dspark_launch.model.copy import SSHTarget, rsync_argv

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "config.json").write_text("{}")
    os.chown(src / "config.json", NOBODY, NOBODY)
    (src / "config.json").chmod(0o664)
    (tmp_path / "list").write_text("config.json\n")
    argv = rsync_argv(SSHTarget("10.0.0.2"), str(src), str(tmp_path / "list"), force=False)
    local = argv[: argv.index("-e")] + ["--", f"{src}/", f"{dst}/"]
    subprocess.run(local, check=True, capture_output=True)
    st = (dst / "config.json").stat()
    assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid()) and not st.st_mode & 0o022


@pytest.mark.parametrize("sha", ["../../../x", "/etc", "abc", ""])
def test_a_commit_that_is_not_a_folder_name_is_refused(hub, tmp_path, sha):
    """The hub's commit names the snapshot folder the manifest is written into."""
    hub.repo = type(hub.repo)(hub.repo.repo_id, sha, hub.repo.files)
    with pytest.raises(ModelError, match="40 hex digits"):
        list_model(source(hub, tmp_path))


def test_a_ref_that_is_not_a_folder_name_finds_no_pulled_model(hub, tmp_path):
    from dspark_launch.model.workflow import pulled_model

    src = source(hub, tmp_path, revision="main")
    pulled = pull(src, list_model(src))
    assert pulled_model(src) == (pulled.location, pulled.manifest)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_manifest(elsewhere, pulled.manifest)
    (Path(pulled.location.root) / "refs" / "main").write_text(f"../../../{elsewhere.name}")
    assert pulled_model(src) is None


def test_the_model_commands_without_node_containers_check_the_folders_too(placed, tmp_path, monkeypatch, clean_environ):
    """With a container runtime `dspark model pull|verify|status` reach the nodes without their containers
    (head: the launcher's Python; workers: a `--rm` container): the same folder checks run there, the
    container model cache included, before a size or hash (here every node's agent is a local process)."""
    from dspark_launch.agent.transport import LocalTransport
    from dspark_launch.cluster import containers
    from dspark_launch.cluster.spec import cluster_spec
    from dspark_launch.config.settings import resolve
    from dspark_launch.errors import ClusterFailure
    from dspark_launch.model.onnodes import where_weights_live

    folder, manifest = placed
    cache = tmp_path / "hf-home"
    cache.mkdir(mode=0o755)
    settings = resolve(
        env_file="/dev/null",
        environ={
            **clean_environ,
            "DSPARK_RUNTIME": "podman",
            "DSPARK_IMAGE": "nvcr.io/nvidia/vllm@sha256:" + "a" * 64,
            "DSPARK_HEAD_IP": "10.213.0.1",
            "DSPARK_WORKER_HOSTS": "10.213.0.2",
            "DSPARK_FABRIC_IFNAME": "fab0",
            "DSPARK_STATE_DIR": str(tmp_path / "state"),
            "DSPARK_CONTAINER_MODEL_CACHE": str(cache),
        },
    )
    spec = cluster_spec(settings)
    monkeypatch.setattr(containers, "model_transports", lambda spec: {n.name: LocalTransport() for n in spec.nodes})
    ops = where_weights_live(spec)
    assert [op.caches for op in ops] == [(str(cache),)] * 2
    assert all(op.verify(str(folder), manifest, True, only=("config.json",)).ok for op in ops)
    assert all(op.placement(str(folder), str(folder), manifest).verified_stamp == manifest.stamp for op in ops)
    cache.chmod(0o777)
    for op in ops:
        with pytest.raises(ClusterFailure, match=f"model cache {cache} has mode 0777"):
            op.placement(str(folder), str(folder), manifest)
        with pytest.raises(ClusterFailure, match=f"model cache {cache} has mode 0777"):
            op.verify(str(folder), manifest, True, only=("config.json",))
        with pytest.raises(ClusterFailure, match=f"model cache {cache} has mode 0777"):
            op.fast_check(str(folder), manifest.stamp)


def test_a_loopback_http_endpoint_gets_the_token_only_when_named_as_trusted(tmp_path):
    """Issue 30, risk 8: a loopback mirror that is down leaves its port to any local user; plain http gets
    the token only when DSPARK_HUB_TRUSTED_HTTP_ENDPOINT names exactly that endpoint."""
    from dspark_launch.config.settings import resolve as load_settings
    from dspark_launch.model.onnodes import wanted_model

    env_file = tmp_path / "dspark.env"
    env_file.write_text(f"DSPARK_MODEL={REPO_ID}\nDSPARK_HUB_TOKEN_TO_ENDPOINT=1\n")
    environ = {"HF_ENDPOINT": "http://127.0.0.1:8081", "HF_TOKEN": "hf_secretNeverSent", "HF_HOME": str(tmp_path)}
    with pytest.raises(ConfigError) as info:
        wanted_model(load_settings(env_file=str(env_file), environ={}), environ)
    message = str(info.value)
    assert "clear text" in message and "DSPARK_HUB_TRUSTED_HTTP_ENDPOINT" in message and "hf_secret" not in message
    for other in ("http://127.0.0.1:8082", "http://localhost:8081"):  # another port, another spelling
        settings = load_settings(env_file=str(env_file), environ={"DSPARK_HUB_TRUSTED_HTTP_ENDPOINT": other})
        with pytest.raises(ConfigError):
            wanted_model(settings, environ)
    settings = load_settings(
        env_file=str(env_file), environ={"DSPARK_HUB_TRUSTED_HTTP_ENDPOINT": "http://127.0.0.1:8081/"}
    )
    assert wanted_model(settings, environ).source.token == "hf_secretNeverSent"
