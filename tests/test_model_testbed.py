"""Model weights on the two-node testbed: copy to the worker over real SSH with rsync, verify there,
repair only what is bad, refuse a too-small disk before any byte. Run under the heavy lock.

The launcher side runs inside the head node (tests/support/model_runner.py); node-side checks run through
each node's agent (tests/support/model_nodes.py). The worker gets its own
disk at the cache path: a bind mount (or a small tmpfs) inside its mount namespace only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from dspark_launch.agent.transport import SSHTransport
from dspark_launch.model.copy import SSHTarget
from dspark_launch.model.hub import HubSource, list_model, pull
from dspark_launch.model.local_model import prepare_local
from dspark_launch.model.location import ModelLocation, hub_cache_location
from dspark_launch.node.manifest import Manifest, ManifestFile
from dspark_launch.node.model_files import CORRUPT, PARTIAL, verify_model
from tests.support.hub_server import HubRepo, HubServer, online_hub, write_tiny_model
from tests.support.model_nodes import bind_in_node, report_from, tmpfs_in_node, umount_in_node

pytestmark = pytest.mark.testbed
REPO_ROOT = Path(__file__).resolve().parent.parent
REPO_ID = "test-org/tiny"


def shard(n: int) -> str:
    return f"model-{n:05d}-of-00003.safetensors"


def worker_target(tb) -> SSHTarget:
    """The worker as the launcher reaches it (same settings as tests/support/launcher_env.cluster_values)."""
    transport = SSHTransport(
        host=tb.workers[0].ip,
        python=f"{tb.venv}/bin/python",
        user="root",
        key=tb.ssh_key,
        host_key_check="accept-new",
        extra_options=("-o", f"UserKnownHostsFile={tb.known_hosts}"),
    )
    return SSHTarget.from_transport(transport)


def on_head(tb, op: str, location: ModelLocation | None, manifest: Manifest | None, **extra) -> dict:
    target = worker_target(tb)
    request = {
        "op": op,
        "target": asdict(target),
        "python": f"{tb.venv}/bin/python",
        "worker": "worker1",
        "location": asdict(location) if location else None,
        "manifest": manifest.to_json() if manifest else None,
        **extra,
    }
    proc = tb.exec(
        tb.head,
        [f"{tb.venv}/bin/python", "-m", "tests.support.model_runner"],
        input=json.dumps(request),
        cwd=str(REPO_ROOT),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _hub_online(monkeypatch):
    online_hub(monkeypatch)


@pytest.fixture
def scratch(testbed):
    root = Path(f"/tmp/dspm-{os.getpid()}")
    root.mkdir(exist_ok=True)
    mounted: list[str] = []
    yield root, mounted
    for path in mounted:
        umount_in_node(testbed, testbed.workers[0], path)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def hub(tmp_path):
    with HubServer(HubRepo.from_folder(REPO_ID, write_tiny_model(tmp_path / "src"))) as server:
        yield server


def test_pull_copy_verify_then_repair_only_the_damaged_shards(testbed, scratch, hub):
    root, mounted = scratch
    cache, worker_disk = root / "cache", root / "worker-disk"
    worker_disk.mkdir()
    bind_in_node(testbed, testbed.workers[0], str(worker_disk), str(cache))
    mounted.append(str(cache))
    src = HubSource(REPO_ID, "", str(cache), hub.endpoint)
    pulled = pull(src, list_model(src))
    location, manifest = pulled.location, pulled.manifest

    first = on_head(testbed, "sync", location, manifest)
    assert "error" not in first, first
    assert set(first["copy"]["files_sent"]) == set(location.storage_paths(manifest)) | {"refs/main"}
    assert first["repair"] is None and first["report"]["problems"] == []
    assert verify_model(location.folder, manifest).ok  # head
    assert report_from(on_head(testbed, "verify", location, manifest)).ok  # worker, full
    assert report_from(on_head(testbed, "fast_check", location, manifest)).ok
    # the worker's hub cache answers an offline load by branch name, as vllm serve will ask it
    offline = testbed.exec(
        testbed.workers[0],
        [
            f"{testbed.venv}/bin/python",
            "-c",
            "import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(sys.argv[1], revision='main', "
            "cache_dir=sys.argv[2], local_files_only=True))",
            REPO_ID,
            str(cache),
        ],
        env={"HF_HUB_OFFLINE": "1"},
        check=True,
    )
    assert offline.stdout.strip() == location.folder
    # the worker's copy is its own (a separate disk), not the head's files
    worker_folder = worker_disk / Path(location.folder).relative_to(cache)
    assert (worker_folder / shard(1)).resolve().is_relative_to(worker_disk)
    # a re-pull of the unchanged model: nothing sent (not even the manifest), nothing hashed there
    manifest_mtime = (worker_folder / ".dspark-manifest.json").stat().st_mtime_ns
    repeat = on_head(testbed, "sync", location, manifest)
    assert repeat["copy"]["files_sent"] == [] and repeat["report"]["bytes_checked"] == 0, repeat
    assert repeat["calls"]["worker1"] == ["model_placement_query"] and len(repeat["rsync_runs"]) == 1, repeat  # counted
    assert (worker_folder / ".dspark-manifest.json").stat().st_mtime_ns == manifest_mtime
    everything = on_head(testbed, "sync", location, manifest, full=True)  # --verify: every file hashed there
    assert everything["copy"]["files_sent"] == [] and everything["report"]["bytes_checked"] == manifest.total_size

    blob1, blob2 = ((worker_folder / shard(n)).resolve() for n in (1, 2))
    with open(blob1, "r+b") as fh:
        fh.truncate(1234)
    stat = blob2.stat()
    with open(blob2, "r+b") as fh:  # bit rot: one byte, size and mtime unchanged
        fh.seek(4321)
        byte = fh.read(1)
        fh.seek(4321)
        fh.write(bytes([byte[0] ^ 0x01]))
    os.utime(blob2, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    damaged = report_from(on_head(testbed, "verify", location, manifest))
    assert {p.path: p.kind for p in damaged.problems} == {shard(1): PARTIAL, shard(2): CORRUPT}
    fast = report_from(on_head(testbed, "fast_check", location, manifest))
    assert [(p.path, p.kind) for p in fast.problems] == [(shard(1), PARTIAL)]  # sizes only: the flip needs --verify

    downloads = len([r for r in hub.requests if r.method == "GET"])
    second = on_head(testbed, "sync", location, manifest, full=True)  # the flip needs --verify
    blob_rel = [p for p in location.storage_paths(manifest, (shard(1),)) if p.startswith("blobs/")]
    assert second["copy"]["files_sent"] == blob_rel  # rsync's size check: the truncated shard only
    repaired = set(second["repair"]["files_sent"])  # the worker's checksum named the flipped one
    assert repaired and repaired <= set(location.storage_paths(manifest, (shard(2),)))
    assert second["report"]["problems"] == []
    assert report_from(on_head(testbed, "verify", location, manifest)).ok
    assert len([r for r in hub.requests if r.method == "GET"]) == downloads  # the head was not pulled again


def test_a_worker_disk_too_small_is_refused_before_any_byte(testbed, scratch, hub):
    root, mounted = scratch
    cache = root / "small"
    tmpfs_in_node(testbed, testbed.workers[0], str(cache), "256k")
    mounted.append(str(cache))
    src = HubSource(REPO_ID, "", str(cache), hub.endpoint)
    listing = list_model(src)
    location = hub_cache_location(str(cache), REPO_ID, listing.commit)

    before_pull = on_head(testbed, "check_disk", location, listing.expected())
    assert before_pull["error"] == "InsufficientDisk"
    assert before_pull["message"].startswith("not enough disk: worker1: ") and "head" not in before_pull["message"]
    assert not [r for r in hub.requests if r.method == "GET" and r.kind in ("resolve", "cdn")]

    pulled = pull(src, listing)  # the head has room; the copy is refused the same way
    copy = on_head(testbed, "sync", location, pulled.manifest)
    assert copy["error"] == "InsufficientDisk" and "worker1" in copy["message"]
    left = testbed.exec(testbed.workers[0], ["find", str(cache), "-mindepth", "1"], check=True).stdout
    assert left == ""


def test_a_local_model_folder_is_copied_and_verified_the_same_way(testbed, scratch):
    root, mounted = scratch
    folder, worker_disk = root / "local-model", root / "worker-local"
    write_tiny_model(folder)
    worker_disk.mkdir()
    bind_in_node(testbed, testbed.workers[0], str(worker_disk), str(folder))
    mounted.append(str(folder))
    placed = on_head(testbed, "place_local", None, None, folder=str(folder))
    assert "error" not in placed, placed
    location, manifest = prepare_local(str(folder))  # the manifest the head wrote
    assert placed["manifest"]["files"] and len(placed["manifest"]["files"]) == len(manifest.files)
    assert sorted(placed["workers"][0]["copy"]["files_sent"]) == sorted(f.path for f in manifest.files)
    assert (worker_disk / ".dspark-manifest.json").read_text() == (folder / ".dspark-manifest.json").read_text()
    assert report_from(on_head(testbed, "fast_check", location, manifest)).ok

    # A re-pull of the unchanged folder, counted: nothing hashed on either node, nothing sent, one agent
    # call per node (sizes, free space and the verified stamp at once) and one rsync round, nothing more.
    manifest_mtime = (worker_disk / ".dspark-manifest.json").stat().st_mtime_ns
    again = on_head(testbed, "place_local", None, None, folder=str(folder))
    assert again["hashed_bytes"] == 0 and again["workers"][0]["copy"]["files_sent"] == [], again
    assert again["workers"][0]["report"]["bytes_checked"] == 0 and again["workers"][0]["repair"] is None
    assert again["calls"] == {"head": ["model_placement_query"], "worker1": ["model_placement_query"]}, again["calls"]
    assert len(again["rsync_runs"]) == 1, again["rsync_runs"]
    assert (worker_disk / ".dspark-manifest.json").stat().st_mtime_ns == manifest_mtime

    # A file changed on the worker (other size) is still found: sent again and hashed there, alone.
    changed = max(manifest.files, key=lambda f: f.size)
    with open(worker_disk / changed.path, "r+b") as fh:
        fh.truncate(changed.size // 2)
    mended = on_head(testbed, "place_local", None, None, folder=str(folder))
    assert mended["workers"][0]["copy"]["files_sent"] == [changed.path], mended
    assert mended["workers"][0]["report"]["bytes_checked"] == changed.size and mended["hashed_bytes"] == 0
    assert mended["calls"]["worker1"] == ["model_placement_query", "model_verify"], mended["calls"]
    assert report_from(on_head(testbed, "verify", location, manifest)).ok


def test_pull_everywhere_from_a_hub_on_the_heads_loopback(testbed, scratch, tmp_path):
    """The whole `dspark model pull` path inside the head node: the hub answers on the head's own
    loopback (nothing else reachable), disk checks on both nodes, download, copy, verify."""
    root, mounted = scratch
    cache, worker_disk = root / "cache-e2e", root / "worker-e2e"
    worker_disk.mkdir()
    bind_in_node(testbed, testbed.workers[0], str(worker_disk), str(cache))
    mounted.append(str(cache))
    src = write_tiny_model(tmp_path / "src")
    server = testbed.popen(
        testbed.head,
        [f"{testbed.venv}/bin/python", "-m", "tests.support.hub_server", str(src)],
        cwd=str(REPO_ROOT),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        endpoint = server.stdout.readline().strip()
        source = {"repo_id": REPO_ID, "revision": "main", "cache_dir": str(cache), "endpoint": endpoint}
        placed = on_head(testbed, "pull_everywhere", None, None, source=source)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert "error" not in placed, placed
    assert [d["node"] for d in placed["disk"]] == ["head", "worker1"]
    assert all(d["payload_bytes"] == sum(f.stat().st_size for f in src.iterdir()) for d in placed["disk"])
    sync = placed["workers"][0]
    assert sync["node"] == "worker1" and sync["report"]["problems"] == [] and sync["repair"] is None
    m = placed["manifest"]
    manifest = Manifest(m["source"], m["revision"], tuple(ManifestFile(**f) for f in m["files"]))
    location = ModelLocation(**placed["location"])
    assert location.folder.startswith(str(cache)) and manifest.revision == Path(location.folder).name
    assert report_from(on_head(testbed, "verify", location, manifest)).ok  # worker, full sha256
    assert verify_model(location.folder, manifest).ok  # head
    assert (worker_disk / Path(location.folder).relative_to(cache) / ".dspark-manifest.json").is_file()


def test_the_workers_copy_belongs_to_the_serving_user_and_a_planted_file_is_refused(testbed, scratch):
    """Issue 22 point 6: the head's file of another user (group-writable) arrives on the worker as the
    SSH user's (root here), closed to others; a worker file then given to another user makes the
    worker's start check refuse, naming it."""
    from dspark_launch.model.location import local_location

    root, mounted = scratch
    cache, worker_disk = root / "cache", root / "worker-disk"
    worker_disk.mkdir()
    bind_in_node(testbed, testbed.workers[0], str(worker_disk), str(cache))
    mounted.append(str(cache))
    folder = write_tiny_model(cache / "m")
    location, manifest = prepare_local(str(folder))
    assert location == local_location(str(folder))
    os.chown(folder / "config.json", 65534, 65534)
    (folder / "config.json").chmod(0o664)
    synced = on_head(testbed, "sync", location, manifest)
    assert "error" not in synced, synced
    copied = (worker_disk / "m" / "config.json").stat()
    assert copied.st_uid == 0 and not copied.st_mode & 0o022
    assert report_from(on_head(testbed, "fast_check", location, manifest)).ok
    os.chown(worker_disk / "m" / "tokenizer.json", 65534, 65534)
    refused = on_head(testbed, "fast_check", location, manifest)
    assert refused.get("error") == "ClusterFailure", refused
    assert f"{cache}/m/tokenizer.json is owned by uid 65534" in refused["message"]
