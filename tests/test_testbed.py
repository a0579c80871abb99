"""The namespace testbed itself: node identity, fabric, SSH, per-node venv, and real Ray across it."""

from __future__ import annotations

import glob
import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dspark_launch.node import procfs
from tests.support.paths import REPO
from tests.support.processes import alive, cmdline, describe, wait_until
from tests.support.testbed.fixture import extra_testbed
from tests.support.testbed.testbed import FABRIC_IF, Testbed, requirements_met

pytestmark = pytest.mark.testbed

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _site_packages(venv: str) -> str:
    found = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    assert found, f"no site-packages under {venv}"
    return found[0]


def test_requirements_reported():
    ok, why = requirements_met()
    assert isinstance(ok, bool) and why


def test_nodes_identity_and_fabric(testbed: Testbed):
    nodes = testbed.nodes
    assert [n.name for n in nodes][:2] == ["head", "worker1"]
    assert nodes[0].is_head and not any(n.is_head for n in nodes[1:])
    for i, n in enumerate(nodes):
        assert n.ip == f"10.213.0.{i + 1}"
        r = testbed.exec(n, ["hostname"], check=True)
        assert r.stdout.strip() == f"dspark-{n.name}" == n.hostname
        r = testbed.exec(n, ["ip", "-o", "-4", "addr", "show"], check=True)
        assert f"inet {n.ip}/24" in r.stdout and f" {FABRIC_IF} " in r.stdout
        # sysfs is the node's own: lo and the fabric interface, nothing of the host's
        r = testbed.exec(n, ["ls", "/sys/class/net"], check=True)
        assert sorted(r.stdout.split()) == sorted(["lo", FABRIC_IF])
        r = testbed.exec(n, ["ip", "route", "show", "default"], check=True)
        assert r.stdout.strip() == "", "no default route on the fabric"
        # cwd is kept
        r = testbed.exec(n, ["pwd"], cwd="/usr/share", check=True)
        assert r.stdout.strip() == "/usr/share"
    # every node reaches every other node over the fabric, and nothing else
    head, w1 = nodes[0], nodes[1]
    r = testbed.exec(head, ["ping", "-c", "1", "-W", "2", w1.ip]) if _has("ping") else None
    if r is not None:
        assert r.returncode == 0, r.stdout + r.stderr


def _has(tool: str) -> bool:
    import shutil

    return shutil.which(tool) is not None


def test_ssh_from_head_lands_in_worker(testbed: Testbed):
    head = testbed.head
    for w in testbed.workers:
        argv = ["ssh", "-i", testbed.ssh_key, "-p", "22", *testbed.ssh_options(), f"root@{w.ip}", "hostname"]
        r = testbed.exec(head, argv, timeout=30)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == w.hostname
        # the session is inside the worker's namespaces
        r = testbed.exec(head, testbed.ssh_argv(w, "ls /sys/class/net; ip -o -4 addr show dev fab0"), timeout=30)
        assert r.returncode == 0, r.stderr
        assert f"inet {w.ip}/24" in r.stdout
        # sshd is visible with `ip netns exec NAME ss -ltnp`
        r = subprocess.run(["ip", "netns", "exec", w.netns, "ss", "-ltnp"], capture_output=True, text=True)
        assert f"{w.ip}:22" in r.stdout and "sshd" in r.stdout
    assert testbed.sshd_pid(head) is None


def test_sshd_can_be_stopped_and_started(testbed: Testbed):
    w = testbed.workers[0]
    old = testbed.kill_sshd(w)
    try:
        assert old and testbed.sshd_pid(w) is None
        r = testbed.exec(testbed.head, testbed.ssh_argv(w, "true"), timeout=30)
        assert r.returncode == 255 and "refused" in r.stderr.lower()
    finally:
        new = testbed.start_sshd(w)
    assert new != old
    assert old not in testbed.pids_in(w)  # reaped or gone, not a live process


def test_link_down_cuts_the_node_off(testbed: Testbed):
    w = testbed.workers[0]
    testbed.link_down(w)
    try:
        r = testbed.exec(testbed.head, testbed.ssh_argv(w, "true"), timeout=30)
        assert r.returncode == 255
    finally:
        testbed.link_up(w)
    testbed.wait_ssh(w, timeout=15)


