"""The whole `dspark start` on the two-namespace testbed: real SSH, real Ray, real vLLM (CPU),
the tiny model served with tensor parallel 2 across both nodes.

The server is started as few times as the assertions allow: one life here, with VLLM_HOST=localhost beside `nobody`
squatting the IPv6 loopback. The launcher without vLLM, Ray and torch serving in the foreground, and its supervisor's
exit 1 when the server dies: tests/test_security.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dspark_ray_cpu_platform import ENV_RECORD_DIR

from dspark_launch.node import procfs
from tests.support import squatter
from tests.support.launcher_env import FORWARDED, launcher_env, scratch
from tests.support.on_testbed import (
    API_KEY,
    our_pids,
    processes_named,
    run,
    serving_env,
    set_knob,
    state,
    status,
)
from tests.support.processes import describe, environ_of
from tests.support.sysfs import fake_spark

pytestmark = [pytest.mark.testbed, pytest.mark.serving]

API_PORT = 8000  # serving_env's VLLM_PORT


def files_containing(root: Path, needle: bytes) -> list[str]:
    hits = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            try:
                if path.is_file() and needle in path.read_bytes():
                    hits.append(str(path))
            except OSError:
                pass
    return hits


def squat(tb, tmp_path: Path, host: str, v6only: bool = False) -> tuple[subprocess.Popen, Path]:
    """`nobody` listening on host:API_PORT in the head node, once it listens, and its log."""
    log = tmp_path / f"squatter-{host.strip(':') or 'any'}.log"
    return squatter.in_node(tb, "head", log, host, API_PORT, v6only), log


def test_start_serve_drift_kill_stop(testbed_clean, tmp_path, tiny_model, step):
    """VLLM_HOST=localhost, which the nodes resolve to ::1 first (as Debian's /etc/hosts does), with `nobody` on
    [::1]:PORT, then on [::]:PORT with IPV6_V6ONLY: the server binds, and the launcher records, checks and reaches,
    127.0.0.1 only (a v6-only listener holds no IPv4 port); neither squatter gets a connection. (The same on
    loopback, in seconds: tests/test_keyed_requests.py.) Each node has a fabric of its own (a fake sysfs at one path
    in each node's mount namespace): its own NCCL values reach its vLLM worker."""
    tb = testbed_clean
    trees = {
        "head": fake_spark(tmp_path / "head-sys", "10.213.0.1", "rocep1s0f1", "roceP2p1s0f1", 3),
        "worker1": fake_spark(tmp_path / "worker-sys", "10.213.0.2", "mlx5_1", None, 5),
    }
    sysfs, records = tmp_path / "sys", tmp_path / "records"
    sysfs.mkdir()
    records.mkdir()
    for node, tree in trees.items():  # one path, each node's own tree (each node has its own mount namespace)
        tb.exec(node, ["mount", "--bind", str(tree), str(sysfs)], check=True)
    forwarded = " ".join((*FORWARDED, "DSPARK_TEST_SYSFS_ROOT", ENV_RECORD_DIR))
    env = serving_env(tb, tmp_path, tiny_model, VLLM_HOST="localhost", DSPARK_FORWARD_ENV=forwarded)
    cli = {**launcher_env(scratch(tmp_path)), "DSPARK_TEST_SYSFS_ROOT": str(sysfs), ENV_RECORD_DIR: str(records)}
    order = tb.exec(
        "head",
        [sys.executable, "-c", f"import socket; print(socket.getaddrinfo('localhost', {API_PORT}, type=1)[0][4][0])"],
        check=True,
    )
    assert order.stdout.strip() == "::1"  # guard: the node's resolver gives ::1 first
    squatters = [squat(tb, tmp_path, "::1")]
    try:
        serve_drift_kill_stop(tb, tmp_path, env, cli, squatters, step)
    finally:
        for proc, _ in squatters:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        run(tb, tmp_path, env, "stop", launcher=cli)
        for node in trees:
            tb.exec(node, ["umount", str(sysfs)])


def serve_drift_kill_stop(tb, tmp_path: Path, env: Path, cli: dict[str, str], squatters: list, step) -> None:
    outputs = []

    def dspark(*args: str) -> subprocess.CompletedProcess:
        return run(tb, tmp_path, env, *args, launcher=cli)

    step("plan: each node's own fabric values")
    planned = json.loads(dspark("plan", "--json").stdout)
    assert [n["probed"] for n in planned["nodes"]] == [True, True]
    fabric = {
        n["node"]: {e["name"]: e["value"] for e in n["env"] if e["origin"] == "ray start: fabric (sysfs)"}
        for n in planned["nodes"]
    }
    assert fabric["worker1"]["NCCL_IB_HCA"] == "mlx5_1" and fabric["worker1"]["NCCL_IB_GID_INDEX"] == "5"
    assert fabric["head"]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"

    step("start beside nobody on [::1]")
    started = dspark("start")
    outputs.append(started.stdout + started.stderr)
    assert started.returncode == 0, started.stderr[-4000:]
    assert f"at http://127.0.0.1:{API_PORT}/v1" in started.stdout
    assert state(tmp_path)["server"]["url"] == f"http://127.0.0.1:{API_PORT}"
    assert "serving " in started.stdout and "in-flight prefill cap: 1" in started.stdout
    assert "hotfix head: applied" in started.stdout and "hotfix worker1: applied" in started.stdout
    # The tiny-test profile was resolved against the head's vLLM, and readiness asked for a chat answer.
    assert "profile tiny-test on vLLM 0.32.0" in started.stderr
    assert "kv-cache-dtype auto: no_such_dtype not offered by the installed vLLM 0.32.0" in started.stderr
    assert "tool-call-parser omitted: no_such_parser not offered" in started.stderr
    assert "sending a one-token chat completion" in started.stderr
    assert re.search(r"^first answer: a one-token chat completion in [\d.]+ s \(attempt \d+", started.stdout, re.M)

    step("each node's own fabric values in its vLLM worker")
    # What each vLLM worker's own os.environ held when it built its communicator (after vLLM's copy).
    seen = [json.loads(p.read_text()) for p in (tmp_path / "records").glob("*.json")]
    by_host = {r["hostname"]: r["env"] for r in seen}
    assert set(by_host) == {"dspark-head", "dspark-worker1"}, seen
    assert by_host["dspark-worker1"]["NCCL_IB_HCA"] == "mlx5_1"
    assert by_host["dspark-worker1"]["NCCL_IB_GID_INDEX"] == "5"
    assert "VLLM_CONFIG_ROOT" not in by_host["dspark-worker1"]  # the non-carry-over list was in force
    assert by_host["dspark-head"]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert by_host["dspark-head"]["NCCL_IB_GID_INDEX"] == "3"
    # And the start environment the worker node's raylet gave its vLLM worker process.
    worker_pid = next(r["pid"] for r in seen if r["hostname"] == "dspark-worker1")
    environ = environ_of(worker_pid)
    assert (environ["NCCL_IB_HCA"], environ["NCCL_IB_GID_INDEX"], environ["NCCL_NET"]) == ("mlx5_1", "5", "IB")

    step("tensor parallel ranks on both nodes")
    # Tensor parallel rank 1 runs on the worker node, rank 0 on the head.
    assert processes_named(tb, "worker1", "RayWorkerProc"), "no vLLM Ray worker on worker1"
    assert processes_named(tb, "head", "RayWorkerProc"), "no vLLM Ray worker on head"

    step("smoke")
    smoke = dspark("smoke", "--concurrency", "3")
    outputs.append(smoke.stdout + smoke.stderr)
    assert smoke.returncode == 0 and "3 passed, 0 failed" in smoke.stdout, smoke.stdout + smoke.stderr

    step("the patched scheduler with cap 1")
    # The EngineCore's scheduler is the patched one and uses the validated cap.
    log = (tmp_path / "state" / "logs" / "vllm-serve.log").read_text(errors="replace")
    assert re.search(r"dspark-issue27 hotfix v\d+ active: cap=1 ", log)
    steps = [l for l in log.splitlines() if "dspark-issue27 step=" in l]
    assert steps and all(" cap=1 " in l for l in steps)

    step("status: up, with the profile's decisions")
    code, data = status(tb, tmp_path, env, cli)
    outputs.append(json.dumps(data))
    assert code == 0 and data["state"] == "up", data
    assert data["server"]["profile"] == "tiny-test" and data["server"]["decisions"]
    assert [(n["name"], n["ray_alive"], n["registered_ip"]) for n in data["nodes"]] == [
        ("head", True, "10.213.0.1"),
        ("worker1", True, "10.213.0.2"),
    ]
    assert data["server"]["healthy"] and data["server"]["cap"] == 1 and data["server"]["drift"] == []
    assert not [p for p in data["problems"] if "VLLM_PORT" in p], data
    assert squatter.connections(squatters[0][1]) == []

    step("a second start is refused")
    again = dspark("start")
    assert again.returncode == 3, again.stderr

    step("smoke, status, drift and reload beside nobody on [::] with IPV6_V6ONLY")
    proc, _ = squatters[0]
    proc.kill()
    proc.wait()
    squatters.append(squat(tb, tmp_path, "::", v6only=True))
    smoke = dspark("smoke", "-c", "2")
    assert smoke.returncode == 0 and "2 passed, 0 failed" in smoke.stdout, smoke.stdout + smoke.stderr
    # Edit the cap: status shows the drift, `reload` applies it. (A restart that applies a change, and its output
    # without the key, is tests/test_restarts.py's serve-only restart: one restart life in the suite, not two.)
    set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "2")
    text = dspark("status")
    outputs.append(text.stdout + text.stderr)
    assert "drift: DSPARK_MAX_INFLIGHT_PREFILLS 1 -> 2: `dspark reload` applies it" in text.stdout
    assert "profile tiny-test:" in text.stdout and "kv-cache-dtype auto: no_such_dtype" in text.stdout
    code, data = status(tb, tmp_path, env, cli)
    assert code == 0 and data["state"] == "up" and not [p for p in data["problems"] if "VLLM_PORT" in p], data
    assert {"name": "DSPARK_MAX_INFLIGHT_PREFILLS", "running": "1", "configured": "2"} in data["server"]["drift"]
    reloaded = dspark("reload")
    outputs.append(reloaded.stdout + reloaded.stderr)
    assert reloaded.returncode == 0, reloaded.stdout + reloaded.stderr
    assert squatter.connections(squatters[1][1]) == []

    step("the API key nowhere")
    # No key in the launcher's output, status, the state folder, the server log, Ray logs, or any argv.
    secret = API_KEY.encode()
    assert all(API_KEY not in out for out in outputs)
    assert files_containing(tmp_path / "state", secret) == []
    ray_dirs = {r["ray_temp_dir"] for r in state(tmp_path)["nodes"]}
    for ray_dir in ray_dirs:
        assert files_containing(Path(ray_dir), secret) == [], ray_dir
    for node in ("head", "worker1"):
        for pid in tb.pids_in(node):
            try:
                assert secret.decode() not in "\0".join(procfs.cmdline(pid)), describe({pid})
            except FileNotFoundError:
                pass

    step("the server dies: status says dead")
    server_pid = state(tmp_path)["server"]["pid"]
    os.kill(server_pid, signal.SIGKILL)
    deadline = time.monotonic() + 120  # a status takes seconds on a busy host; the loop ends once it says dead
    while time.monotonic() < deadline:
        code, data = status(tb, tmp_path, env, cli)
        if data["server"]["state"] == "dead":
            break
        time.sleep(1)
    assert data["server"]["state"] == "dead" and data["state"] == "degraded" and code == 1

    step("stop: nothing left")
    for proc, _ in squatters:  # nobody's, not ours: gone first, so that what is left is ours
        proc.kill()
        proc.wait()
    stopped = dspark("stop")
    assert stopped.returncode == 0, stopped.stderr
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)


