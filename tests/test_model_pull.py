"""Model pull and checks with the real huggingface_hub client against a loopback hub (no testbed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dspark_launch.model.errors import ModelAccessError
from dspark_launch.model.hub import list_model, pull, resolve_token
from dspark_launch.model.local_model import prepare_local
from dspark_launch.node.manifest import MANIFEST_NAME, read_manifest
from dspark_launch.node.model_files import CORRUPT, MISSING, OVERSIZED, PARTIAL, STALE, fast_check, verify_model
from tests.support.hub_server import TINY_REPO_ID, HubRepo, HubServer, tiny_hub_source, write_tiny_model

REPO_ID = TINY_REPO_ID
REPO_ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("hub_online")  # the loopback hub; `hub` is a shared fixture


source = tiny_hub_source


def shard(n: int) -> str:
    return f"model-{n:05d}-of-00003.safetensors"


def test_pull_writes_a_manifest_with_the_hubs_sha256_and_verifies_clean(hub, tmp_path):
    listing = list_model(source(hub, tmp_path))
    assert listing.commit == hub.repo.commit and listing.total_size == hub.repo.total_size
    pulled = pull(source(hub, tmp_path), listing)
    folder = pulled.location.folder
    assert folder.endswith(f"models--test-org--tiny/snapshots/{hub.repo.commit}")
    assert read_manifest(Path(folder)) == pulled.manifest
    by_path = {f.path: f for f in pulled.manifest.files}
    for f in hub.repo.files:
        assert by_path[f.path].size == len(f.data) and by_path[f.path].sha256 == f.sha256
    assert verify_model(folder, pulled.manifest).ok
    assert fast_check(folder, pulled.manifest.stamp).ok
    assert pulled.refetched == ()


def test_pull_by_branch_pins_the_commit_the_hub_names(hub, tmp_path):
    listing = list_model(source(hub, tmp_path, revision="main"))
    assert listing.commit == hub.repo.commit
    pulled = pull(source(hub, tmp_path, revision="main"), listing)
    assert (Path(pulled.location.root) / "refs" / "main").read_text() == hub.repo.commit
    # the cache serves offline by branch name, as vLLM will load it
    from huggingface_hub import snapshot_download

    offline = snapshot_download(REPO_ID, revision="main", cache_dir=str(tmp_path / "cache"), local_files_only=True)
    assert offline == pulled.location.folder


def test_a_connection_cut_mid_file_resumes_with_a_range_request(tmp_path):
    # the client keeps what it received in 10 MiB chunks: cut after 15 MiB of a 24 MiB shard
    repo = HubRepo.from_folder(REPO_ID, write_tiny_model(tmp_path / "src", shard_bytes=24 << 20))
    with HubServer(repo) as server:
        server.cut_next(shard(2), 15 << 20)
        pulled = pull(source(server, tmp_path), list_model(source(server, tmp_path)))
        gets = server.downloads(shard(2))
    assert [r.range for r in gets] == ["", f"bytes={10 << 20}-"]
    assert gets[1].status == 206
    assert verify_model(pulled.location.folder, pulled.manifest).ok


def test_a_pull_killed_mid_file_then_run_again_completes_and_fetches_only_what_was_missing(hub, tmp_path):
    hub.stall_next(shard(2), 100_000)
    script = (
        "import sys; from dspark_launch.model.hub import HubSource, list_model, pull;"
        "s = HubSource(sys.argv[1], '', sys.argv[2], sys.argv[3]); pull(s, list_model(s))"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, REPO_ID, str(tmp_path / "cache"), hub.endpoint],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    blobs = tmp_path / "cache" / "models--test-org--tiny" / "blobs"
    others = {(f.sha256 if f.lfs else f.blob_id) for f in hub.repo.files if f.path != shard(2)}

    def whole_blobs() -> set[str]:
        return {p.name for p in blobs.iterdir() if not p.name.endswith(".incomplete")} if blobs.is_dir() else set()

    try:  # killed once shard 2 is stuck mid-file and every other file is whole
        deadline = time.monotonic() + 60
        while not (hub.downloads(shard(2)) and others <= whole_blobs()) and time.monotonic() < deadline:
            assert child.poll() is None, "the pull ended before it was killed"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
    complete = whole_blobs()
    assert hub.repo.file(shard(2)).sha256 not in complete  # killed mid-file
    before = len(hub.requests)
    pulled = pull(source(hub, tmp_path), list_model(source(hub, tmp_path)))
    again = {r.path for r in hub.requests[before:] if r.method == "GET" and r.kind in ("resolve", "cdn")}
    assert shard(2) in again
    fetched_again = {f.path for f in hub.repo.files if f.path in again}
    finished_first = {f.path for f in hub.repo.files if (f.sha256 if f.lfs else f.blob_id) in complete}
    assert finished_first and not (fetched_again & finished_first)
    assert verify_model(pulled.location.folder, pulled.manifest).ok


def test_a_corrupt_file_in_the_head_cache_is_fetched_again_alone(hub, tmp_path):
    src = source(hub, tmp_path)
    first = pull(src, list_model(src))
    target = Path(first.location.folder) / shard(3)
    blob = target.resolve()
    data = bytearray(blob.read_bytes())
    data[1000] ^= 0xFF
    blob.write_bytes(bytes(data))
    before = len(hub.requests)
    again = pull(src, list_model(src))
    fetched = {r.path for r in hub.requests[before:] if r.method == "GET" and r.kind in ("resolve", "cdn")}
    assert again.refetched == (shard(3),) and fetched == {shard(3)}
    assert verify_model(again.location.folder, again.manifest).ok


@pytest.mark.parametrize(
    "token, status, words", [(None, 401, "no token found"), ("hf_wrong", 403, "token was refused")]
)
def test_gated_repo_without_or_with_a_wrong_token_is_one_line_exit_1(tmp_path, token, status, words):
    secret = "hf_theRightTokenNeverPrinted"
    repo = HubRepo.from_folder(REPO_ID, write_tiny_model(tmp_path / "src"), gated_token=secret)
    with HubServer(repo) as server:
        with pytest.raises(ModelAccessError) as info:
            list_model(source(server, tmp_path, token=token))
        assert not server.downloads(shard(1))
        ok = list_model(source(server, tmp_path, token=secret))  # the right token passes
    message = str(info.value)
    assert "\n" not in message and words in message and f"HTTP {status}" in message and REPO_ID in message
    assert info.value.exit_code == 1
    assert secret not in message and (token or "@@") not in message
    assert ok.commit == repo.commit


def test_token_comes_from_hf_token_else_the_token_file(tmp_path):
    (tmp_path / "token").write_text("hf_fromfile\n")
    assert resolve_token({"HF_TOKEN": "hf_env", "HF_HOME": str(tmp_path)}) == "hf_env"
    assert resolve_token({"HF_HOME": str(tmp_path)}) == "hf_fromfile"
    assert resolve_token({"HF_TOKEN_PATH": str(tmp_path / "none")}) is None


def test_unknown_revision_is_one_line(hub, tmp_path):
    with pytest.raises(ModelAccessError, match="revision 'v9' not found"):
        list_model(source(hub, tmp_path, revision="v9"))


def test_verify_names_missing_partial_oversized_and_corrupt_files(tmp_path):
    folder = write_tiny_model(tmp_path / "m")
    _, manifest = prepare_local(str(folder))
    (folder / shard(1)).unlink()
    with open(folder / shard(2), "r+b") as fh:
        fh.truncate(1000)
    with open(folder / "config.json", "ab") as fh:
        fh.write(b" ")
    with open(folder / shard(3), "r+b") as fh:
        fh.seek(5)
        fh.write(b"\x00" if fh.read(1) != b"\x00" else b"\x01")
    report = verify_model(str(folder), manifest)
    kinds = {p.path: p.kind for p in report.problems}
    assert kinds == {shard(1): MISSING, shard(2): PARTIAL, "config.json": OVERSIZED, shard(3): CORRUPT}
    fast = fast_check(str(folder), manifest.stamp)
    assert {p.path: p.kind for p in fast.problems} == {shard(1): MISSING, shard(2): PARTIAL, "config.json": OVERSIZED}


def test_fast_check_refuses_a_missing_or_foreign_manifest(tmp_path):
    folder = write_tiny_model(tmp_path / "m")
    _, manifest = prepare_local(str(folder))
    assert fast_check(str(folder), manifest.stamp).ok
    assert [p.kind for p in fast_check(str(folder), "0" * 32).problems] == [STALE]
    (folder / MANIFEST_NAME).unlink()
    assert [p.kind for p in fast_check(str(folder), manifest.stamp).problems] == [STALE]


def test_placement_gives_sizes_free_space_and_the_verified_stamp_in_one_answer(tmp_path):
    """What a copy asks a node before it starts (one agent call): the stamp there is the node's own
    manifest's, "" without one; a file of another size is named; the free space is of the root's disk."""
    from dspark_launch.node.model_files import placement

    folder = write_tiny_model(tmp_path / "m")
    _, manifest = prepare_local(str(folder))
    state = placement(str(folder), str(tmp_path / "not-yet"), manifest)
    assert state.verified_stamp == manifest.stamp and state.sizes.ok and state.sizes.bytes_checked == 0
    assert state.space.checked == str(tmp_path) and state.space.free_bytes > 0
    with open(folder / shard(2), "r+b") as fh:
        fh.truncate(1000)
    (folder / MANIFEST_NAME).unlink()
    state = placement(str(folder), str(folder), manifest)
    assert state.verified_stamp == "" and [(p.path, p.kind) for p in state.sizes.problems] == [(shard(2), PARTIAL)]


def test_local_folder_manifest_is_reused_until_sizes_change(tmp_path):
    folder = write_tiny_model(tmp_path / "m")
    _, first = prepare_local(str(folder))
    assert first.revision == "local" and len(first.files) == 7 and all(f.sha256 for f in first.files)
    _, again = prepare_local(str(folder))
    assert again == first
    (folder / "config.json").write_text("{}")
    _, changed = prepare_local(str(folder))
    assert changed.stamp != first.stamp
    assert os.path.exists(folder / MANIFEST_NAME)


def test_source_from_settings_uses_the_configured_cache_endpoint_and_token(tmp_path):
    from dspark_launch.model.hub import hub_source, is_local_folder

    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_x", "HF_HOME": str(tmp_path)}
    src = hub_source("org/m", "abc", "", env, token_to_endpoint=True, trusted_http="http://127.0.0.1:9")
    assert (src.cache_dir, src.endpoint, src.token) == (str(tmp_path / "hub"), "http://127.0.0.1:9", "hf_x")
    assert hub_source("org/m", "", "/data/hf", env).cache_dir == "/data/hf"
    assert "hf_x" not in repr(src)
    assert is_local_folder(str(tmp_path)) and is_local_folder("./x") and not is_local_folder("org/m")


def test_the_copy_uses_the_launchers_ssh_settings_and_balances_streams(tmp_path):
    from dspark_launch.agent.transport import SSHTransport
    from dspark_launch.model.copy import SSHTarget, _shares, rsync_argv

    transport = SSHTransport(
        host="10.213.0.2",
        python="/usr/bin/python3",
        port=2222,
        user="root",
        key="/k",
        host_key_check="accept-new",
        extra_options=("-o", "UserKnownHostsFile=/kh"),
    )
    target = SSHTarget.from_transport(transport)
    agent_argv = transport.argv()
    agent_options = agent_argv[: agent_argv.index("--")]
    assert target.ssh_argv()[: len(agent_options)] == agent_options  # first: ssh keeps a keyword's first value
    # what the real ssh makes of the copy's options: AES-GCM first, ssh's other defaults kept, no compression
    resolved = subprocess.run(target.ssh_argv() + ["-G", "10.213.0.2"], capture_output=True, text=True, check=True)
    config = dict(line.split(" ", 1) for line in resolved.stdout.splitlines() if " " in line)
    assert config["ciphers"].split(",")[:2] == ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]
    assert "chacha20-poly1305@openssh.com" in config["ciphers"] and config["compression"] == "no"
    assert (config["port"], config["stricthostkeychecking"], config["forwardagent"]) == ("2222", "accept-new", "no")
    argv = rsync_argv(target, "/models/m", "/tmp/list", force=False)
    assert argv[-2:] == ["/models/m/", "10.213.0.2:/models/m/"] and "--ignore-times" not in argv
    assert "--ignore-times" in rsync_argv(target, "/models/m", "/tmp/list", force=True)
    for i, size in enumerate([900, 500, 400, 300, 200, 100]):
        (tmp_path / f"f{i}").write_bytes(b"x" * size)
    shares = _shares(tmp_path, [f"f{i}" for i in range(6)], 3)
    loads = sorted(sum((tmp_path / p).stat().st_size for p in share) for share in shares)
    assert len(shares) == 3 and sorted(p for share in shares for p in share) == [f"f{i}" for i in range(6)]
    assert loads == [700, 800, 900]  # largest first, each to the lightest share


def test_start_preflight_names_the_node_the_first_bad_file_and_the_fix(tmp_path):
    from dspark_launch.model.distribute import require_ready
    from dspark_launch.model.errors import ModelIncomplete

    folder = write_tiny_model(tmp_path / "m")
    _, manifest = prepare_local(str(folder))
    good = fast_check(str(folder), manifest.stamp)
    (folder / shard(2)).unlink()
    bad = fast_check(str(folder), manifest.stamp)
    require_ready([("head", good)])
    with pytest.raises(ModelIncomplete) as info:
        require_ready([("head", good), ("worker1", bad)])
    assert str(info.value).startswith(f"worker1: model not ready: {shard(2)}: missing")
    assert str(info.value).endswith("run `dspark model pull`") and info.value.exit_code == 1


def test_the_pulled_model_is_found_offline_by_branch_or_commit(hub, tmp_path):
    from dspark_launch.model.workflow import pulled_model

    assert pulled_model(source(hub, tmp_path, revision="main")) is None
    src = source(hub, tmp_path, revision="main")
    pulled = pull(src, list_model(src))
    before = len(hub.requests)
    assert pulled_model(src) == (pulled.location, pulled.manifest)
    assert pulled_model(source(hub, tmp_path, revision=hub.repo.commit)) == (pulled.location, pulled.manifest)
    assert len(hub.requests) == before  # no network


@pytest.mark.parametrize("token, words", [(None, "no token found"), ("hf_wrong", "token was refused")])
def test_dspark_model_pull_on_a_gated_repo_is_one_line_exit_1_before_any_node(tmp_path, token, words):
    """Through the real CLI: the hub's listing comes first, so no node is contacted (the configured ones
    are testbed addresses nothing answers on) and nothing is written."""
    from tests.support.launcher_env import run_dspark

    secret = "hf_theRightTokenNeverPrinted"
    repo = HubRepo.from_folder(REPO_ID, write_tiny_model(tmp_path / "src"), gated_token=secret)
    env_file = tmp_path / "dspark.env"
    env_file.write_text(
        f"DSPARK_HEAD_IP=10.213.0.91\nDSPARK_WORKER_HOSTS=root@10.213.0.92\nDSPARK_FABRIC_IFNAME=fab0\n"
        f"DSPARK_MODEL={REPO_ID}\nDSPARK_MODEL_CACHE={tmp_path / 'cache'}\n"
        f"DSPARK_STATE_DIR={tmp_path / 'state'}\nDSPARK_HUB_TOKEN_TO_ENDPOINT=1\n"
    )
    with HubServer(repo) as server:
        with env_file.open("a") as more:  # the loopback hub named as trusted: it gets the token over http
            more.write(f"DSPARK_HUB_TRUSTED_HTTP_ENDPOINT={server.endpoint}\n")
        env = {"HF_ENDPOINT": server.endpoint, "HF_HOME": str(tmp_path / "hf-home")}
        if token:
            env["HF_TOKEN"] = token
        proc = run_dspark(["model", "pull", "--env-file", str(env_file)], env=env)
        assert not server.downloads(shard(1))
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error:")]
    assert proc.returncode == 1 and len(lines) == 1 and words in lines[0] and REPO_ID in lines[0], proc.stderr
    assert secret not in proc.stderr + proc.stdout and "hf_wrong" not in proc.stderr + proc.stdout
    assert not (tmp_path / "cache").exists()


def test_the_model_commands_take_the_model_and_revision_by_the_profiles_rule(tmp_path):
    """The profile's pinned revision belongs to its own model; another model keeps DSPARK_MODEL_REVISION."""
    from dspark_launch.config.settings import resolve as load_settings
    from dspark_launch.model.onnodes import wanted_model
    from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH

    def wanted(**environ):
        env_file = tmp_path / "empty.env"
        env_file.write_text("")
        return wanted_model(load_settings(env_file=str(env_file), environ=environ), {"HF_HOME": str(tmp_path)})

    pin = {d.setting: d.value for d in DEEPSEEK_V4_FLASH.settings}
    profile = wanted()
    assert (profile.name, profile.revision) == (pin["DSPARK_MODEL"], pin["DSPARK_MODEL_REVISION"])
    assert profile.source.repo_id == pin["DSPARK_MODEL"] and profile.source.cache_dir == str(tmp_path / "hub")
    other = wanted(DSPARK_MODEL="org/other", DSPARK_MODEL_CACHE=str(tmp_path / "c"))
    assert (other.name, other.revision, other.source.cache_dir) == ("org/other", "", str(tmp_path / "c"))
    assert wanted(DSPARK_MODEL="org/other", DSPARK_MODEL_REVISION="v2").revision == "v2"
    folder = wanted(DSPARK_MODEL=str(tmp_path))
    assert folder.local and folder.revision == ""


