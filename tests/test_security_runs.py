"""Ray's private temp folders and the first token of two
first starts at once (points 1 and 7), and a `start --foreground` supervisor beside an operator's
`stop` (point 8; its `restart` beside one: tests/test_restarts.py). Heavy: run under the shared lock.

The supervisor's life also carries the fast day-to-day command: the idle `stop` ends as soon as the EngineCore
says it had nothing in flight. Timings go to bench/fast_ops.py, never here."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from dspark_launch.node import procfs, ray_dirs
from dspark_launch.serve.drain import BUSY_LOG, DRAINED_LOG
from tests.support.launcher_env import launcher_env, scratch
from tests.support.on_testbed import (
    VENV_BIN,
    dspark,
    our_pids,
    read_until_served,
    serving_env,
    state,
    write_env,
)
from tests.support.processes import describe

pytestmark = pytest.mark.testbed


def popen(tb, tmp_path: Path, env_file: Path, *args: str) -> subprocess.Popen:
    return tb.popen(
        "head",
        [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)],
        env=launcher_env(scratch(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run(tb, tmp_path: Path, env_file: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return tb.exec(
        "head",
        [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)],
        env=launcher_env(scratch(tmp_path)),
        timeout=timeout,
    )


def finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out


def writable_by_nobody(folders: list[Path]) -> list[str]:
    """The folders another local user (nobody) can create a file in, tried for real with setpriv."""
    found = []
    for folder in folders:
        probe = folder / f".probe-{os.getpid()}"
        tried = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "touch", str(probe)],
            capture_output=True,
            text=True,
        )
        if tried.returncode == 0:
            found.append(str(folder))
            probe.unlink()
    return found


def test_private_ray_folders_and_one_token_for_two_first_starts(testbed_clean, tmp_path):
    tb = testbed_clean
    env = write_env(tb, tmp_path)
    state_dir = tmp_path / "state"
    # The old, predictable place, planted as the issue describes: each node's folder a link to a victim.
    victim = tmp_path / "etc-like"
    victim.mkdir(mode=0o755)
    victim.chmod(0o755)
    planted = Path(f"/tmp/dspark-{hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]}")
    planted.mkdir(mode=0o755)
    try:
        for node in ("head", "worker1"):
            (planted / node).symlink_to(victim)
        etc_mode = os.stat("/etc").st_mode
        first, second = (popen(tb, tmp_path, env, "cluster", "up") for _ in range(2))
        outputs = [finish(first, 300), finish(second, 300)]
        codes = sorted((first.returncode, second.returncode))
        assert codes == [0, 1], outputs
        loser = outputs[[first.returncode, second.returncode].index(1)]
        assert "another dspark (pid" in loser and "Traceback" not in loser, loser
        record = state(tmp_path)
        token = (state_dir / "ray-auth-token").read_text().strip()
        assert len(token) == 64
        for node in record["nodes"]:
            daemons = [proc for proc in node["processes"] if "raylet" in proc["cmd"].split(" ")[0]]
            assert daemons, node
            for proc in daemons:  # the token the running cluster uses is the file's
                assert f"RAY_AUTH_TOKEN={token}".encode() in procfs.environ(proc["pid"]), node["name"]
            temp = Path(node["ray_temp_dir"])
            root = ray_dirs.private_root()  # /run/dspark-0 for root (docs/security.md, issue 22 point 7)
            assert temp.parent == root, temp
            root_stat = os.lstat(root)
            assert stat.S_ISDIR(root_stat.st_mode) and stat.S_IMODE(root_stat.st_mode) == 0o700
            assert root_stat.st_uid == os.geteuid()
            sessions = [p for p in temp.iterdir() if p.name.startswith("session_") and not p.is_symlink()]
            assert sessions, list(temp.iterdir())
            # Ray chmods its folders 0777 (and again whenever one of its processes starts): the private
            # folder above them is what keeps every other user out.
            ray_folders = [temp, *sessions, *(s / "sockets" for s in sessions), *(s / "logs" for s in sessions)]
            assert writable_by_nobody(ray_folders) == [], node["name"]
        assert stat.S_IMODE(victim.stat().st_mode) == 0o755 and list(victim.iterdir()) == []
        assert os.stat("/etc").st_mode == etc_mode
    finally:
        dspark(tb, env, "cluster", "down")
        for node in ("head", "worker1"):
            (planted / node).unlink(missing_ok=True)
        planted.rmdir()
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)


@pytest.mark.serving
def test_foreground_supervisor_leaves_an_operators_stop_alone(testbed_clean, tmp_path, tiny_model):
    """The systemd unit's `start --foreground` acts only on its own run: the operator's idle stop beside it does
    not wait, and the supervisor exits 0 (not restarted by Restart=on-failure); the unit started while an operator
    holds the lock is one line, exit 1. (Its restart beside the supervisor: tests/test_restarts.py.)"""
    tb = testbed_clean
    env = serving_env(tb, tmp_path, tiny_model)
    lock_path = tmp_path / "state" / "lock"
    log = tmp_path / "state" / "logs" / "vllm-serve.log"
    supervisor = popen(tb, tmp_path, env, "start", "--foreground")
    try:
        read_until_served(supervisor)
        # Idle: the EngineCore logs its done line with no busy line before it, and the stop ends there.
        before = log.stat().st_size
        idle = run(tb, tmp_path, env, "stop")
        assert idle.returncode == 0, idle.stderr[-3000:]
        assert "vllm serve was idle (nothing in flight): stopped in" in idle.stderr, idle.stderr[-3000:]
        tail = log.read_bytes()[before:].decode(errors="replace")
        assert DRAINED_LOG in tail and BUSY_LOG not in tail, tail[-3000:]
        out = finish(supervisor, 120)
        assert supervisor.returncode == 0, out[-3000:]
        assert "stopped or replaced by another dspark command" in out and "Traceback" not in out
        assert not (tmp_path / "state" / "state.json").exists()
        left = our_pids(tb, "head") | our_pids(tb, "worker1")
        assert left == set(), describe(left)
        # The unit started while an operator holds the lock: one line, exit 1, nothing touched.
        with open(lock_path, "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            lock.truncate(0)
            lock.write("4242\n")
            lock.flush()
            held = run(tb, tmp_path, env, "start", "--foreground", timeout=120)
        assert held.returncode == 1 and "another dspark (pid 4242) holds" in held.stderr, held.stderr
        assert "Traceback" not in held.stderr
    finally:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            finish(supervisor, 120)
        run(tb, tmp_path, env, "stop")
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
