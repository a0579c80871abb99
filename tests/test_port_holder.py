"""Never talk to a port before knowing who holds it.

The head's agent reads the listening sockets a connection would reach (`/proc/net/tcp*`) and finds
their inodes among the recorded process's descriptors (`agent/port_holder.py`). Here, on loopback
without the testbed: the verdicts themselves; the start's readiness wait, which polls `/health`
without the key and never talks to a port another user (`nobody`) holds; `dspark smoke`, which
refuses such a port. The Ray port and `status`/`restart` are in tests/test_port_squatters.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.agent.port_holder import port_holder_query, reaches
from dspark_launch.agent.transport import LocalTransport
from dspark_launch.cluster.spec import ClusterSpec, Node
from dspark_launch.cluster.state import Deployment, ServerRecord, save_state
from dspark_launch.node import procfs
from dspark_launch.serve.running_server import ServeFailure
from dspark_launch.serve.serve_spec import ServeSpec
from dspark_launch.serve.start import wait_until_serving
from tests.support import squatter
from tests.support.launcher_env import run_dspark
from tests.support.paths import REPO

KEY = "sk-port-holder-test-0123456789"
FAKE_API = REPO / "tests" / "support" / "fake_api.py"


def me() -> p.Process:
    return p.Process(os.getpid(), procfs.start_time(os.getpid()), None, procfs.boot_id())


def listener(family: int = socket.AF_INET, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen()
    return sock


@pytest.fixture
def squat(tmp_path):
    """A listener of user nobody on loopback: (its pid, port, log)."""
    started = []

    def start(host: str = "127.0.0.1", port: int = 0):
        log = tmp_path / f"squatter-{len(started)}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(squatter.argv(sys.executable, host, port), stdout=out, stderr=subprocess.STDOUT)
        started.append(proc)
        return proc.pid, squatter.wait_listening(log), log

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


@pytest.fixture
def sleeper():
    """A recorded "server" that is alive but holds no socket (vLLM still loading)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    deadline = time.monotonic() + 10
    while procfs.start_time(proc.pid) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def identity(proc: subprocess.Popen) -> p.Process:
    return p.Process(proc.pid, procfs.start_time(proc.pid), None, procfs.boot_id())


def test_the_verdicts_ours_none_gone_and_foreign(squat, sleeper):
    with listener() as sock:
        port = sock.getsockname()[1]
        assert port_holder_query(p.PortHolderQuery("127.0.0.1", port, (me(),))).verdict == p.PortHolderAnswer.OURS
        # Nobody recorded, or a recorded process that does not hold it: someone else's, named by pid and user.
        other = port_holder_query(p.PortHolderQuery("127.0.0.1", port, (identity(sleeper),)))
        assert other.verdict == p.PortHolderAnswer.FOREIGN and other.recorded_alive
        assert other.listeners == (p.PortListener(f"127.0.0.1:{port}", os.getpid(), os.geteuid(), "root"),)
        # A connection to another address does not reach a socket bound to 127.0.0.1.
        assert port_holder_query(p.PortHolderQuery("127.0.0.2", port, (me(),))).verdict == p.PortHolderAnswer.NONE
    assert (
        port_holder_query(p.PortHolderQuery("127.0.0.1", port, (identity(sleeper),))).verdict == p.PortHolderAnswer.NONE
    )
    # The same pid with another start time (a reused pid) is not the recorded process.
    reused = p.Process(sleeper.pid, procfs.start_time(sleeper.pid) - 1, None, procfs.boot_id())
    assert port_holder_query(p.PortHolderQuery("127.0.0.1", port, (reused,))).verdict == p.PortHolderAnswer.GONE
    pid, squatted, _ = squat()
    held = port_holder_query(p.PortHolderQuery("127.0.0.1", squatted, (identity(sleeper),)))
    assert held.verdict == p.PortHolderAnswer.FOREIGN
    assert held.foreign == f"pid {pid} (user nobody) listening on 127.0.0.1:{squatted}"


def test_a_wildcard_listener_reaches_every_address_and_ipv6_takes_ipv4():
    assert reaches("0.0.0.0", "10.1.2.3") and reaches("::", "10.1.2.3") and reaches("::ffff:10.1.2.3", "10.1.2.3")
    assert not reaches("127.0.0.1", "10.1.2.3") and not reaches("0.0.0.0", "::1")
    with listener(socket.AF_INET6, "::") as sock:
        port = sock.getsockname()[1]
        held = port_holder_query(p.PortHolderQuery("127.0.0.1", port, ()))
        assert held.verdict == p.PortHolderAnswer.FOREIGN and held.listeners[0].address == f"[::]:{port}"
        assert port_holder_query(p.PortHolderQuery("127.0.0.1", port, (me(),))).ours


def test_a_socket_the_servers_child_inherited_is_the_servers():
    """vLLM's engine processes can inherit the API's listening socket: a descendant counts as the server."""
    with listener() as sock:
        port = sock.getsockname()[1]
        child = os.fork()
        if child == 0:  # holds the inherited socket; the parent closes its own copy below
            time.sleep(30)
            os._exit(0)
        try:
            sock.close()
            assert port_holder_query(p.PortHolderQuery("127.0.0.1", port, (me(),))).ours
        finally:
            os.kill(child, 9)
            os.waitpid(child, 0)


