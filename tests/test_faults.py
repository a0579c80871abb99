"""The fault matrix on the two-namespace testbed (docs/security.md lists the observed behaviour).

Covered here: head "reboot" with a stale state folder, a worker's network cut while
serving (then `restart`, with the env file edited during that start), a start
interrupted at each phase, unwritable state and log folders. The worker's Ray killed
while serving (`--foreground` exits 1) is in tests/test_security.py, which shares
that start with the exposure checks. Starts are shared where the assertions allow.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from dspark_launch.node import procfs
from tests.support.on_testbed import (
    dspark,
    interrupt_after,
    ours_left,
    popen,
    run,
    serving_env,
    set_knob,
    spawn_lookalike,
    write_env,
)
from tests.support.processes import cmdline, describe, kill_now, start_time, survives, wait_until

pytestmark = pytest.mark.testbed


def status(tb, tmp_path: Path, env_file: Path) -> tuple[int, dict]:
    proc = run(tb, tmp_path, env_file, "status", "--json", timeout=120)
    return proc.returncode, json.loads(proc.stdout)


def one_error(stderr: str) -> str:
    errors = [l for l in stderr.splitlines() if l.startswith("dspark: error:")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


# --------------------------------------------------------------------------- head "reboot"


def test_head_reboot_stale_state_and_unrelated_ray_survive(testbed_clean, tmp_path):
    """All our processes gone, state folder kept: status says down, `cluster up` starts cleanly,
    and nothing that merely sits at a recorded pid or session is touched; an unrelated Ray
    (another `ray start` on the same head) survives `dspark stop`."""
    tb = testbed_clean
    env = write_env(tb, tmp_path)
    up = dspark(tb, env, "cluster", "up")
    assert up.returncode == 0, up.stderr[-3000:]

    # "Reboot": every process of ours on both nodes ends at once; the state folder stays.
    kill_now(ours_left(tb, set()))
    assert wait_until(lambda: not ours_left(tb, set()), 20)

    # After the reboot, unrelated processes hold the recorded pid numbers and session ids.
    lookalike, lookalike_started = spawn_lookalike(
        tb, "head", "ray::IDLE", sys.executable, "-c", "import time; time.sleep(900)"
    )
    state_file = tmp_path / "state" / "state.json"
    saved = json.loads(state_file.read_text())
    head = next(n for n in saved["nodes"] if n["name"] == "head")
    head["processes"][0].update(pid=lookalike, start_time=lookalike_started - 50)  # a reused pid
    # A pid *and* start time that match, from another boot (deterministic boots repeat them).
    head["processes"].append(
        {
            "pid": lookalike,
            "start_time": lookalike_started,
            "sid": lookalike,
            "boot_id": "00000000-0000-0000-0000-000000000000",
            "cmd": "raylet",
        }
    )
    # A recycled session id: none of our processes lives in it any more.
    head["sessions"].append(
        {"sid": lookalike, "start_time": max(0, lookalike_started - 1), "boot_id": procfs.boot_id()}
    )
    saved["server"] = {
        "pid": lookalike,
        "start_time": lookalike_started - 50,
        "marker": "dspark-0badcafe-server",
        "sessions": [{"sid": lookalike, "start_time": 0}],
        "log": str(tmp_path / "state/logs/x.log"),
        "url": "http://127.0.0.1:8000",
        "served_name": "tiny",
        "model": "tiny",
        "started_at": time.time() - 3600,
        "settings": {},
        "digest": "",
        "cap": 1,
    }
    state_file.write_text(json.dumps(saved))

    # An unrelated Ray on the same head node (loopback, its own port and temp dir).
    other_tmp = Path(f"/tmp/dspark-other-ray-{os.getpid()}")
    before = tb.pids_in("head", include_infra=False)
    other = tb.exec(
        "head",
        [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--head",
            "--port",
            "6390",
            "--node-ip-address",
            "127.0.0.1",
            "--temp-dir",
            str(other_tmp),
            "--num-cpus",
            "0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--ray-client-server-port",
            "23001",
            "--object-store-memory",
            "80000000",
        ],
        env={"RAY_AUTH_MODE": "disabled"},
        timeout=120,
    )
    assert other.returncode == 0, other.stdout[-2000:] + other.stderr[-2000:]
    try:
        _check_stale_state_and_other_ray(tb, tmp_path, env, state_file, before, lookalike, lookalike_started)
    finally:
        kill_now(tb.pids_in("head", include_infra=False) - before)
        wait_until(lambda: not (tb.pids_in("head", include_infra=False) - before), 10)
        shutil.rmtree(other_tmp, ignore_errors=True)


def _check_stale_state_and_other_ray(tb, tmp_path, env, state_file, before, lookalike, lookalike_started):
    def other_pids() -> set[int]:
        return tb.pids_in("head", include_infra=False) - before - {lookalike}

    # The other Ray's daemons settle (its agents start after `ray start` returns).
    previous: set[int] | None = None
    deadline = time.monotonic() + 60  # ends once two looks agree; a busy host starts them slowly
    while time.monotonic() < deadline:
        current = other_pids()
        if current == previous:
            break
        previous = current
        time.sleep(2)
    other_ray = {pid: start_time(pid) for pid in other_pids()}
    assert any("gcs_server" in cmdline(pid) for pid in other_ray), other_ray
    unrelated = set(other_ray) | {lookalike}

    started = time.monotonic()
    code, data = status(tb, tmp_path, env)
    assert time.monotonic() - started < 30
    assert code == 0 and data["state"] == "down", data
    assert not any(n["ray_alive"] for n in data["nodes"]) and data["server"]["state"] == "dead"
    text = run(tb, tmp_path, env, "status")
    assert text.stdout.startswith("cluster: down"), text.stdout
    problem = [l for l in text.stdout.splitlines() if l.startswith("problem: vllm serve")]
    assert len(problem) == 1 and "is not running" in problem[0] and "dspark restart" in problem[0], text.stdout

    # `stop` on the stale state: nothing to stop, nothing of anyone else's touched.
    stale = state_file.read_text()
    stopped = dspark(tb, env, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "vllm serve: stopped 0 process(es)" in stopped.stderr
    assert "head (10.213.0.1): stopped 0 process(es)" in stopped.stderr
    assert survives(lookalike, lookalike_started)

    # `cluster up` straight on the stale state (the reboot case): a clean start.
    state_file.write_text(stale)
    again = dspark(tb, env, "cluster", "up")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "leftover" not in again.stderr  # nothing of a previous run was found to stop
    assert survives(lookalike, lookalike_started)

    stopped = dspark(tb, env, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert ours_left(tb, unrelated) == set(), describe(ours_left(tb, unrelated))
    assert survives(lookalike, lookalike_started)
    killed = [pid for pid, t in other_ray.items() if t is not None and not survives(pid, t)]
    assert killed == [], describe(set(killed))  # never a machine-wide `ray stop`, never a kill by name


# --------------------------------------------------------------------------- network cut, restart, env snapshot


def test_worker_link_cut_then_restart_uses_its_env_snapshot(testbed_clean, tmp_path, tiny_model):
    tb = testbed_clean
    env = serving_env(tb, tmp_path, tiny_model, SSH_CONNECT_TIMEOUT_S="5")
    started = run(tb, tmp_path, env, "start")
    assert started.returncode == 0, started.stderr[-4000:]

    # The worker's cable is pulled while serving: status answers within a bounded time, says degraded.
    tb.link_down("worker1")
    try:
        began = time.monotonic()
        proc = run(tb, tmp_path, env, "status", "--json", timeout=120)
        took = time.monotonic() - began
        data = json.loads(proc.stdout)
        print(f"status --json during the cut: {took:.1f} s")
        assert took < 60, f"status took {took:.0f} s"
        assert proc.returncode == 1 and data["state"] == "degraded", data
        worker = data["nodes"][1]
        assert worker["reachable"] is False and worker["ray_alive"] is False
        assert [p for p in data["problems"] if p.startswith("worker1 (10.213.0.2): unreachable")], data["problems"]
        text = run(tb, tmp_path, env, "status", timeout=120)
        problems = [l for l in text.stdout.splitlines() if l.startswith("problem: worker1 (10.213.0.2)")]
        assert len(problems) == 1 and "check the fabric link" in problems[0], text.stdout
    finally:
        tb.link_up("worker1")

    # The link is back: `restart` recovers. The env file changes during that start: the run
    # keeps the snapshot it read, and status shows the drift afterwards.
    proc = popen(tb, tmp_path, env, "restart")
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if "launching vllm serve" in line:
                set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "2")
                break
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(seen) + err[-4000:]
    assert "in-flight prefill cap: 1" in out
    log = (tmp_path / "state" / "logs" / "vllm-serve.log").read_text(errors="replace")
    assert re.search(r"dspark-issue27 hotfix v\d+ active: cap=1\b", log)
    code, data = status(tb, tmp_path, env)
    assert code == 0 and data["state"] == "up", data
    assert data["server"]["cap"] == 1
    assert {"name": "DSPARK_MAX_INFLIGHT_PREFILLS", "running": "1", "configured": "2"} in data["server"]["drift"]

    stopped = run(tb, tmp_path, env, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert ours_left(tb, set()) == set(), describe(ours_left(tb, set()))


# --------------------------------------------------------------------------- interrupted starts

# (line on stderr that marks the phase, seconds to wait after it, signal): one per rollback path,
# both signals covered. Nothing started yet (pre-flight); Ray up on the head and starting on the
# worker, the hotfix being written beside it (hotfix: Ray and the scheduler files undone); the
# server starting (vllm serve, then Ray). A signal during the Ray bring-up alone is the same path
# as `cluster up` interrupted (tests/test_cluster.py::test_interrupt_during_bring_up_rolls_back).
PHASES = {
    "pre-flight": ("pre-flight head", 0, signal.SIGINT),
    "hotfix": ("applying the scheduler hotfix on head", 0, signal.SIGTERM),
    # the phase line right before the wait for the server (its first wait line may already be a later phase)
    "serve-wait": ("launching vllm serve on head", 2, signal.SIGINT),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_start_interrupted_at_each_phase(testbed_clean, tmp_path, tiny_model, phase):
    tb = testbed_clean
    marker, delay, sig = PHASES[phase]
    env = serving_env(tb, tmp_path, tiny_model)
    proc = popen(tb, tmp_path, env, "start")
    seen, err = interrupt_after(proc, marker, delay, sig, timeout=300)
    expected = 130 if sig == signal.SIGINT else 143
    assert proc.returncode == expected, "".join(seen) + err[-4000:]
    assert any(marker in l for l in seen), "".join(seen)
    assert f"interrupted; everything this run started was stopped (exit {expected})" in err
    # An agent forked at the very moment of the signal ends by itself once its stdin closes.
    assert wait_until(lambda: not ours_left(tb, set()), 10), describe(ours_left(tb, set()))
    saved = tmp_path / "state" / "state.json"
    assert not saved.exists() or json.loads(saved.read_text()).get("server") in ({}, None)


# --------------------------------------------------------------------------- unwritable folders


def _read_only(tb, node: str, path: Path) -> None:
    """Make `path` read-only inside `node` only (a read-only bind mount in its mount namespace): root included."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)  # private, as a log folder must be: only unwritable
    tb.exec(node, ["mount", "--bind", str(path), str(path)], check=True)
    tb.exec(node, ["mount", "-o", "remount,bind,ro", str(path)], check=True)


