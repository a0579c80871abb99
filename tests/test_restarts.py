"""Operator restarts without downtime on the two-namespace testbed: real SSH, Ray, vLLM (CPU).

A drained `stop` or `restart` lets in-flight streams finish (vLLM's --shutdown-timeout), `--now` cuts
them; a serve-only `restart` keeps the Ray processes, a cluster-level change restarts them; `reload` changes
the cap of the running scheduler under load and refuses a change that needs a restart. The first server is the
systemd unit's `start --foreground`: the supervisor leaves the operator's refused restart alone and ends (exit 0)
when the serve-only restart replaces its run. One server life for all of it (the suite's time budget).
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dspark_launch.hotfix.contract import PATCH_VERSION
from dspark_launch.node import procfs
from tests.support.launcher_env import paced_extra_args
from tests.support.on_testbed import (
    API_KEY,
    our_pids,
    popen,
    read_until_served,
    run,
    serving_env,
    set_knob,
    state,
    status,
)
from tests.support.processes import describe
from tests.support.relay_streams import PACED_TOKENS, drained_relay, relayed_streams

pytestmark = [pytest.mark.testbed, pytest.mark.serving]

CLIENT = Path(__file__).parent / "support" / "stream_client.py"
STREAMS = 4
# Long enough that every stop or restart (which first checks the new plan) lands while the streams run: paced
# steps (PACED_STEP_MS) make them last at least 30 s however loaded the host; the drain limit is raised to match so a
# drained stop never has to cut them.
MAX_TOKENS = PACED_TOKENS
DRAIN_S = "300"


def streams_in_flight(tb, max_tokens: int = MAX_TOKENS) -> subprocess.Popen:
    """STREAMS streaming chats from inside the head node, returned once each has its first token."""
    client = tb.popen(
        "head",
        [sys.executable, str(CLIENT), "http://127.0.0.1:8000", API_KEY, "tiny", str(STREAMS), str(max_tokens)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = set()
    deadline = time.monotonic() + 120
    while len(started) < STREAMS and time.monotonic() < deadline:
        line = client.stdout.readline()
        if not line:
            break
        if line.startswith("first "):
            started.add(line.split()[1])
    assert len(started) == STREAMS, f"only {sorted(started)} streaming; {client.stderr.read()[-2000:]}"
    return client


def outcomes(client: subprocess.Popen) -> list[dict]:
    out, err = client.communicate(timeout=240)
    found = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(found) == STREAMS, out + err
    return found


def ray_pids(tmp_path: Path) -> dict[str, list[int]]:
    return {node["name"]: sorted(p["pid"] for p in node["processes"]) for node in state(tmp_path)["nodes"]}


def serve_entries(tb) -> set[int]:
    """The head's processes that run dspark's serve entry (a vllm serve's API server)."""
    found = set()
    for pid in tb.pids_in("head"):
        try:
            if "dspark_launch.node.serve_entry" in procfs.cmdline(pid):
                found.add(pid)
        except FileNotFoundError:
            pass
    return found


def assert_engine_core_from_the_fork_server(log_path: Path, server: int) -> None:
    """The served EngineCore (its pid from vLLM's log prefix) is a child of a fork server, the server's child."""
    engine_core = int(re.findall(r"\(EngineCore(?:_DP0)? pid=(\d+)\)", log_path.read_text(errors="replace"))[-1])
    fork_server = procfs.parent(engine_core)
    assert fork_server != server and procfs.parent(fork_server) == server, describe({engine_core})
    assert "multiprocessing.forkserver" in " ".join(procfs.cmdline(fork_server)), describe({engine_core, fork_server})


def finished_all(results: list[dict]) -> bool:
    return all(r["finish_reason"] == "length" and r["error"] is None for r in results)


def test_restarts_keep_ray_when_they_can_reload_is_live_and_stops_drain_unless_now(testbed_clean, tmp_path, tiny_model):
    """One server life (the suite's time budget): a serve-only restart drains streams and keeps Ray;
    `reload` takes the cap 2 -> 3 while 4 streams run (none cut, the server kept), then a change that needs
    a restart is refused (exit 2) naming the setting, with nothing changed; a cluster-level `restart --now`
    cuts streams and restarts Ray, a plain `stop` drains streams."""
    tb = testbed_clean
    env = serving_env(
        tb,
        tmp_path,
        tiny_model,
        MAX_MODEL_LEN="1024",
        MAX_NUM_BATCHED_TOKENS="1024",
        DSPARK_DRAIN_TIMEOUT_S=DRAIN_S,
        VLLM_EXTRA_ARGS=paced_extra_args(),
    )
    supervisor = popen(tb, tmp_path, env, "start", "--foreground", merge=True)
    try:
        read_until_served(supervisor)
        restarts_beside_the_supervisor(tb, tmp_path, env, supervisor)
    finally:
        if supervisor.poll() is None:  # the testbed's reset stops what it leaves
            supervisor.kill()
            supervisor.communicate()


def restarts_beside_the_supervisor(tb, tmp_path: Path, env: Path, supervisor: subprocess.Popen) -> None:
    ray_before, server_before = ray_pids(tmp_path), state(tmp_path)["server"]["pid"]
    assert all(ray_before.values()), ray_before

    # a serve-only restart whose new arguments vLLM refuses: exit 2 naming them, the old server untouched
    # (its process, its log not rotated), the new one (started warm to check them) gone
    log_path = tmp_path / "state" / "logs" / "vllm-serve.log"
    served_log = log_path.read_bytes()
    set_knob(env, "VLLM_EXTRA_ARGS", f"{paced_extra_args()} --no-such-flag-in-vllm")
    bad = run(tb, tmp_path, env, "restart")
    assert bad.returncode == 2, bad.stderr[-3000:]
    refusal = [line for line in bad.stderr.splitlines() if "refused by the installed vLLM" in line]
    assert refusal and "--no-such-flag-in-vllm" in refusal[0] and "VLLM_EXTRA_ARGS from " in refusal[0], bad.stderr
    assert state(tmp_path)["server"]["pid"] == server_before and procfs.start_time(server_before)
    assert log_path.read_bytes().startswith(served_log) and not (log_path.parent / "vllm-serve.log.1").exists()
    warm_log = (log_path.parent / "vllm-serve.next.log").read_text(errors="replace")
    assert "DSPARK-ARGCHECK " in warm_log and "no-such-flag-in-vllm" in warm_log
    assert serve_entries(tb) == {server_before}, "the refused server is gone, the old one serves"
    set_knob(env, "VLLM_EXTRA_ARGS", paced_extra_args())

    # serve-only restart, drained: the streams finish, Ray's processes are the same ones
    set_knob(env, "MAX_NUM_SEQS", "4")
    set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "2")
    client = streams_in_flight(tb)
    began = time.monotonic()
    serve_only = run(tb, tmp_path, env, "restart")
    serve_only_s = time.monotonic() - began
    assert serve_only.returncode == 0, serve_only.stderr[-4000:]
    assert finished_all(outcomes(client))
    assert (
        "restart: serve-only (Ray and the nodes kept up; only vllm serve restarts): serve-level setting(s) "
        "changed: DSPARK_MAX_INFLIGHT_PREFILLS 1 -> 2, MAX_NUM_SEQS 6 -> 4"
    ) in serve_only.stderr
    # (the new plan is checked before the old server drains: the streams may have ended by then)
    assert " 0 cut" in serve_only.stderr, serve_only.stderr[-3000:]
    # the new server checked its arguments in its own process, started warm while the old one still served
    assert "in the new server's own process" in serve_only.stderr, serve_only.stderr[-3000:]
    assert "(warm: vLLM imported, arguments checked)" in serve_only.stderr, serve_only.stderr[-3000:]
    # The supervisor left the refused restart alone; it saw its server go, waited for the restart's lock, found
    # another run in the record and ended without stopping it (exit 0: the unit does not restart it).
    out, _ = supervisor.communicate(timeout=180)
    assert supervisor.returncode == 0, out[-3000:]
    assert "stopped or replaced by another dspark command" in out and "Traceback" not in out, out[-3000:]
    assert ray_pids(tmp_path) == ray_before and state(tmp_path)["server"]["pid"] != server_before
    # its EngineCore was forked from the fork server that imported vLLM's engine core during the warm wait,
    # not spawned by the API server after go
    assert_engine_core_from_the_fork_server(log_path, state(tmp_path)["server"]["pid"])
    assert all(pid in our_pids(tb, node) for node, pids in ray_before.items() for pid in pids)
    code, data = status(tb, tmp_path, env)
    assert code == 0 and data["state"] == "up" and data["server"]["cap"] == 2 and data["server"]["drift"] == [], data
    log = (tmp_path / "state" / "logs" / "vllm-serve.log").read_text(errors="replace")
    assert "'max_num_seqs': 4" in log
    assert "--shutdown-timeout" in log or "shutdown_timeout" in log
    assert re.search(r"dspark-issue27 hotfix v\d+ active: cap=2 ", log)  # the new server's scheduler, cap applied
    assert API_KEY not in serve_only.stdout + serve_only.stderr  # a restart prints no key either
    for node in ("head", "worker1"):  # nor puts it in the argv of what it started
        for pid in tb.pids_in(node):
            try:
                assert API_KEY not in "\0".join(procfs.cmdline(pid)), describe({pid})
            except FileNotFoundError:
                pass

    # `reload` under load: the cap 2 -> 3 on the running scheduler, no stream cut, the server kept
    server = state(tmp_path)["server"]
    control = tmp_path / "state" / "scheduler-control"
    client = streams_in_flight(tb)
    set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "3")
    reloaded = run(tb, tmp_path, env, "reload")
    assert reloaded.returncode == 0, reloaded.stderr[-4000:]
    assert "reload: DSPARK_MAX_INFLIGHT_PREFILLS 2 -> 3: in force on the running scheduler" in reloaded.stdout
    print(reloaded.stdout)  # the time to the cap in force: reported, never asserted
    assert finished_all(outcomes(client))
    log = log_path.read_text(errors="replace")
    live = log.index(f"dspark-issue27 hotfix v{PATCH_VERSION}: cap 2 -> 3 (live); in force: cap 3,")
    after = re.search(
        r"dspark-issue27 step=\d+ cap=(\d+) inflight=\d+ prefill_tokens=\d+ decode_tokens=\d+ "
        r"decode_reqs=(\d+)",
        log[live:],
    )
    assert after and after.group(1) == "3" and int(after.group(2)) > 0, "the change landed while streams decoded"
    assert stat.S_IMODE(control.stat().st_mode) == 0o600
    record = state(tmp_path)["server"]
    assert record["pid"] == server["pid"] and record["scheduler_cap"] == 3
    assert record["live"] == {"DSPARK_MAX_INFLIGHT_PREFILLS": "3"} and record["live_since"]
    code, data = status(tb, tmp_path, env)
    assert code == 0 and data["server"]["cap"] == 3 and data["server"]["drift"] == [], data
    assert data["server"]["live"] == {"DSPARK_MAX_INFLIGHT_PREFILLS": "3"}

    # a change that needs a restart: refused, nothing changed (not even the live setting beside it)
    before = (control.read_bytes(), control.stat().st_mtime_ns, state(tmp_path))
    set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "4")
    set_knob(env, "MAX_NUM_SEQS", "5")
    refused = run(tb, tmp_path, env, "reload")
    assert refused.returncode == 2, refused.stderr[-4000:]
    assert "these settings need `dspark restart`: MAX_NUM_SEQS 4 -> 5" in refused.stderr
    assert "nothing was changed" in refused.stderr
    assert (control.read_bytes(), control.stat().st_mtime_ns, state(tmp_path)) == before
    assert "cap 3 -> 4" not in log_path.read_text(errors="replace")
    set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "3")
    set_knob(env, "MAX_NUM_SEQS", "4")

    # cluster-level change, `restart --now`: the stream in flight is cut, Ray restarts. A relay (one stream
    # after another): four fixed streams could all end before the restart, slower on loaded cores, reached its stop
    set_knob(env, "RAY_OBJECT_STORE_MB", "256")
    client = relayed_streams(tb, MAX_TOKENS)
    began = time.monotonic()
    full = run(tb, tmp_path, env, "restart", "--now")
    full_s = time.monotonic() - began
    assert full.returncode == 0, full.stderr[-4000:]
    streamed, streamed_err = client.communicate(timeout=240)
    relayed = [json.loads(line) for line in streamed.splitlines() if line.startswith("{")]
    assert any(r["tokens"] > 0 and r["finish_reason"] not in ("length", "stop") for r in relayed), (
        streamed + streamed_err
    )  # drained instead, the stream in flight would end at its length
    assert "restart: full: cluster-level setting(s) changed: RAY_OBJECT_STORE_MB" in full.stderr
    assert "drained" not in full.stderr
    assert set(sum(ray_pids(tmp_path).values(), [])).isdisjoint(sum(ray_before.values(), []))
    # a full restart's start: its server was started warm beside the new Ray, its EngineCore from its fork server
    assert "(it imports vLLM while Ray starts)" in full.stderr and "(warm: vLLM imported" in full.stderr
    assert_engine_core_from_the_fork_server(log_path, state(tmp_path)["server"]["pid"])
    print(f"restart times: serve-only {serve_only_s:.1f} s, full {full_s:.1f} s")  # reported, never asserted

    # a plain stop drains: the stream in flight finishes, nothing of ours is left. A relay: four fixed streams
    # could all end before the stop reached its drain (seen once on a fresh clone: "idle, 0 finished")
    client = relayed_streams(tb, MAX_TOKENS)
    stopped = run(tb, tmp_path, env, "stop")
    assert stopped.returncode == 0, stopped.stderr[-4000:]
    drained_relay(client, stopped.stderr)
    log = (tmp_path / "state" / "logs" / "vllm-serve.log").read_text(errors="replace")
    assert "draining in-flight requests count=1" in log
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