def test_a_re_pull_hashes_only_files_changed_since_unless_rehash(hub, tmp_path):
    src = source(hub, tmp_path)
    first = pull(src, list_model(src))
    assert first.hashed_bytes == first.manifest.total_size  # every file read once
    stamp_before = (Path(first.location.folder) / MANIFEST_NAME).stat().st_mtime_ns
    again = pull(src, list_model(src))
    assert again.hashed_bytes == 0 and again.manifest == first.manifest  # size, mtime, inode unchanged
    assert (Path(first.location.folder) / MANIFEST_NAME).stat().st_mtime_ns == stamp_before  # not rewritten
    blob = (Path(first.location.folder) / shard(2)).resolve()
    os.utime(blob, ns=(blob.stat().st_atime_ns, blob.stat().st_mtime_ns + 1))  # touched: hashed again alone
    touched = pull(src, list_model(src))
    assert touched.hashed_bytes == blob.stat().st_size and touched.refetched == ()
    assert pull(src, list_model(src), rehash=True).hashed_bytes == first.manifest.total_size


def test_a_local_folder_is_hashed_in_parallel_once_and_again_only_where_changed(tmp_path):
    from dspark_launch.model.local_model import prepare_local_counted

    folder = write_tiny_model(tmp_path / "m")
    _, first, hashed = prepare_local_counted(str(folder))
    assert hashed == first.total_size and all(f.inode and f.mtime_ns for f in first.files)
    assert prepare_local_counted(str(folder))[2] == 0
    (folder / "config.json").write_text('{"x": 1}')
    _, changed, hashed = prepare_local_counted(str(folder))
    assert hashed == len('{"x": 1}') and changed.stamp != first.stamp
    assert prepare_local_counted(str(folder), rehash=True)[2] == changed.total_size


