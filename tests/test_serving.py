"""The whole `dspark start` on the two-namespace testbed: real SSH, real Ray, real vLLM (CPU),
the tiny model served with tensor parallel 2 across both nodes.

The server is started as few times as the assertions allow: start, and the launcher without vLLM in the foreground.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dspark_launch.node import procfs
from tests.support.launcher_env import launcher_env, scratch
from tests.support.on_testbed import (
    API_KEY,
    VENV_BIN,
    our_pids,
    processes_named,
    read_until_served,
    run,
    serving_env,
    set_knob,
    state,
    status,
)
from tests.support.processes import describe

pytestmark = [pytest.mark.testbed, pytest.mark.serving]


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


def test_start_serve_drift_kill_stop(testbed_clean, tmp_path, tiny_model, step):
    tb = testbed_clean
    env = serving_env(tb, tmp_path, tiny_model)
    outputs = []

    step("start")
    started = run(tb, tmp_path, env, "start")
    outputs.append(started.stdout + started.stderr)
    assert started.returncode == 0, started.stderr[-4000:]
    assert "serving " in started.stdout and "in-flight prefill cap: 1" in started.stdout
    assert "hotfix head: applied" in started.stdout and "hotfix worker1: applied" in started.stdout
    # The tiny-test profile was resolved against the head's vLLM, and readiness asked for a chat answer.
    assert "kv-cache-dtype auto: no_such_dtype not offered by the installed vLLM 0.32.0" in started.stderr
    assert "sending a one-token chat completion" in started.stderr
    assert re.search(r"^first answer: a one-token chat completion in [\d.]+ s \(attempt \d+", started.stdout, re.M)

    step("tensor parallel ranks on both nodes")
    # Tensor parallel rank 1 runs on the worker node, rank 0 on the head.
    assert processes_named(tb, "worker1", "RayWorkerProc"), "no vLLM Ray worker on worker1"
    assert processes_named(tb, "head", "RayWorkerProc"), "no vLLM Ray worker on head"

    step("smoke")
    smoke = run(tb, tmp_path, env, "smoke", "--concurrency", "3")
    outputs.append(smoke.stdout + smoke.stderr)
    assert smoke.returncode == 0 and "3 passed, 0 failed" in smoke.stdout, smoke.stdout + smoke.stderr

    step("the patched scheduler with cap 1")
    # The EngineCore's scheduler is the patched one and uses the validated cap.
    log = (tmp_path / "state" / "logs" / "vllm-serve.log").read_text(errors="replace")
    assert re.search(r"dspark-issue27 hotfix v\d+ active: cap=1 ", log)
    steps = [l for l in log.splitlines() if "dspark-issue27 step=" in l]
    assert steps and all(" cap=1 " in l for l in steps)

    step("status: up")
    code, data = status(tb, tmp_path, env)
    outputs.append(json.dumps(data))
    assert code == 0 and data["state"] == "up", data
    assert [(n["name"], n["ray_alive"], n["registered_ip"]) for n in data["nodes"]] == [
        ("head", True, "10.213.0.1"),
        ("worker1", True, "10.213.0.2"),
    ]
    assert data["server"]["healthy"] and data["server"]["cap"] == 1 and data["server"]["drift"] == []

    step("a second start is refused")
    again = run(tb, tmp_path, env, "start")
    assert again.returncode == 3, again.stderr

    step("drift")
    # Edit the cap: status shows the drift. (The restart that applies it, and its output without the
    # key, is tests/test_restarts.py's serve-only restart: one restart life in the suite, not two.)
    set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "2")
    text = run(tb, tmp_path, env, "status")
    outputs.append(text.stdout + text.stderr)
    assert "drift: DSPARK_MAX_INFLIGHT_PREFILLS 1 -> 2: `dspark reload` applies it" in text.stdout
    code, data = status(tb, tmp_path, env)
    assert {"name": "DSPARK_MAX_INFLIGHT_PREFILLS", "running": "1", "configured": "2"} in data["server"]["drift"]

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
        code, data = status(tb, tmp_path, env)
        if data["server"]["state"] == "dead":
            break
        time.sleep(1)
    assert data["server"]["state"] == "dead" and data["state"] == "degraded" and code == 1

    step("stop: nothing left")
    stopped = run(tb, tmp_path, env, "stop")
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


def test_the_cli_needs_neither_vllm_nor_ray_and_foreground_exits_nonzero_when_the_server_dies(
    testbed_clean, tmp_path, tiny_model
):
    """Everything that touches vLLM or Ray runs in a node's agent: the launcher's own interpreter
    here cannot import either (a PYTHONPATH folder shadows both), the nodes' venv has them. That
    launcher's `start --foreground` (the systemd unit's) serves, `status` reads the deployment, and
    when the server dies the supervisor exits 1 with nothing of ours left (one life for both)."""
    tb = testbed_clean
    blocked = tmp_path / "blocked"
    for name in ("vllm", "ray", "torch"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not for the launcher')\n")
    # the generic serve; recovery off: the supervisor ends at the first loss (its recoveries: tests/test_watchdog*.py)
    env_file = serving_env(tb, tmp_path, tiny_model, DSPARK_PROFILE="none", DSPARK_RECOVERY_LIMIT="0")
    cli_env = {**launcher_env(scratch(tmp_path)), "PYTHONPATH": str(blocked)}
    probe = tb.exec("head", [str(VENV_BIN / "python"), "-c", "import vllm"], env=cli_env)
    assert probe.returncode != 0 and "not for the launcher" in probe.stderr

    def cli_argv(*args):
        return [str(VENV_BIN / "python"), "-m", "dspark_launch", *args, "--env-file", str(env_file)]

    def cli(*args):
        return tb.exec("head", cli_argv(*args), env=cli_env, timeout=600)

    proc = tb.popen(
        "head",
        cli_argv("start", "--foreground"),
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen, rest = [], ""
    try:
        seen = read_until_served(proc)
        assert "hotfix worker1: applied" in "".join(seen)
        assert "sending a one-token completion" in "".join(seen)  # DSPARK_PROFILE=none: no chat promised
        shown = cli("status", "--json")
        data = json.loads(shown.stdout)
        assert data["state"] == "up" and data["server"]["healthy"], shown.stderr[-2000:]
        assert [n["registered_ip"] for n in data["nodes"]] == [n["ip"] for n in data["nodes"]]

        os.kill(state(tmp_path)["server"]["pid"], signal.SIGKILL)
        rest, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.returncode != 1:
            cli("stop")
    assert proc.returncode == 1, "".join(seen) + rest
    assert "vllm serve (pid" in rest and "exited" in rest
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