def test_unknown_vllm_flag_fails_the_argument_check(testbed_clean, tmp_path, tiny_model):
    tb = testbed_clean
    env = serving_env(tb, tmp_path, tiny_model, VLLM_EXTRA_ARGS="--max-num-partial-prefills 2")
    proc = run(tb, tmp_path, env, "start")
    assert proc.returncode == 2, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("dspark: error:")]
    assert len(errors) == 1 and "--max-num-partial-prefills" in errors[0] and "VLLM_EXTRA_ARGS" in errors[0]
    # The check runs on the head while Ray starts (launch time): Ray is rolled back, no record is left.
    assert not (tmp_path / "state" / "state.json").exists()
    assert our_pids(tb, "head") == set() and our_pids(tb, "worker1") == set()


def test_server_dying_during_start_is_a_failure_not_a_timeout(testbed_clean, tmp_path, tiny_model):
    tb = testbed_clean
    # Parses fine, but the engine refuses it at start: longer than the model's 1024 positions (the generic
    # serve: the tiny-test profile sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, which lets it through).
    env = serving_env(tb, tmp_path, tiny_model, MAX_MODEL_LEN="65536", START_TIMEOUT_S="600", DSPARK_PROFILE="none")
    began = time.monotonic()
    proc = run(tb, tmp_path, env, "start")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "vllm serve exited during start" in proc.stderr
    assert "==> " in proc.stderr and "vllm-serve.log" in proc.stderr  # the log tails are printed
    assert time.monotonic() - began < 400
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