def test_the_copy_goes_to_the_fabric_ip_with_the_agents_ssh_settings_in_every_runtime(tmp_path):
    from dspark_launch.cluster.spec import cluster_spec
    from dspark_launch.config.settings import resolve as load_settings
    from dspark_launch.model.onnodes import copy_target

    def target(**values):
        env_file = tmp_path / "c.env"
        env_file.write_text(
            "".join(
                f"{k}={v}\n"
                for k, v in {
                    "DSPARK_HEAD_IP": "10.213.0.1",
                    "DSPARK_WORKER_HOSTS": "admin@spark2.lan",
                    "DSPARK_WORKER_IPS": "10.213.0.2",
                    "DSPARK_FABRIC_IFNAME": "fab0",
                    "SSH_PORT": "2222",
                    "DSPARK_SSH_KEY": "/k",
                    "DSPARK_SSH_OPTIONS": "-o UserKnownHostsFile=/kh",
                    **values,
                }.items()
            )
        )
        spec = cluster_spec(load_settings(env_file=str(env_file), environ={}))
        return copy_target(spec.workers[0])

    for runtime in ("host", "podman", "docker"):  # a container runtime once failed here (no port on its transport)
        fabric = target(DSPARK_RUNTIME=runtime, DSPARK_IMAGE="nvcr.io/nvidia/vllm:26.01-py3")
        assert (fabric.host, fabric.user, fabric.port, fabric.key) == ("10.213.0.2", "admin", 2222, "/k")
        assert fabric.extra_options == ("-o", "UserKnownHostsFile=/kh") and fabric.host_key_check == "yes"
    other = target(DSPARK_MODEL_COPY_HOSTS="copy@10.9.0.2")
    assert (other.host, other.user) == ("10.9.0.2", "copy")


