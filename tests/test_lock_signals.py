"""The deployment lock with real processes: a probe of who holds it (`status`, the `--foreground`
supervisor) never makes a launcher fail, and a `dspark` command killed by SIGTERM while it holds the
lock leaves the lock free, the record whole and the next command working (two-node testbed, heavy). The
`--foreground` supervisor signalled again while it holds the lock to stop its run: tests/test_platform_testbed.py,
whose supervised life ends that way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dspark_launch.cluster.state import LOCK_FILE, STATE_FILE, LockHeld, load_state, lock_holder, state_lock


def test_a_holder_probe_is_never_taken_for_a_holder(tmp_path):
    """`lock_holder` takes the lock shared for a moment; a launcher taking it then used to fail at once
    with `another dspark (pid N) holds` (1 start in 20 here, with a probe in a tight loop)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    with state_lock(state_dir):
        pass  # the lock file exists before the prober opens it
    prober = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\nfrom pathlib import Path\nfrom dspark_launch.cluster.state import lock_holder\n"
                f"state = Path({str(state_dir)!r})\nprint('probing', flush=True)\n"
                "while True:\n    lock_holder(state)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert prober.stdout.readline() == "probing\n"
        refused = 0
        for _ in range(1000):
            try:
                with state_lock(state_dir):
                    pass
            except LockHeld:
                refused += 1
    finally:
        prober.kill()
        prober.wait()
    assert refused == 0
    with state_lock(state_dir):  # a real holder is still named, at once
        holder = subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "from pathlib import Path\nfrom dspark_launch.cluster.state import state_lock\n"
                    f"with state_lock(Path({str(state_dir)!r})): pass"
                ),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert holder.returncode == 1 and f"another dspark (pid {os.getpid()}) holds" in holder.stderr


@pytest.mark.testbed
def test_sigterm_to_a_command_holding_the_lock(testbed_clean, tmp_path):
    """`dspark stop` gets SIGTERM as soon as it holds the lock (mid-stop: Ray runs on both nodes): it ends the
    agents it was talking to and exits 143 with one line. After it: the lock is free, state.json is absent or a
    whole record (no temporary file beside it), and the next `stop`, `cluster up` and `cluster down` work,
    leaving nothing of ours behind."""
    from tests.support.on_testbed import VENV_BIN, dspark, our_pids, write_env
    from tests.support.processes import describe, wait_until

    tb = testbed_clean
    env = write_env(tb, tmp_path)
    state_dir = tmp_path / "state"
    try:
        up = dspark(tb, env, "cluster", "up")
        assert up.returncode == 0, up.stderr[-3000:]
        before = load_state(state_dir)
        stopping = tb.popen(
            "head",
            [str(VENV_BIN / "dspark"), "stop", "--env-file", str(env)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The lock file names its holder once it holds it (nsenter execs: the pid is dspark's own).
        deadline = time.monotonic() + 60
        while (state_dir / LOCK_FILE).read_text().strip() != str(stopping.pid):
            assert stopping.poll() is None and time.monotonic() < deadline, stopping.communicate()
            time.sleep(0.005)
        stopping.send_signal(signal.SIGTERM)
        out, err = stopping.communicate(timeout=120)
        # It unwinds, its agents ended with it, rather than dying with them still at work behind the freed lock.
        assert stopping.returncode == 143 and "dspark: interrupted while stopping; " in err, (stopping.returncode, err)
        assert "Traceback" not in err, err

        assert lock_holder(state_dir) is None
        after = load_state(state_dir)  # raises on a half-written record
        assert after is None or [n.marker for n in after.nodes] == [n.marker for n in before.nodes]
        leftovers = [p.name for p in state_dir.iterdir() if p.name.startswith(f".{STATE_FILE}.")]
        assert leftovers == []

        again = dspark(tb, env, "stop")
        assert again.returncode == 0, again.stderr[-3000:]
        assert load_state(state_dir) is None
        # A worker's agent that had its request before the SSH client under it was ended finishes that one
        # operation (sshd signals no session without a terminal); then nothing of ours is left.
        assert wait_until(lambda: not (our_pids(tb, "head") | our_pids(tb, "worker1")), 30), describe(
            our_pids(tb, "head") | our_pids(tb, "worker1")
        )
        up = dspark(tb, env, "cluster", "up")
        assert up.returncode == 0, up.stderr[-3000:]
    finally:
        down = dspark(tb, env, "cluster", "down")
    assert down.returncode == 0, down.stderr[-3000:]
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