def test_unwritable_state_or_log_folder_fails_before_anything_starts(testbed_clean, tmp_path, tiny_model):
    tb = testbed_clean
    mounts = []
    try:
        # The state folder (start): exit 2, one line, nothing started, nothing written.
        ro = tmp_path / "ro"
        _read_only(tb, "head", ro)
        mounts.append(("head", ro))
        env = serving_env(tb, tmp_path, tiny_model, DSPARK_STATE_DIR=str(ro / "state"))
        proc = run(tb, tmp_path, env, "start")
        assert proc.returncode == 2, proc.stderr[-3000:]
        error = one_error(proc.stderr)
        assert f"DSPARK_STATE_DIR={ro / 'state'}: not writable (Read-only file system)" in error
        assert "nothing was started" in error
        assert "pre-flight" not in proc.stderr and not (ro / "state").exists()
        assert ours_left(tb, set()) == set()

        # The log folder inside a writable state folder (cluster up): exit 2 as well.
        state_dir = tmp_path / "state2"
        _read_only(tb, "head", state_dir / "logs")
        mounts.append(("head", state_dir / "logs"))
        env = write_env(tb, tmp_path, DSPARK_STATE_DIR=str(state_dir))
        proc = dspark(tb, env, "cluster", "up")
        assert proc.returncode == 2, proc.stderr[-3000:]
        error = one_error(proc.stderr)
        assert f"the log folder {state_dir / 'logs'}: not writable (Read-only file system)" in error
        assert ours_left(tb, set()) == set()

        # The same folder on a worker (Ray writes its start log there): a pre-flight failure naming the node.
        state_dir = tmp_path / "state3"
        _read_only(tb, "worker1", state_dir / "logs")
        mounts.append(("worker1", state_dir / "logs"))
        env = write_env(tb, tmp_path, DSPARK_STATE_DIR=str(state_dir))
        proc = dspark(tb, env, "cluster", "up")
        assert proc.returncode == 1, proc.stderr[-3000:]
        error = one_error(proc.stderr)
        assert f"worker1 (10.213.0.2): log folder: {state_dir / 'logs'} is not writable there" in error, error
        assert "starting Ray" not in proc.stderr
        assert ours_left(tb, set()) == set()
    finally:
        for node, path in reversed(mounts):
            tb.exec(node, ["umount", str(path)])