def test_overlay_isolates_the_venv_per_node(testbed: Testbed):
    head, w1 = testbed.head, testbed.workers[0]
    sp = _site_packages(testbed.venv)
    scratch = os.path.join(sp, f"_dspark_testbed_scratch_{uuid.uuid4().hex[:8]}.py")
    try:
        testbed.exec(w1, ["sh", "-c", 'echo "X = 1" > "$1"', "sh", scratch], check=True)
        assert testbed.exec(w1, ["cat", scratch], check=True).stdout.strip() == "X = 1"
        assert testbed.exec(head, ["test", "-e", scratch]).returncode == 1
        assert not os.path.exists(scratch), "the host's real venv must not change"
        # the venv's python on the worker sees it; on the head it does not
        mod = os.path.basename(scratch)[:-3]
        py = os.path.join(testbed.venv, "bin", "python")
        assert testbed.exec(w1, [py, "-c", f"import {mod}; print({mod}.X)"], check=True).stdout.strip() == "1"
        assert testbed.exec(head, [py, "-c", f"import {mod}"]).returncode != 0
        # a modified existing file stays modified only on that node
        target = os.path.join(sp, "ray", "__init__.py") if os.path.exists(os.path.join(sp, "ray")) else None
        if target:
            before = Path(target).read_bytes()
            testbed.exec(w1, ["sh", "-c", 'echo "# patched on worker1" >> "$1"', "sh", target], check=True)
            assert testbed.exec(w1, ["tail", "-n", "1", target], check=True).stdout.strip() == "# patched on worker1"
            assert testbed.exec(head, ["tail", "-n", "1", target], check=True).stdout.strip() != "# patched on worker1"
            assert Path(target).read_bytes() == before
    finally:
        testbed.exec(w1, ["rm", "-f", scratch])
    # reset_overlay throws every change away
    testbed.reset_overlay(w1)
    if target:
        assert testbed.exec(w1, ["tail", "-n", "1", target], check=True).stdout.strip() != "# patched on worker1"
    assert testbed.exec(w1, ["test", "-e", scratch]).returncode == 1


RAY_CHECK = r"""
import json, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

address, node_ip, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
ray.init(address=address, _node_ip_address=node_ip, logging_level="ERROR", log_to_driver=False)
deadline = time.time() + 90
while True:  # `ray status` lags joins by seconds: poll
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= want or time.time() > deadline:
        break
    time.sleep(0.5)

@ray.remote(num_cpus=0)
def where():
    import os, socket
    return {"hostname": socket.gethostname(), "ifaces": sorted(os.listdir("/sys/class/net"))}

out = {"nodes": [{k: n[k] for k in ("NodeID", "NodeManagerAddress", "NodeManagerHostname", "Alive")}
                 for n in ray.nodes()], "tasks": {}}
for n in alive:
    ref = where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
    out["tasks"][n["NodeManagerAddress"]] = ray.get(ref, timeout=180)
print("RESULT " + json.dumps(out), flush=True)
ray.shutdown()
"""


def test_ray_cluster_across_two_nodes(testbed: Testbed):
    venv_bin = os.path.join(testbed.venv, "bin")
    ray_bin, py = os.path.join(venv_bin, "ray"), os.path.join(venv_bin, "python")
    if not os.path.exists(ray_bin):
        pytest.skip(f"no ray in {testbed.venv}")
    head, w1 = testbed.head, testbed.workers[0]
    port = 6380
    common = ["--num-cpus", "1", "--num-gpus", "0", "--object-store-memory", "100000000", "--disable-usage-stats"]
    try:
        r = testbed.exec(
            head,
            [ray_bin, "start", "--head", "--node-ip-address", head.ip, "--port", str(port),
             "--temp-dir", os.path.join(testbed.state_dir, "ray-head"), "--include-dashboard=false", *common],
            env=RAY_ENV, timeout=180,
        )  # fmt: skip
        assert r.returncode == 0, f"ray head: {r.stdout}\n{r.stderr}"
        remote = shlex.join(
            ["env", *(f"{k}={v}" for k, v in RAY_ENV.items()), ray_bin, "start",
             "--address", f"{head.ip}:{port}", "--node-ip-address", w1.ip,
             "--temp-dir", os.path.join(testbed.state_dir, "ray-w1"), *common]
        )  # fmt: skip
        r = testbed.exec(head, testbed.ssh_argv(w1, remote), timeout=180)
        assert r.returncode == 0, f"ray worker over ssh: {r.stdout}\n{r.stderr}"
        r = testbed.exec(head, [py, "-c", RAY_CHECK, f"{head.ip}:{port}", head.ip, "2"], env=RAY_ENV, timeout=300)
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
        result = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])
        alive = {n["NodeManagerAddress"]: n for n in result["nodes"] if n["Alive"]}
        assert set(alive) == {head.ip, w1.ip}, result
        assert alive[head.ip]["NodeManagerHostname"] == head.hostname
        assert alive[w1.ip]["NodeManagerHostname"] == w1.hostname
        for node in (head, w1):
            task = result["tasks"][node.ip]
            assert task["hostname"] == node.hostname  # the Ray worker process runs in the node
            assert task["ifaces"] == sorted(["lo", FABRIC_IF])
        assert any("ray" in cmdline(p) for p in testbed.pids_in(w1, include_infra=False))
    finally:
        # never `ray stop` (it kills every Ray on the machine): end each node's processes by pid
        for node in (w1, head):
            testbed.kill_procs(node, grace=5.0)
    for node in (head, w1):
        left = testbed.pids_in(node, include_infra=False)
        assert not left, describe(left)
        assert not [p for p in testbed.pids_in(node) if "ray" in cmdline(p)]
        assert testbed.pids_in(node) == testbed.infra_pids(node)


