"""Logs on a node (Ray's start log, vllm serve's, the log folder) are written only into a private folder of
this user and never through a link: a real agent process (LocalTransport) refuses with one line naming
the path. The tests run as root, so a foreign folder is one chowned to `nobody`."""

from __future__ import annotations

import os
import secrets
import stat
import sys
import time
from pathlib import Path

import pytest

from dspark_launch.cluster import protocol as p
from dspark_launch.cluster.client import ClusterFailure, NodeAgent
from dspark_launch.cluster.state import ensure_state_dir
from dspark_launch.cluster.transport import LocalTransport
from dspark_launch.errors import ConfigError

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to nobody needs root")


@pytest.fixture
def agent():
    return NodeAgent("here", LocalTransport(sys.executable))


def marker() -> str:
    return f"dspark-{secrets.token_hex(4)}-here"


def writes(witness: Path) -> tuple[str, ...]:
    """A command that would leave `witness` behind had it been started."""
    return sys.executable, "-c", f"open({str(witness)!r}, 'w')"


def victim_file(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    return victim


def test_ray_start_log_that_is_a_link_is_refused_and_nothing_starts(agent, tmp_path):
    logs, victim, witness = tmp_path / "logs", victim_file(tmp_path), tmp_path / "started"
    logs.mkdir(mode=0o700)
    (logs / "ray-start-here.log").symlink_to(victim)
    with pytest.raises(ClusterFailure) as refused:
        agent.run(p.Run(writes(witness), {}, marker(), str(logs / "ray-start-here.log"), 30), "ray start", 60)
    assert str(refused.value).startswith(f"here: ray start: log {logs / 'ray-start-here.log'} is a symbolic link "
                                         "(never followed); refusing to write a log there, nothing started")
    assert "\n" not in str(refused.value)
    time.sleep(0.3)
    assert victim.read_text() == "precious\n" and not witness.exists()


def test_server_log_link_is_refused_before_rotation(agent, tmp_path):
    logs, victim, witness = tmp_path / "logs", victim_file(tmp_path), tmp_path / "started"
    logs.mkdir(mode=0o700)
    log = logs / "vllm-serve.log"
    log.symlink_to(victim)
    with pytest.raises(ClusterFailure, match="is a symbolic link"):
        agent.spawn(p.Spawn(writes(witness), {}, marker(), str(log), rotate_log=True), "vllm serve")
    assert log.is_symlink() and not (logs / "vllm-serve.log.1").exists()  # not rotated away either
    time.sleep(0.3)
    assert victim.read_text() == "precious\n" and not witness.exists()


def test_a_log_folder_of_another_user_is_refused_and_not_written(agent, tmp_path):
    logs, witness = tmp_path / "logs", tmp_path / "started"
    logs.mkdir(mode=0o700)
    os.chown(logs, NOBODY, NOBODY)
    with pytest.raises(ClusterFailure) as refused:
        agent.run(p.Run(writes(witness), {}, marker(), str(logs / "ray-start-here.log"), 30), "ray start", 60)
    assert f"{logs} is owned by uid {NOBODY}, not by this user (uid 0)" in refused.value.detail
    assert list(logs.iterdir()) == [] and not witness.exists()
    # The node pre-flight's probe says the same, naming the folder, before anything starts.
    assert agent.probe(str(logs)).log_dir_error == f"{logs} is owned by uid {NOBODY}, not by this user (uid 0)"


def test_a_log_of_another_user_or_not_a_file_is_refused(agent, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    (logs / "theirs.log").write_text("")
    os.chown(logs / "theirs.log", NOBODY, NOBODY)
    with pytest.raises(ClusterFailure, match=f"log {logs / 'theirs.log'} is owned by uid {NOBODY}"):
        agent.spawn(p.Spawn(writes(tmp_path / "w"), {}, marker(), str(logs / "theirs.log")), "spawn")
    os.mkfifo(logs / "fifo.log")  # would block an open for writing with nobody reading
    with pytest.raises(ClusterFailure, match=f"log {logs / 'fifo.log'} is not a plain file"):
        agent.spawn(p.Spawn(writes(tmp_path / "w"), {}, marker(), str(logs / "fifo.log")), "spawn")


def test_a_log_folder_others_can_enter_is_refused_never_chmodded(agent, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o755)
    assert agent.probe(str(logs)).log_dir_error == f"{logs} has mode 0755: group or others have access"
    assert stat.S_IMODE(logs.stat().st_mode) == 0o755


def test_a_missing_log_folder_is_made_private_and_the_log_0600(agent, tmp_path):
    log = tmp_path / "state" / "logs" / "ray-start-here.log"
    answer = agent.run(p.Run((sys.executable, "-c", "print('hello')"), {}, marker(), str(log), 30), "ray start", 60)
    assert answer.returncode == 0 and log.read_text() == "hello\n"
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700 and stat.S_IMODE(log.stat().st_mode) == 0o600
    agent.run(p.Run((sys.executable, "-c", "print('again')"), {}, marker(), str(log), 30), "ray start", 60)
    assert log.read_text() == "hello\nagain\n"  # appended


def test_the_launchers_log_folder_must_be_private_and_its_own(tmp_path):
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    (state / "logs").chmod(0o750)
    with pytest.raises(ConfigError, match=f"{state / 'logs'} has mode 0750: group or others have access"):
        ensure_state_dir(state)
    (state / "logs").chmod(0o700)
    os.chown(state / "logs", NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=f"{state / 'logs'} is owned by uid {NOBODY}"):
        ensure_state_dir(state)


@pytest.mark.testbed
def test_cluster_up_refuses_a_planted_ray_start_log_on_the_worker(testbed_clean, tmp_path):
    """Through the CLI on the two-node testbed: the worker's `ray start` log planted as a link to a victim.
    One error line naming the path; the victim untouched; the head's Ray rolled back."""
    from tests.support.on_testbed import dspark, our_pids, write_env
    from tests.support.processes import describe

    tb, victim = testbed_clean, victim_file(tmp_path)
    env = write_env(tb, tmp_path)
    logs = tmp_path / "state" / "logs"
    logs.mkdir(parents=True, mode=0o700)
    (logs / "ray-start-worker1.log").symlink_to(victim)
    proc = dspark(tb, env, "cluster", "up")
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error: ")]
    assert len(errors) == 1, proc.stderr
    assert f"log {logs / 'ray-start-worker1.log'} is a symbolic link (never followed)" in errors[0], errors
    assert "worker1 (10.213.0.2)" in errors[0] and "Traceback" not in proc.stderr
    assert victim.read_text() == "precious\n" and (logs / "ray-start-worker1.log").is_symlink()
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
