"""`dspark model pull|verify|status` and the start pre-flight through the real CLI on the two-node
testbed (heavy lock): the tiny served model on a hub running on the head's loopback, pulled into a
cache that is the worker's own disk (a bind mount in its mount namespace), damaged on the worker,
refused by `dspark start`, repaired by a second pull, then served from the copy with the hub gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.launcher_env import launcher_env, scratch
from tests.support.model_nodes import bind_in_node, umount_in_node
from tests.support.on_testbed import VENV_BIN, our_pids, processes_named, serving_env
from tests.support.processes import describe

pytestmark = [pytest.mark.testbed, pytest.mark.serving]
REPO_ROOT = Path(__file__).resolve().parent.parent
REPO_ID = "test-org/tiny"


def model_cli(tb, tmp_path, env_file, *args, endpoint="", timeout=300):
    env = launcher_env(scratch(tmp_path))
    if endpoint:
        env.update({"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0"})  # the test session runs offline
    return tb.exec("head", [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)], env=env, timeout=timeout)


def started_here(tb) -> set[int]:
    """Processes on the nodes other than the loopback hub this test runs on the head."""
    pids = our_pids(tb, "head") | our_pids(tb, "worker1")
    return {pid for pid in pids if b"hub_server" not in _cmdline(pid)}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


@pytest.fixture
def worker_cache(testbed_clean, tmp_path):
    cache, disk = Path(f"/tmp/dspmc-{os.getpid()}/cache"), tmp_path / "worker-disk"
    cache.mkdir(parents=True)
    disk.mkdir()
    bind_in_node(testbed_clean, testbed_clean.workers[0], str(disk), str(cache))
    yield cache, disk
    umount_in_node(testbed_clean, testbed_clean.workers[0], str(cache))
    subprocess.run(["rm", "-rf", str(cache.parent)], check=False)


def test_pull_verify_damage_refuse_repair_then_serve_offline(testbed_clean, tmp_path, tiny_model, worker_cache):
    tb = testbed_clean
    cache, disk = worker_cache
    env = serving_env(tb, tmp_path, tiny_model, DSPARK_MODEL=REPO_ID, DSPARK_MODEL_CACHE=str(cache))
    repo = tmp_path / "hub-repo"  # the served model's files, without the launcher's manifest
    shutil.copytree(tiny_model, repo, ignore=shutil.ignore_patterns(".dspark-manifest.json*"))
    hub = tb.popen(
        tb.head,
        [f"{tb.venv}/bin/python", "-m", "tests.support.hub_server", str(repo)],
        cwd=str(REPO_ROOT),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        endpoint = hub.stdout.readline().strip()
        # never pulled: status and start name the fix, nothing started
        never = model_cli(tb, tmp_path, env, "model", "status")
        assert never.returncode == 1 and "run `dspark model pull`" in never.stderr, never.stderr
        never_start = model_cli(tb, tmp_path, env, "start")
        assert never_start.returncode == 1 and "was never pulled" in never_start.stderr, never_start.stderr
        pulled = model_cli(tb, tmp_path, env, "model", "pull", "--json", endpoint=endpoint)
        assert pulled.returncode == 0, pulled.stderr[-3000:]
        first = json.loads(pulled.stdout)
        assert [d["node"].split()[0] for d in first["disk"]] == ["head", "worker1"]
        folder, commit = Path(first["folder"]), first["revision"]
        assert first["workers"][0]["report"]["problems"] == [] and first["workers"][0]["copy"]["bytes_sent"] > 0

        verified = model_cli(tb, tmp_path, env, "model", "verify", "--json")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        clean = json.loads(verified.stdout)
        assert clean["ok"] and [n["full"] for n in clean["nodes"]] == [True, True]
        assert model_cli(tb, tmp_path, env, "model", "status").returncode == 0

        # the worker's own copy: truncate the weights, flip a byte of the tokenizer (size and mtime kept)
        worker_folder = disk / folder.relative_to(cache)
        weights, tokenizer = (
            (worker_folder / "model.safetensors").resolve(),
            (worker_folder / "tokenizer.json").resolve(),
        )
        assert weights.is_relative_to(disk)
        with open(weights, "r+b") as fh:
            fh.truncate(1000)
        stat = tokenizer.stat()
        with open(tokenizer, "r+b") as fh:
            fh.seek(10)
            byte = fh.read(1)
            fh.seek(10)
            fh.write(bytes([byte[0] ^ 0x01]))
        os.utime(tokenizer, ns=(stat.st_atime_ns, stat.st_mtime_ns))

        damaged = model_cli(tb, tmp_path, env, "model", "verify", "--json")
        assert damaged.returncode == 1
        found = {(p["node"].split()[0], p["path"], p["kind"]) for p in json.loads(damaged.stdout)["problems"]}
        assert found == {("worker1", "model.safetensors", "partial"), ("worker1", "tokenizer.json", "corrupt")}
        refused = model_cli(tb, tmp_path, env, "start")
        assert refused.returncode == 1
        assert "worker1" in refused.stderr and "model.safetensors: partial" in refused.stderr
        assert "run `dspark model pull`" in refused.stderr
        assert started_here(tb) == set()
        full_refused = model_cli(tb, tmp_path, env, "start", "--verify")  # the flip alone needs the full check
        assert full_refused.returncode == 1 and "worker1" in full_refused.stderr

        blob = lambda name: os.readlink(folder / name).split("/")[-1]  # noqa: E731
        plain = model_cli(tb, tmp_path, env, "model", "pull", "--json", endpoint=endpoint)
        assert plain.returncode == 0, plain.stderr[-3000:]
        mended = json.loads(plain.stdout)
        assert mended["hashed_bytes"] == 0  # the head's files are unchanged: nothing hashed there
        assert [p.split("/")[-1] for p in mended["workers"][0]["copy"]["files_sent"] if p.startswith("blobs/")] == [
            blob("model.safetensors")
        ]  # rsync's size check: the truncated one, hashed there alone
        assert mended["workers"][0]["report"]["bytes_checked"] == os.path.getsize(folder / "model.safetensors")
        repaired = model_cli(tb, tmp_path, env, "model", "pull", "--json", "--verify", endpoint=endpoint)
        assert repaired.returncode == 0, repaired.stderr[-3000:]
        sync = json.loads(repaired.stdout)["workers"][0]
        assert [p for p in sync["copy"]["files_sent"] if p.startswith("blobs/")] == []
        assert [p.split("/")[-1] for p in sync["repair"]["files_sent"]] == [blob("tokenizer.json")]  # --verify found it
        assert model_cli(tb, tmp_path, env, "model", "verify").returncode == 0
    finally:
        hub.terminate()
        hub.wait(timeout=10)

    # the hub is gone: start serves the pulled commit from the cache on both nodes, hub offline
    started = model_cli(tb, tmp_path, env, "start", timeout=600)
    assert started.returncode == 0, started.stderr[-4000:]
    ready = [line for line in started.stderr.splitlines() if "model weights ready on 2 node(s)" in line]
    assert ready, started.stderr[-2000:]
    print(ready[0], f"| pull {first['seconds']:.1f} s, copy {first['workers'][0]['copy']['seconds']:.2f} s")
    server = environ_of(json.loads((tmp_path / "state" / "state.json").read_text())["server"]["pid"])
    assert server["HF_HUB_OFFLINE"] == "1" and server["HF_HUB_CACHE"] == str(cache)
    ray_workers = processes_named(tb, "worker1", "RayWorkerProc")
    assert ray_workers, "no vLLM Ray worker on worker1"
    assert environ_of(ray_workers[0]).get("HF_HUB_OFFLINE") == "1"
    cmdline = Path(f"/proc/{json.loads((tmp_path / 'state' / 'state.json').read_text())['server']['pid']}/cmdline")
    assert commit in cmdline.read_bytes().decode().split("\0")
    smoke = model_cli(tb, tmp_path, env, "smoke")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    stopped = model_cli(tb, tmp_path, env, "stop")
    assert stopped.returncode == 0, stopped.stderr
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)


def test_the_copy_goes_to_the_fabric_address_and_needs_that_addresses_host_key(
    testbed_clean, tmp_path, tiny_model, worker_cache
):
    """SSH reaches the worker by a name (`worker1-ssh` in the head's /etc/hosts), the copy by its fabric IP:
    with the worker's key known only under its SSH name, the pull stops naming the fabric address and the fix;
    with the key added for that address, the copy goes there."""
    tb = testbed_clean
    cache, disk = worker_cache
    worker = tb.workers[0]
    folder = cache / "tiny"
    shutil.copytree(tiny_model, folder, ignore=shutil.ignore_patterns(".dspark-manifest.json*"))
    keys = [line for line in Path(tb.known_hosts).read_text().splitlines() if line.split(" ", 1)[0] == worker.ip]
    assert keys, "the testbed's known_hosts holds the worker's key by its IP"
    known = tmp_path / "known_hosts"
    known.write_text("".join(line.replace(worker.ip, "worker1-ssh", 1) + "\n" for line in keys))
    hosts = Path(tb.state_dir, "nodes", "head", "hosts")  # bind-mounted at the head's /etc/hosts
    original = hosts.read_text()
    hosts.write_text(original + f"{worker.ip}\tworker1-ssh\n")
    try:
        env = serving_env(
            tb,
            tmp_path,
            folder,
            DSPARK_WORKER_HOSTS="root@worker1-ssh",
            DSPARK_WORKER_IPS=worker.ip,
            DSPARK_SSH_HOST_KEY_CHECK="yes",
            DSPARK_SSH_OPTIONS=f"-o UserKnownHostsFile={known}",
        )
        refused = model_cli(tb, tmp_path, env, "model", "pull")
        assert refused.returncode == 1, refused.stderr[-2000:]
        assert f"rsync to {worker.ip} failed: the SSH host key of {worker.ip}" in refused.stderr, refused.stderr
        assert "ssh-keyscan" in refused.stderr and refused.stderr.count("dspark: error") == 1
        assert not (disk / "tiny" / "config.json").exists()  # nothing copied

        known.write_text(known.read_text() + "".join(line + "\n" for line in keys))
        pulled = model_cli(tb, tmp_path, env, "model", "pull")
        assert pulled.returncode == 0, pulled.stderr[-3000:]
        assert f"worker1 ({worker.ip}): copied " in pulled.stderr and " MB/s, ETA " in pulled.stderr  # progress line
        assert (disk / "tiny" / "config.json").read_bytes() == (folder / "config.json").read_bytes()
        again = model_cli(tb, tmp_path, env, "model", "pull", "--json")
        data = json.loads(again.stdout)
        assert data["workers"][0]["copy"]["host"] == worker.ip  # the fabric address, not worker1-ssh
        assert data["workers"][0]["copy"]["files_sent"] == [] and data["hashed_bytes"] == 0
        assert data["workers"][0]["report"]["bytes_checked"] == 0
    finally:
        hosts.write_text(original)