def test_cli_status_and_exec(testbed: Testbed):
    base = [sys.executable, "-m", "tests.support.testbed", "--state-dir", testbed.state_dir]
    r = subprocess.run([*base, "status"], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["up"] and [n["ip"] for n in st["nodes"]] == [n.ip for n in testbed.nodes]
    assert all(n["holder_alive"] for n in st["nodes"])
    assert all(n["sshd_pid"] for n in st["nodes"] if not n["is_head"])
    r = subprocess.run(
        [*base, "exec", "worker1", "--", "hostname"], capture_output=True, text=True, timeout=30, cwd=REPO
    )
    assert r.returncode == 0 and r.stdout.strip() == "dspark-worker1"
    r = subprocess.run([*base, "env"], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert "export DSPARK_TESTBED_WORKER1_IP=10.213.0.2" in r.stdout


def test_second_testbed_partial_up_and_down_leave_nothing():
    """A separate 3-node testbed: up, holders killed behind its back, down still cleans all."""
    ok, why = requirements_met()
    if not ok:
        pytest.skip(why)
    tb = extra_testbed(nodes=3)
    state, prefix = tb.state_dir, tb.prefix
    try:
        t0 = time.monotonic()
        tb.up()
        assert time.monotonic() - t0 < 30
        assert [n.hostname for n in tb.nodes] == ["dspark-head", "dspark-worker1", "dspark-worker2"]
        for w in tb.workers:  # head reaches both workers; worker1 reaches worker2 directly
            assert tb.exec(tb.head, tb.ssh_argv(w, "hostname"), timeout=30).stdout.strip() == w.hostname
        r = tb.exec("worker1", tb.ssh_argv("worker2", "hostname"), timeout=30)
        assert r.stdout.strip() == "dspark-worker2", r.stderr
        tb.up()  # idempotent
        with pytest.raises(Exception):
            Testbed(state_dir=state, nodes=2, prefix=prefix).up()  # other settings: refused
        # a stray process in worker2, then every holder dies: down must still clean up
        stray = tb.popen("worker2", ["sleep", "300"])
        holders = [n.holder_pid for n in tb.nodes]
        for pid in holders:
            os.kill(pid, 9)
        assert wait_until(lambda: not any(alive(pid) for pid in holders), 10), describe(holders)
    finally:
        tb.down()
    assert stray.wait(timeout=10) != 0
    assert not os.path.exists(state)
    assert not [n for n in os.listdir("/run/netns") if n.startswith(prefix + "-")]
    assert not os.path.exists(state + ".lock")


def test_failed_up_rolls_back_and_stale_testbeds_are_swept(monkeypatch):
    from tests.support.testbed import fixture

    ok, why = requirements_met()
    if not ok:
        pytest.skip(why)
    # 1. up failing half-way (namespaces and fabric made, node setup breaks): nothing stays
    tb = fixture.extra_testbed(nodes=2)
    with monkeypatch.context() as m:
        m.setattr(Testbed, "_setup_node", lambda self, rec: (_ for _ in ()).throw(RuntimeError("boom")))
        with pytest.raises(RuntimeError, match="boom"):
            tb.up()
    assert not [n for n in os.listdir("/run/netns") if n.startswith(tb.prefix + "-")]
    assert not any(tb.pids_in(n) for n in tb.nodes)  # state kept for the logs, nothing running
    tb.down()
    assert not os.path.exists(tb.state_dir)
    # 2. a testbed whose pytest died is swept by the next session's fixture
    dead = next(p for p in range(30000, 1, -1) if not os.path.exists(f"/proc/{p}"))
    stale = Testbed(**fixture._settings(dead, "dspx", nodes=1))
    stale.up()
    st = json.loads(Path(stale.state_dir, "testbed.json").read_text())
    st["owner"] = {"pid": dead, "start": 0}
    Path(stale.state_dir, "testbed.json").write_text(json.dumps(st))
    holder = stale.head.holder_pid
    try:
        assert ("dspx", dead) in fixture.sweep_stale()
    finally:
        stale.down()
    assert not os.path.exists(stale.state_dir)
    assert procfs.state(holder) in (None, "Z")