def _spec(tmp_path) -> ClusterSpec:
    state_dir = tmp_path / "state"
    (state_dir / "logs").mkdir(parents=True, mode=0o700)
    return ClusterSpec(
        nodes=(Node("head", "127.0.0.1", None, LocalTransport(sys.executable)),),
        ray_port=6379,
        ray_address="127.0.0.1:6379",
        fabric_ifname="lo",
        node_env=(),
        forwarded=(),
        gpus_per_node=1,
        object_store_bytes=0,
        auth_mode="token",
        dashboard="off",
        state_dir=state_dir,
        join_timeout_s=10,
        ssh_timeout_s=10,
        config_digest="test",
    )


def _server(proc: subprocess.Popen, port: int, log: str) -> ServerRecord:
    return ServerRecord(
        marker="dspark-port-holder-server",
        log=log,
        url=f"http://127.0.0.1:{port}",
        served_name="tiny",
        model="tiny",
        started_at=time.time(),
        settings={},
        digest="test",
        cap=1,
        pid=proc.pid,
        start_time=procfs.start_time(proc.pid),
        boot_id=procfs.boot_id(),
        chat=True,
    )


def _serve_spec(port: int) -> ServeSpec:
    return ServeSpec(
        serve_args=("tiny",),
        env=(),
        host="127.0.0.1",
        port=port,
        served_name="tiny",
        model="tiny",
        cap=1,
        client_key=KEY,
        start_timeout_s=120,
        health_timeout_s=5,
        chat=True,
    )


class Quiet:
    def phase(self, message: str) -> None: ...
    def waiting(self, message: str, elapsed: float, timeout: float) -> None: ...
    def warn(self, message: str) -> None: ...


def test_the_readiness_wait_never_talks_to_a_squatter(tmp_path, squat, sleeper):
    """vLLM loads (alive, no socket yet) while nobody answers on its port: the wait fails at once naming
    them, and the squatter gets no connection at all, the key least of all."""
    spec = _spec(tmp_path)
    pid, port, log = squat()
    server = _server(sleeper, port, str(spec.state_dir / "logs" / "server.log"))
    (spec.state_dir / "logs" / "server.log").write_text("")
    began = time.monotonic()
    with pytest.raises(ServeFailure) as failed:
        wait_until_serving(spec, _serve_spec(port), server, spec.head.agent(), Quiet())
    message = str(failed.value)
    assert f"VLLM_PORT {port} on 127.0.0.1 is held by pid {pid} (user nobody)" in message, message
    assert f"not by vllm serve (pid {sleeper.pid}); the API key was not sent" in message and KEY not in message
    assert time.monotonic() - began < 60  # not the start's timeout
    assert squatter.connections(log) == []


def test_the_readiness_wait_polls_health_without_the_key(tmp_path):
    """The recorded server holds its port: /health gets no key, /v1/models and the completion get it."""
    spec = _spec(tmp_path)
    log = spec.state_dir / "logs" / "fake-api.log"
    with log.open("w") as out:
        api = subprocess.Popen(
            [sys.executable, str(FAKE_API), "tiny", "1", "ok"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    try:
        port = squatter.wait_listening(log)
        wait_until_serving(spec, _serve_spec(port), _server(api, port, str(log)), spec.head.agent(), Quiet())
    finally:
        api.kill()
        api.wait()
    gets = [line for line in log.read_text().splitlines() if line.startswith("GET ")]
    assert "GET /health key=no" in gets and "GET /v1/models key=yes" in gets, gets
    assert "GET /health key=yes" not in gets


def test_smoke_refuses_a_port_someone_else_holds(tmp_path, squat, sleeper):
    pid, port, log = squat()
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    save_state(
        state_dir,
        Deployment(
            ray_address="127.0.0.1:6379",
            config_digest="x",
            started_at=time.time(),
            launcher_version="test",
            nodes=[],
            server=_server(sleeper, port, ""),
        ),
    )
    env_file = tmp_path / "smoke.env"
    env_file.write_text(
        f"DSPARK_HEAD_IP=127.0.0.1\nDSPARK_WORKER_HOSTS=127.0.0.2\nDSPARK_FABRIC_IFNAME=lo\n"
        f"DSPARK_STATE_DIR={state_dir}\nVLLM_API_KEY={KEY}\n"
    )
    env_file.chmod(0o600)
    proc = run_dspark(["smoke", "-c", "2", "--env-file", str(env_file)])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error:")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stdout + proc.stderr
    assert f"held by pid {pid} (user nobody) listening on 127.0.0.1:{port}" in errors[0]
    assert KEY not in proc.stdout + proc.stderr
    assert squatter.connections(log) == []
    # The recorded server gone and nothing listening: down, nothing sent either.
    for gone in (sleeper.pid, pid):
        os.kill(gone, 9)
    sleeper.wait()
    deadline = time.monotonic() + 10
    while port_holder_query(p.PortHolderQuery("127.0.0.1", port, ())).listeners and time.monotonic() < deadline:
        time.sleep(0.05)
    proc = run_dspark(["smoke", "--env-file", str(env_file)])
    assert proc.returncode == 1 and f"vllm serve (pid {sleeper.pid}) is not running; nothing was sent" in proc.stderr
