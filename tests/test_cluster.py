"""`dspark cluster up/down` and `status` on the real two-node testbed: real SSH, real Ray.

The pre-flight refusals that are a decision over one node's answer (no vLLM, a wrong worker IP, no
RoCE, a version mismatch, ...) are table tests over a fake node agent in tests/test_bringup_decisions.py;
here stay the lives only real nodes show: an unreachable worker (nothing started), the hotfix refused
or failing while Ray starts (both nodes rolled back), two launchers, interrupts, three nodes."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.on_testbed import (
    SCHEDULER_REL,
    VENV_BIN,
    dspark,
    interrupt_after,
    our_pids,
    scheduler_sha,
    write_env,
)
from tests.support.processes import describe

pytestmark = pytest.mark.testbed


def status_json(tb, env_file: Path, *extra: str) -> tuple[int, dict]:
    proc = dspark(tb, env_file, "status", "--json", *extra)
    return proc.returncode, json.loads(proc.stdout)


def test_up_status_repair_down(testbed_clean, tmp_path, step):
    tb = testbed_clean
    env = write_env(tb, tmp_path)
    host_sha = hashlib.sha256((Path(sys.executable).parent.parent / SCHEDULER_REL).read_bytes()).hexdigest()

    step("cluster up: Ray and the hotfix on both nodes")
    up = dspark(tb, env, "cluster", "up")
    assert up.returncode == 0, up.stderr
    # The testbed's fabric has no RoCE: with DSPARK_ALLOW_TCP_FABRIC=1 (launcher_env) a warning per node.
    assert "head: no RDMA device behind fab0: NCCL falls back to TCP sockets" in up.stderr
    assert "version matrix:" in up.stdout and "scheduler_sha256" in up.stdout
    assert "hotfix head: applied" in up.stdout and "hotfix worker1: applied" in up.stdout
    # Each node patched its own copy; the host's venv is untouched.
    assert scheduler_sha(tb, "head") != host_sha and scheduler_sha(tb, "worker1") != host_sha
    assert (
        "dspark-issue27" in tb.exec("worker1", ["cat", str(Path(sys.executable).parent.parent / SCHEDULER_REL)]).stdout
    )

    step("status: up, both nodes, the token kept private")
    code, data = status_json(tb, env)
    assert code == 0 and data["state"] == "up"
    assert [(n["name"], n["ip"], n["registered_ip"], n["ray_alive"], n["gpus"]) for n in data["nodes"]] == [
        ("head", "10.213.0.1", "10.213.0.1", True, 1),
        ("worker1", "10.213.0.2", "10.213.0.2", True, 1),
    ]
    assert all(n["hotfix"] == "applied" for n in data["nodes"])
    # Registered IPs and GPUs from the record (each node's Ray daemons unchanged since the checks at start);
    # `--deep` reads Ray's node table and finds the same.
    assert data["ray_source"] == "record"
    code, deep = status_json(tb, env, "--deep")
    assert code == 0 and deep["ray_source"] == "ray"
    assert [(n["registered_ip"], n["gpus"]) for n in deep["nodes"]] == [
        (n["registered_ip"], n["gpus"]) for n in data["nodes"]
    ]
    state_dir = tmp_path / "state"
    assert oct(state_dir.stat().st_mode & 0o777) == "0o700"
    token = (state_dir / "ray-auth-token").read_text().strip()
    assert token and token not in (state_dir / "state.json").read_text() and token not in up.stdout + up.stderr

    step("a second up is refused")
    again = dspark(tb, env, "cluster", "up")
    assert again.returncode == 3, again.stderr

    step("a worker's raylet dies: degraded, then repaired")
    # A worker's raylet dies: degraded within seconds, and `up` repairs it.
    raylet = [p for p in data["nodes"][1]["pids"]]
    for pid in raylet:
        tb.exec("worker1", ["kill", "-9", str(pid)])
    started = time.monotonic()
    code, data = status_json(tb, env)
    assert data["state"] == "degraded" and code == 1
    assert time.monotonic() - started < 30
    assert [n["ray_alive"] for n in data["nodes"]] == [True, False]
    assert data["ray_source"] == "ray"  # a node's recorded daemons changed: the record proves nothing, Ray is asked
    repaired = dspark(tb, env, "cluster", "up")
    assert repaired.returncode == 0, repaired.stderr
    assert "repairing" in repaired.stderr
    code, data = status_json(tb, env)
    assert data["state"] == "up", data
    assert data["ray_source"] == "record" and [n["registered_ip"] for n in data["nodes"]] == [
        "10.213.0.1",
        "10.213.0.2",
    ]

    step("stop: nothing left")
    down = dspark(tb, env, "stop")
    assert down.returncode == 0, down.stderr
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
    code, data = status_json(tb, env)
    assert data["state"] == "down"
    assert dspark(tb, env, "stop").returncode == 0  # idempotent


def test_worker_unreachable_fails_before_anything_starts(testbed_clean, tmp_path):
    tb = testbed_clean
    env = write_env(tb, tmp_path, SSH_CONNECT_TIMEOUT_S="3")
    tb.kill_sshd("worker1")
    proc = dspark(tb, env, "cluster", "up")
    assert proc.returncode == 1
    error = [l for l in proc.stderr.splitlines() if l.startswith("dspark: error:")]
    assert len(error) == 1 and "worker1 (10.213.0.2)" in error[0] and "SSH" in error[0]
    assert "starting Ray" not in proc.stderr
    assert our_pids(tb, "head") == set()


def _drift_anchor(tb, node: str) -> str:
    path = str(Path(sys.executable).parent.parent / SCHEDULER_REL)
    tb.exec(node, ["sed", "-i", "s/self.max_num_active_reqs/self.max_active_requests_renamed/g", path], check=True)
    return scheduler_sha(tb, node)


def test_hotfix_refused_rolls_back_both_nodes(testbed_clean, tmp_path):
    tb = testbed_clean
    before = {node: _drift_anchor(tb, node) for node in ("head", "worker1")}
    proc = dspark(tb, write_env(tb, tmp_path), "cluster", "up")
    assert proc.returncode == 1
    assert ": hotfix:" in proc.stderr and "0.32.0" in proc.stderr
    assert {node: scheduler_sha(tb, node) for node in before} == before
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)


def test_hotfix_failing_on_one_node_while_ray_starts_rolls_back_both(testbed_clean, tmp_path):
    """The version rows and the hotfix run on each node's agent while Ray starts (launch time): the
    worker's hotfix cannot be written (its vLLM folder read-only there), so nothing is served and
    everything this run started meanwhile, Ray on both nodes, is stopped; one error line names it."""
    tb = testbed_clean
    folder = str((Path(sys.executable).parent.parent / SCHEDULER_REL).parent)
    before = scheduler_sha(tb, "worker1")
    tb.exec("worker1", ["mount", "--bind", folder, folder], check=True)
    try:
        tb.exec("worker1", ["mount", "-o", "remount,bind,ro", folder], check=True)
        proc = dspark(tb, write_env(tb, tmp_path), "cluster", "up")
    finally:
        tb.exec("worker1", ["umount", folder])
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [l for l in proc.stderr.splitlines() if l.startswith("dspark: error:")]
    assert len(errors) == 1 and "worker1 (10.213.0.2): hotfix:" in errors[0], proc.stderr[-3000:]
    assert "Read-only file system" in errors[0]
    assert "starting Ray on worker1" in proc.stderr  # Ray was started beside the hotfix, and rolled back
    assert scheduler_sha(tb, "worker1") == before
    assert not (tmp_path / "state" / "state.json").exists()
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)


def test_two_launchers_one_wins(testbed_clean, tmp_path):
    tb = testbed_clean
    env = write_env(tb, tmp_path)
    first = tb.popen(
        "head",
        [str(VENV_BIN / "dspark"), "cluster", "up", "--env-file", str(env)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock = tmp_path / "state" / "lock"
        deadline = time.monotonic() + 120  # the first launcher's start-up is slow on a busy host
        while time.monotonic() < deadline and not (lock.exists() and lock.read_text().strip()):
            time.sleep(0.2)
        second = dspark(tb, env, "cluster", "up")
        assert second.returncode == 1
        assert f"another dspark (pid {lock.read_text().strip()}) holds" in second.stderr
        out, err = first.communicate(timeout=240)
        assert first.returncode == 0, err
    finally:
        if first.poll() is None:
            first.kill()
        dspark(tb, env, "stop")
    assert our_pids(tb, "head") == set() and our_pids(tb, "worker1") == set()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_during_bring_up_rolls_back(testbed_clean, tmp_path, sig, code):
    tb = testbed_clean
    env = write_env(tb, tmp_path)
    proc = tb.popen(
        "head",
        [str(VENV_BIN / "dspark"), "cluster", "up", "--env-file", str(env)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen, err = interrupt_after(proc, "starting Ray on worker1", 2, sig, timeout=120)
    assert proc.returncode == code, "".join(seen) + err
    assert "interrupted" in err
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left) + "\n" + "".join(seen) + err


def test_commands_refuse_the_example_hosts(testbed, tmp_path):
    example = Path(__file__).resolve().parent.parent / ".env.dspark.example"
    for args in (["cluster", "up"], ["status"], ["stop"], ["cluster", "down"]):
        proc = dspark(testbed, example, *args)
        assert proc.returncode == 2, args
        assert "placeholder" in proc.stderr and "dspark config init" in proc.stderr


def test_three_nodes(testbed, tmp_path):
    """1 head + 2 workers: the same code, one more namespace (a testbed of its own)."""
    from tests.support.testbed.fixture import extra_testbed

    tb = extra_testbed(nodes=3)
    tb.up()
    try:
        env = write_env(tb, tmp_path)
        up = dspark(tb, env, "cluster", "up")
        assert up.returncode == 0, up.stderr
        assert "hotfix worker2: applied" in up.stdout
        code, data = status_json(tb, env)
        assert code == 0 and data["state"] == "up"
        assert [(n["name"], n["registered_ip"]) for n in data["nodes"]] == [
            ("head", "10.213.0.1"),
            ("worker1", "10.213.0.2"),
            ("worker2", "10.213.0.3"),
        ]
        logs = dspark(tb, env, "logs", "--node", "worker2", "--tail", "5")
        assert logs.returncode == 0 and "ray-start-worker2.log" in logs.stdout and "raylet.out" in logs.stdout
        assert dspark(tb, env, "stop").returncode == 0
        left = our_pids(tb, "head") | our_pids(tb, "worker1") | our_pids(tb, "worker2")
        assert left == set(), describe(left)
    finally:
        tb.down()
