"""Logs on a node (Ray's start log, vllm serve's, the log folder) are written only into a private folder of
this user and never through a link: a real agent process (LocalTransport) refuses with one line naming
the path. The tests run as root, so a foreign folder is one chowned to `nobody`."""

from __future__ import annotations

import os
import secrets
import shlex
import stat
import sys
from pathlib import Path

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.transport import LocalTransport
from dspark_launch.cluster.state import ensure_state_dir
from dspark_launch.errors import ClusterFailure, ConfigError
from dspark_launch.node.safe_path import CONTAINER_STATE_VAR
from tests.support.processes import never_started

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
    owner = marker()
    with pytest.raises(ClusterFailure) as refused:
        agent.call(p.Run(writes(witness), {}, owner, str(logs / "ray-start-here.log"), 30), "ray start", 60)
    assert str(refused.value).startswith(
        f"here: ray start: log {logs / 'ray-start-here.log'} is a symbolic link "
        "(never followed); refusing to write a log there, nothing started"
    )
    assert "\n" not in str(refused.value)
    assert never_started(owner, witness) and victim.read_text() == "precious\n"


def test_server_log_link_is_refused_before_rotation(agent, tmp_path):
    logs, victim, witness = tmp_path / "logs", victim_file(tmp_path), tmp_path / "started"
    logs.mkdir(mode=0o700)
    log = logs / "vllm-serve.log"
    log.symlink_to(victim)
    owner = marker()
    with pytest.raises(ClusterFailure, match="is a symbolic link"):
        agent.call(p.Spawn(writes(witness), {}, owner, str(log), rotate_log=True), "vllm serve")
    assert log.is_symlink() and not (logs / "vllm-serve.log.1").exists()  # not rotated away either
    assert never_started(owner, witness) and victim.read_text() == "precious\n"


def test_a_log_folder_of_another_user_is_refused_and_not_written(agent, tmp_path):
    logs, witness = tmp_path / "logs", tmp_path / "started"
    logs.mkdir(mode=0o700)
    os.chown(logs, NOBODY, NOBODY)
    with pytest.raises(ClusterFailure) as refused:
        agent.call(p.Run(writes(witness), {}, marker(), str(logs / "ray-start-here.log"), 30), "ray start", 60)
    assert f"{logs} is owned by uid {NOBODY}, not by this user (uid 0)" in refused.value.detail
    assert list(logs.iterdir()) == [] and not witness.exists()
    # The node pre-flight's log folder step (prepare_log_dir) says the same, naming the folder, before anything starts.
    assert agent.call(p.PrepareLogDir(str(logs))).error == f"{logs} is owned by uid {NOBODY}, not by this user (uid 0)"


