"""The watchdog of `start --foreground` on the two-node testbed, in one serving life: an idle server for several stall
timeouts and a prefill longer than the timeout get no action; the EngineCore stopped (SIGSTOP) with a stream running
is `stalled` in `status` within the timeout plus a poll, and the supervisor restarts vllm serve, which serves again,
the reason in its journal and in the old server's log; then a vLLM Ray worker on the worker node stopped the same way
is recovered too; a third stall past DSPARK_RECOVERY_LIMIT=2 ends supervision (exit 4) with everything stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from dspark_launch.serve.supervise import SERVER_CHECK_S
from tests.support.launcher_env import paced_extra_args
from tests.support.on_testbed import (
    our_pids,
    popen,
    processes_named,
    read_until_served,
    run,
    serving_env,
    state,
    status,
)
from tests.support.processes import describe
from tests.support.supervised import Journal, completion_argv, one_stream

pytestmark = [pytest.mark.testbed, pytest.mark.serving]

STALL_S = 6  # DSPARK_STALL_TIMEOUT_S here: the supervisor polls every 2 s
BUDGET = 16  # tokens a step: a 990-token prompt's prefill takes 62 steps
STEP_MS = 200  # each model step lasts at least this (the test plugin's paced worker): that prefill lasts >= 12.4 s


def stop_and_wait_for_stall(tb, tmp_path: Path, env: Path, pid: int, supervisor: int) -> float:
    """SIGSTOP `pid` while a stream runs, with the supervisor paused so that nothing acts on the stall: seconds from
    the SIGSTOP to the start of the `status` that said stalled (its JSON checked). Any `status` begun a timeout plus
    one poll after the SIGSTOP must say so (a status takes seconds on loaded cores: when it began is what counts). The
    supervisor resumes on return and acts on the stall at its next look (the caller reads its journal); left running,
    it would restart the server about a second after its own look and a later `status` would see no stall."""
    argv = Path(f"/proc/{supervisor}/cmdline").read_text().split("\0")
    assert "start" in argv and "--foreground" in argv, argv  # nsenter execs: the Popen's pid is the supervisor itself
    client = one_stream(tb)
    os.kill(supervisor, signal.SIGSTOP)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        while time.monotonic() - stopped < STALL_S + 60:
            asked = time.monotonic()
            code, view = status(tb, tmp_path, env)
            engine = view["server"].get("engine") or {}
            if engine.get("state") == "stalled":
                # degraded (exit 1), or starting (exit 0) where the supervisor was paused holding the lock to act
                assert (code, view["state"]) in ((1, "degraded"), (0, "starting")), view
                assert engine["counters"]["running"] >= 1 and engine["quiet_s"] >= STALL_S, engine
                assert any("stalled for" in p for p in view["problems"]), view["problems"]
                return asked - stopped
            assert asked - stopped < STALL_S + SERVER_CHECK_S, (asked - stopped, view)
        raise AssertionError(f"status never said stalled after SIGSTOP of {pid}")
    finally:
        os.kill(supervisor, signal.SIGCONT)
        client.kill()


def completion_in_head(tb, prompt: str) -> tuple[int, dict, float]:
    """One completion (max_tokens 1) from inside the head node, where the server listens: status, reply, seconds."""
    done = tb.exec("head", completion_argv(1), input=prompt, timeout=620)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    return result["status"], result["reply"], result["seconds"]


def engine_core(tmp_path: Path) -> int:
    log = Path(state(tmp_path)["server"]["log"]).read_text(errors="replace")
    return int(re.findall(r"\(EngineCore(?:_DP0)? pid=(\d+)\)", log)[-1])


def watch_point(tmp_path: Path) -> dict:
    """The supervisor's progress point (its first look comes a moment after the start's report)."""
    path = tmp_path / "state" / "engine-watch.json"
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return json.loads(path.read_text())


def test_the_supervisor_leaves_idle_and_prefilling_engines_alone_and_restarts_stalled_ones(
    testbed_clean, tmp_path, tiny_model
):
    tb = testbed_clean
    # 62 steps of at least 200 ms for a lone 990-token prompt: longer than the stall timeout however fast the host.
    env = serving_env(
        tb,
        tmp_path,
        tiny_model,
        MAX_MODEL_LEN="1024",
        MAX_NUM_BATCHED_TOKENS=str(BUDGET),
        LONG_PREFILL_TOKEN_THRESHOLD=str(BUDGET),
        VLLM_EXTRA_ARGS=paced_extra_args(STEP_MS),
        DSPARK_ISSUE43_SCHED_DIAG="0",
        DSPARK_STALL_TIMEOUT_S=str(STALL_S),
        DSPARK_RECOVERY_LIMIT="2",
        DSPARK_RECOVERY_BACKOFF_S="1",
    )
    supervisor = popen(tb, tmp_path, env, "start", "--foreground", merge=True)
    seen = read_until_served(supervisor)
    journal = Journal(supervisor)
    recoveries = tmp_path / "state" / "recoveries.json"
    try:
        first = state(tmp_path)["server"]
        # Idle for three timeouts, as the supervisor's own looks say (its point moves on at each look): no action.
        began = watch_point(tmp_path)["at"]
        deadline = time.monotonic() + 10 * STALL_S
        while watch_point(tmp_path)["at"] - began < 3 * STALL_S and time.monotonic() < deadline:
            time.sleep(0.5)
        assert watch_point(tmp_path)["at"] - began >= 3 * STALL_S, watch_point(tmp_path)
        assert not recoveries.exists() and state(tmp_path)["server"]["pid"] == first["pid"], journal.text()

        # One prompt whose chunked prefill outlasts the timeout: no token counter moves until its last chunk, but its
        # KV blocks do each step; no action. Unpaced, the tiny model's 62 steps take about 2 s: paced, at least 12.4.
        words = " ".join(["the model token cluster node head worker spark serve request"] * 55)  # 990 tokens
        code, reply, took = completion_in_head(tb, words)
        assert code == 200 and reply["usage"]["prompt_tokens"] >= 900, reply
        print(f"a {reply['usage']['prompt_tokens']}-token prefill took {took:.1f} s (stall timeout {STALL_S} s)")
        assert took > STALL_S + 2, f"the prefill took {took:.1f} s: too fast to show anything; a longer prompt needed"
        assert not recoveries.exists() and state(tmp_path)["server"]["pid"] == first["pid"], journal.text()
        assert "supervisor:" not in journal.text()

        # The EngineCore stopped with a stream running: stalled within the timeout plus one poll, then restarted.
        said = stop_and_wait_for_stall(tb, tmp_path, env, engine_core(tmp_path), supervisor.pid)
        print(f"status begun {said:.1f} s after the SIGSTOP said stalled")
        journal.wait_for(
            r"supervisor: vllm serve \(pid \d+\) answers but its engine: stalled for \d+ s.*; serve-only "
            r"restart in 1 s \(recovery 1 of at most 2 within an hour\)",
            60,
        )
        journal.wait_for(r"supervisor: recovered: vllm serve \(pid (\d+)\)", 600)
        second = state(tmp_path)["server"]
        assert second["pid"] != first["pid"]
        old_log = Path(first["log"] + ".1").read_text(errors="replace")
        assert re.search(r"dspark supervisor: vllm serve \(pid \d+\) answers but its engine: stalled for", old_log)
        smoke = run(tb, tmp_path, env, "smoke", "-c", "1")
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr

        # A vLLM Ray worker on the worker node stopped: the engine waits on it, stalled, restarted as well.
        workers = processes_named(tb, "worker1", "RayWorkerProc")
        assert workers, describe(our_pids(tb, "worker1"))
        stop_and_wait_for_stall(tb, tmp_path, env, workers[0], supervisor.pid)
        journal.wait_for(r"recovered: vllm serve \(pid (\d+)\)", 600, count=2)
        assert state(tmp_path)["server"]["pid"] != second["pid"]
        smoke = run(tb, tmp_path, env, "smoke", "-c", "1")
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr

        # Stopped again after the second recovery: the hourly limit ends supervision with the reason, not a loop.
        stop_and_wait_for_stall(tb, tmp_path, env, engine_core(tmp_path), supervisor.pid)
        supervisor.wait(timeout=300)
        journal.thread.join(timeout=10)
    finally:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(timeout=180)
        run(tb, tmp_path, env, "stop")
    out = "".join(seen) + journal.text()
    assert supervisor.returncode == 4, out[-5000:]
    assert re.search(
        r"dspark: error: .*stalled for \d+ s.*; 2 recoveries within the last hour already "
        r"\(DSPARK_RECOVERY_LIMIT=2, the first at \d\d:\d\d:\d\d\): giving up",
        out,
    ), out[-5000:]
    assert "exit 4: the unit does not restart it" in out and "Traceback" not in out
    assert len(json.loads(recoveries.read_text())) == 2
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