def test_an_unknown_fabric_host_key_is_one_line_naming_the_address_and_the_fix():
    from dspark_launch.model.copy import SSHTarget, rsync_failure

    failure = rsync_failure(
        SSHTarget("10.213.0.2"),
        255,
        "No ED25519 host key is known for 10.213.0.2 and you have "
        "requested strict checking.\nHost key verification failed.\nrsync: connection unexpectedly "
        "closed (0 bytes received so far) [sender]\nrsync error: unexplained error (code 255)\n",
    )
    assert "10.213.0.2" in str(failure) and "not known" in str(failure) and "ssh-keyscan" in str(failure)
    assert "\n" not in str(failure)


def test_rsync_progress_becomes_one_line_per_node_and_the_file_names_stay_apart(tmp_path):
    import subprocess as sp

    from dspark_launch.model.copy import CopyProgress, _read_stream

    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "blobs").mkdir(parents=True)
    (src / "blobs" / "a").write_bytes(os.urandom(3 << 20))
    (src / "b").write_text("small")
    (tmp_path / "list").write_text("blobs/a\nb\n")
    lines: list[str] = []
    meter = CopyProgress("worker1 (10.213.0.2)", (3 << 20) + 5, lines.append, every_s=0.0)
    proc = sp.Popen(
        [
            "rsync",
            "-a",
            "--whole-file",
            f"--files-from={tmp_path / 'list'}",
            "--out-format=%n",
            "--info=progress2",
            f"{src}/",
            f"{dst}/",
        ],
        stdout=sp.PIPE,
    )
    names: list[str] = []
    _read_stream(proc, 0, names, meter)
    assert proc.wait() == 0
    assert sorted(n for n in names if not n.endswith("/")) == ["b", "blobs/a"]
    assert lines and lines[-1].startswith("worker1 (10.213.0.2): copied 0.00 of 0.00 GiB, ")
    assert sum(meter._per_stream.values()) == (3 << 20) + 5 and "MB/s, ETA 0 s" in meter.line()