def test_a_log_of_another_user_or_not_a_file_is_refused(agent, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    (logs / "theirs.log").write_text("")
    os.chown(logs / "theirs.log", NOBODY, NOBODY)
    with pytest.raises(ClusterFailure, match=f"log {logs / 'theirs.log'} is owned by uid {NOBODY}"):
        agent.call(p.Spawn(writes(tmp_path / "w"), {}, marker(), str(logs / "theirs.log")), "spawn")
    os.mkfifo(logs / "fifo.log")  # would block an open for writing with nobody reading
    with pytest.raises(ClusterFailure, match=f"log {logs / 'fifo.log'} is not a plain file"):
        agent.call(p.Spawn(writes(tmp_path / "w"), {}, marker(), str(logs / "fifo.log")), "spawn")


def test_a_log_folder_others_can_enter_is_refused_never_chmodded(agent, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o755)
    assert agent.call(p.PrepareLogDir(str(logs))).error == f"{logs} has mode 0755: group or others have access"
    assert stat.S_IMODE(logs.stat().st_mode) == 0o755


def test_a_missing_log_folder_is_made_private_and_the_log_0600(agent, tmp_path):
    log = tmp_path / "state" / "logs" / "ray-start-here.log"
    answer = agent.call(p.Run((sys.executable, "-c", "print('hello')"), {}, marker(), str(log), 30), "ray start", 60)
    assert answer.returncode == 0 and log.read_text() == "hello\n"
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700 and stat.S_IMODE(log.stat().st_mode) == 0o600
    agent.call(p.Run((sys.executable, "-c", "print('again')"), {}, marker(), str(log), 30), "ray start", 60)
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


# A rootful docker/podman driven by a non-root operator: the state folder (mounted into the node
# container at its host path) is the operator's, the agent inside is root. Here the operator is `nobody`.


def container_agent(tmp_path: Path, state: Path) -> NodeAgent:
    """A real agent process started as runtime.run_argv's container starts it: the marker in its environment."""
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(
        f'#!/bin/sh\nexport {CONTAINER_STATE_VAR}={shlex.quote(str(state))}\nexec {shlex.quote(sys.executable)} "$@"\n'
    )
    wrapper.chmod(0o755)
    return NodeAgent("here", LocalTransport(str(wrapper)))


def operators_state(tmp_path: Path, with_logs: bool = True) -> Path:
    state = tmp_path / "state"
    folders = (state, state / "logs") if with_logs else (state,)
    for folder in folders:
        folder.mkdir(mode=0o700)
        os.chown(folder, NOBODY, NOBODY)
    return state


def test_a_root_agent_in_a_launcher_container_keeps_the_operators_logs(agent, tmp_path):
    state = operators_state(tmp_path)
    log = state / "logs" / "ray-start-here.log"
    inside = container_agent(tmp_path, state)
    assert inside.call(p.PrepareLogDir(str(log.parent))).error is None
    answer = inside.call(p.Run((sys.executable, "-c", "print('hello')"), {}, marker(), str(log), 30), "ray start", 60)
    assert answer.returncode == 0 and log.read_text() == "hello\n"
    assert (log.stat().st_uid, log.stat().st_gid, stat.S_IMODE(log.stat().st_mode)) == (NOBODY, NOBODY, 0o600)
    server_log = state / "logs" / "vllm-serve.log"
    for _ in range(2):  # the second start rotates the operator's log and makes a new one for them
        inside.call(
            p.Spawn((sys.executable, "-c", "print('served')"), {}, marker(), str(server_log), rotate_log=True),
            "vllm serve",
        )
    assert server_log.stat().st_uid == NOBODY and Path(f"{server_log}.1").stat().st_uid == NOBODY
    # The same folder to an agent outside a launcher container: another user's, refused as before.
    with pytest.raises(ClusterFailure, match=f"is owned by uid {NOBODY}"):
        agent.call(p.Run((sys.executable, "-c", "print('x')"), {}, marker(), str(log), 30), "ray start", 60)
    assert log.read_text() == "hello\n"


def test_a_log_folder_the_container_agent_makes_is_the_operators(tmp_path):
    state = operators_state(tmp_path, with_logs=False)
    log = state / "logs" / "ray-start-here.log"
    container_agent(tmp_path, state).call(
        p.Run((sys.executable, "-c", "print('hi')"), {}, marker(), str(log), 30), "ray start", 60
    )
    folder = log.parent.stat()
    assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (NOBODY, 0o700) and log.stat().st_uid == NOBODY


def test_the_container_rule_covers_only_a_private_state_folder(tmp_path):
    state = operators_state(tmp_path)
    inside = container_agent(tmp_path, state)
    elsewhere = tmp_path / "elsewhere"  # a folder of the operator outside the state folder: not theirs to share
    elsewhere.mkdir(mode=0o700)
    os.chown(elsewhere, NOBODY, NOBODY)
    assert (
        inside.call(p.PrepareLogDir(str(elsewhere))).error
        == f"{elsewhere} is owned by uid {NOBODY}, not by this user (uid 0)"
    )
    state.chmod(0o770)
    assert inside.call(p.PrepareLogDir(str(state / "logs"))).error == (
        f"the state folder {state} has mode 0770: group or others can write it"
    )
    state.rename(tmp_path / "real-state")
    state.symlink_to(tmp_path / "real-state")
    assert "is a symbolic link" in inside.call(p.PrepareLogDir(str(state / "logs"))).error


@pytest.mark.parametrize("in_container", [False, True], ids=["host", "container"])
def test_a_log_that_is_a_hard_link_is_refused(agent, tmp_path, in_container):
    victim, witness = victim_file(tmp_path), tmp_path / "started"
    state = operators_state(tmp_path) if in_container else tmp_path / "state"
    (state / "logs").mkdir(mode=0o700, parents=True, exist_ok=True)
    log = state / "logs" / "ray-start-here.log"
    os.link(victim, log)
    node = container_agent(tmp_path, state) if in_container else agent
    owner = marker()
    with pytest.raises(ClusterFailure) as refused:
        node.call(p.Run(writes(witness), {}, owner, str(log), 30), "ray start", 60)
    assert f"log {log} has 2 names (a hard link: never appended to)" in refused.value.detail
    with pytest.raises(ClusterFailure, match="a hard link"):
        node.call(p.Spawn(writes(witness), {}, owner, str(log), rotate_log=True), "vllm serve")
    assert never_started(owner, witness)
    assert victim.read_text() == "precious\n" and victim.stat().st_uid == 0
    assert not Path(f"{log}.1").exists()


def test_serve_go_promotes_the_warm_log_keeps_the_old_and_says_go(agent, tmp_path):
    """A warm server's log becomes the server log (the old one kept as .1, the writer writing on), then the go
    file says go once, 0600."""
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    log, pending, go = logs / "vllm-serve.log", logs / "vllm-serve.next.log", tmp_path / "dspark-1-server.go"
    log.write_text("old server\n")
    with open(pending, "a") as writer:  # as the warm process holds it
        writer.write("warm\n")
        writer.flush()
        assert agent.call(p.ServeGo(str(go), str(pending), str(log)), "vllm serve (go)").log == str(log)
        writer.write("serving\n")
    assert log.read_text() == "warm\nserving\n" and (logs / "vllm-serve.log.1").read_text() == "old server\n"
    assert not pending.exists()
    assert go.read_text().strip() == "go" and stat.S_IMODE(go.stat().st_mode) == 0o600


def test_serve_go_refuses_a_linked_warm_log_and_says_nothing(agent, tmp_path):
    logs, victim = tmp_path / "logs", victim_file(tmp_path)
    logs.mkdir(mode=0o700)
    log, pending, go = logs / "vllm-serve.log", logs / "vllm-serve.next.log", tmp_path / "dspark-2-server.go"
    log.write_text("old server\n")
    pending.symlink_to(victim)
    with pytest.raises(ClusterFailure, match="is a symbolic link.*the new server was not told to serve"):
        agent.call(p.ServeGo(str(go), str(pending), str(log)), "vllm serve (go)")
    assert log.read_text() == "old server\n" and not (logs / "vllm-serve.log.1").exists()
    assert not go.exists() and victim.read_text() == "precious\n"