# An ssh stand-in: the remote command runs here, in a mount namespace of its own in which SPY_DISK (the worker's
# empty disk) is mounted over SPY_OVER, and each receiver notes whether the destination folder was there when it
# started, and when it ended.
_SSH_SPY = r"""#!/bin/bash
while [ $# -gt 0 ] && [ "$1" != rsync ]; do shift; done
[ $# -eq 0 ] && exit 0
exec unshare --mount --propagation private sh -c '
  mount --bind "$SPY_DISK" "$SPY_OVER" || exit 99
  if [ -d "$SPY_DEST" ]; then echo "start found $$" >> "$SPY_LOG"; else echo "start missing $$" >> "$SPY_LOG"; fi
  "$@"; rc=$?
  echo "end $$" >> "$SPY_LOG"
  exit $rc' sh "$@"
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts in a namespace of its own need root")
def test_parallel_streams_find_the_destination_folder_made_before_them(tmp_path, monkeypatch):
    """rsync's receiver makes a missing destination itself (stat, then mkdir), and two streams doing it at once
    fail: `mkdir ... failed: File exists`, exit 11 (seen on the testbed). One rsync makes the folder and ends
    before the streams start, so no stream's receiver has to make it."""
    from dspark_launch.model.copy import SSHTarget, rsync_to

    source = tmp_path / "models" / "m"
    (source / "sub").mkdir(parents=True)
    names = [f"sub/f{i}" for i in range(8)]
    for i, name in enumerate(names):
        (source / name).write_bytes(os.urandom(200_000 + i))
    disk = tmp_path / "worker-disk"
    disk.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(_SSH_SPY)
    (bin_dir / "ssh").chmod(0o755)
    log = tmp_path / "receivers.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SPY_DISK", str(disk))
    monkeypatch.setenv("SPY_OVER", str(tmp_path / "models"))
    monkeypatch.setenv("SPY_DEST", str(source))
    monkeypatch.setenv("SPY_LOG", str(log))

    copied = rsync_to(SSHTarget("worker"), str(source), names, streams=4)

    assert copied.streams == 4 and sorted(copied.files_sent) == names
    assert sorted(p.relative_to(disk / "m").as_posix() for p in (disk / "m").rglob("f*")) == names
    events = [line.split() for line in log.read_text().splitlines()]
    starts = [e for e in events if e[0] == "start"]
    assert [e[1] for e in starts] == ["missing"] + ["found"] * 4, events
    maker = starts[0][2]
    assert events.index(["end", maker]) < events.index(starts[1]), events  # it ended before any stream began
