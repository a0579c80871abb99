"""The API key goes only to the exact address that was checked, and the check is made before every request
that carries it (the key to a squatter on [::1], an IPv6-only squatter, one check for minutes of load).

Here, on loopback without the testbed, as root, the squatters as user `nobody` (tests/support/squatter.py):
- `VLLM_HOST=localhost`: the serve spec binds and records 127.0.0.1; a record that still says `localhost`
  (an older launcher's) is reached at 127.0.0.1 only, in a mount namespace whose /etc/hosts maps localhost to
  `::1` first (Debian's, and the testbed's): a `nobody` listener on `[::1]:PORT` gets no connection.
- A `nobody` listener on `[::]:PORT` with IPV6_V6ONLY beside the server's 127.0.0.1:PORT is no holder of it
  (the verdict, `smoke`, `status`); without sock_diag (the /proc fallback) the exact address still wins.
- The port check before each keyed request (`http.Keyed`, `api_holder.ServerPort`): a bare string key is
  refused, the listener closed and the port taken by `nobody` between two requests stops the next one
  unsent; `smoke -c N`, the load generator and reload's nudge each check every request.
The real start with these squatters: tests/test_serving.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dspark_launch.agent import port_holder
from dspark_launch.agent import protocol as p
from dspark_launch.agent.port_holder import listening_sockets, port_holder_query
from dspark_launch.agent.transport import LocalTransport
from dspark_launch.cluster.spec import ClusterSpec, Node, cluster_spec
from dspark_launch.cluster.state import Deployment, ServerRecord, save_state
from dspark_launch.config.settings import resolve
from dspark_launch.node import procfs
from dspark_launch.serve import http
from dspark_launch.serve.api_holder import ForeignApiListener, ServerPort
from dspark_launch.serve.serve_spec import ServeSpec
from tests.support import squatter
from tests.support.launcher_env import clean_environ
from tests.support.paths import REPO

KEY = "sk-keyed-requests-0123456789"
FAKE_API = REPO / "tests" / "support" / "fake_api.py"
DEBIAN_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def me() -> p.Process:
    return p.Process(os.getpid(), procfs.start_time(os.getpid()), None, procfs.boot_id())


def identity(proc: subprocess.Popen) -> p.Process:
    return p.Process(proc.pid, procfs.start_time(proc.pid), None, procfs.boot_id())


def listener(host: str, port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen()
    return sock


@pytest.fixture
def squat(tmp_path):
    """A listener of user nobody: start(host, port, v6only) -> (its pid, port, log)."""
    started = []

    def start(host: str, port: int = 0, v6only: bool = False):
        log = tmp_path / f"squatter-{len(started)}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                squatter.argv(sys.executable, host, port, v6only), stdout=out, stderr=subprocess.STDOUT
            )
        started.append(proc)
        return proc.pid, squatter.wait_listening(log), log

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


@pytest.fixture
def fake_api(tmp_path):
    """vLLM's API stood in for by tests/support/fake_api.py on 127.0.0.1 (its own process): (proc, port, log)."""
    log = tmp_path / "fake-api.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(FAKE_API), "tiny", "1", "ok"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    try:
        yield proc, squatter.wait_listening(log), log
    finally:
        proc.kill()
        proc.wait()


def recorded(tmp_path: Path, url: str, process: p.Process, **env: str) -> Path:
    """A state folder whose record names `process` as the server at `url`, and an env file pointing at it."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    server = ServerRecord(
        marker="dspark-keyed-requests",
        log="",
        url=url,
        served_name="tiny",
        model="tiny",
        started_at=time.time(),
        settings={},
        digest="x",
        cap=1,
        chat=True,
        pid=process.pid,
        start_time=process.start_time,
        boot_id=process.boot_id,
    )
    save_state(
        state_dir,
        Deployment(
            ray_address="127.0.0.1:6379",
            config_digest="x",
            started_at=time.time(),
            launcher_version="test",
            nodes=[],
            server=server,
        ),
    )
    values = {
        "DSPARK_HEAD_IP": "127.0.0.1",
        "DSPARK_WORKER_HOSTS": "127.0.0.2",
        "DSPARK_FABRIC_IFNAME": "lo",
        "DSPARK_STATE_DIR": str(state_dir),
        "VLLM_API_KEY": KEY,
        **env,
    }
    env_file = tmp_path / "dspark.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    env_file.chmod(0o600)
    return env_file


def dspark(args: list[str], hosts: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real CLI; with `hosts`, in a mount namespace of its own whose /etc/hosts is that file."""
    argv = [sys.executable, "-m", "dspark_launch", *args]
    if hosts is not None:
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount --bind {hosts} /etc/hosts && exec "$@"',
            "sh",
            *argv,
        ]
    return subprocess.run(argv, capture_output=True, text=True, env=clean_environ(), cwd=REPO, timeout=timeout)


# --------------------------------------------------------------------------- VULN 1: localhost


def _serve_spec(tmp_path: Path, host: str) -> ServeSpec:
    from dspark_launch.config.profile_resolve import resolve as resolve_profile
    from dspark_launch.node.vllm_offer import VllmOffer
    from dspark_launch.profiles.catalog import PROFILES
    from dspark_launch.serve.serve_spec import build_serve_spec
    from tests.support.paths import DATA

    env_file = tmp_path / "spec.env"
    env_file.write_text(
        f"DSPARK_HEAD_IP=10.9.0.1\nDSPARK_WORKER_HOSTS=root@10.9.0.2\nDSPARK_FABRIC_IFNAME=fab0\n"
        f"DSPARK_STATE_DIR={tmp_path / 'state'}\nVLLM_HOST={host}\nVLLM_PORT=8123\n"
        f"VLLM_API_KEY={KEY}\nDSPARK_PROFILE={PROFILES[0].name}\n"
    )
    settings = resolve(env_file=str(env_file), environ={})
    offer = VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text())
    return build_serve_spec(
        settings,
        cluster_spec(settings),
        {"RAY_AUTH_MODE": "token"},
        resolve_profile(PROFILES[0], offer, settings),
        None,
    )


def test_vllm_host_localhost_is_bound_recorded_and_checked_as_its_ipv4_address(tmp_path):
    """vLLM binds IPv4 for a name; the launcher now resolves the name once and hands vLLM the address, so the
    URL it records, checks and connects to is the very address the server binds, never the name."""
    serve_spec = _serve_spec(tmp_path, "localhost")
    assert serve_spec.host == "127.0.0.1" and serve_spec.base_url == "http://127.0.0.1:8123"
    args = list(serve_spec.serve_args)
    assert args[args.index("--host") + 1] == "127.0.0.1" and "localhost" not in args
    assert ServeSpec(serve_args=(), env=(), host="::", port=1).base_url == "http://[::1]:1"  # the wildcard's own family
    assert ServeSpec(serve_args=(), env=(), host="0.0.0.0", port=1).base_url == "http://127.0.0.1:1"
    assert http.pinned("http://localhost:8123/v1/models") == ("http://127.0.0.1:8123/v1/models", "127.0.0.1", 8123)
    assert http.pinned("http://[::1]:8123/health")[1:] == ("::1", 8123)


def test_with_localhost_no_request_reaches_a_listener_on_the_ipv6_loopback(tmp_path, squat, fake_api):
    """The issue's reproduction: /etc/hosts maps localhost to ::1 (first in getaddrinfo's order), vLLM holds
    127.0.0.1:PORT, `nobody` [::1]:PORT. Before, the port check (IPv4) said "ours" and urllib connected to ::1:
    the squatter got /v1/models and the chat completion with the key. Now every request goes to 127.0.0.1."""
    api, port, api_log = fake_api
    pid, _, log = squat("::1", port)
    hosts = tmp_path / "hosts"
    hosts.write_text(DEBIAN_HOSTS)
    # Guard: in that namespace urllib's resolver does give ::1 first (so the old client went there).
    order = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount --bind {hosts} /etc/hosts && exec "$@"',
            "sh",
            sys.executable,
            "-c",
            f"import socket; print(socket.getaddrinfo('localhost', {port}, type=1)[0][4][0])",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert order.stdout.strip() == "::1", order.stdout + order.stderr
    # The record as a launcher wrote it for VLLM_HOST=localhost before this fix: the name in the URL.
    env_file = recorded(tmp_path, f"http://localhost:{port}", identity(api), VLLM_HOST="localhost")

    smoked = dspark(["smoke", "-c", "2", "--env-file", str(env_file)], hosts)
    assert smoked.returncode == 0 and "2 passed, 0 failed" in smoked.stdout, smoked.stdout + smoked.stderr
    shown = dspark(["status", "--json", "--env-file", str(env_file)], hosts)
    view = json.loads(shown.stdout)
    assert view["server"]["healthy"] and not [line for line in view["problems"] if "VLLM_PORT" in line], view
    assert KEY not in smoked.stdout + smoked.stderr + shown.stdout + shown.stderr
    assert squatter.connections(log) == [], f"pid {pid} (nobody) on [::1]:{port} was sent: {squatter.connections(log)}"
    seen = api_log.read_text().splitlines()
    assert "GET /v1/models key=yes" in seen and sum(line.startswith("chat request") for line in seen) == 2, seen


# --------------------------------------------------------------------------- VULN 3: an IPv6-only wildcard


def test_an_ipv6_only_wildcard_listener_holds_no_ipv4_address(squat):
    """`nobody` on [::]:P with IPV6_V6ONLY: nothing it holds takes IPv4, so before the server listens the port
    is free (not "foreign": the start's pre-spawn check and readiness wait go on), and once our process holds
    127.0.0.1:P (or 0.0.0.0:P) beside it the port is ours. It does hold ::1:P."""
    pid, port, _ = squat("::", v6only=True)
    loading = port_holder_query(p.PortHolderQuery("127.0.0.1", port, (me(),)))  # alive, not listening yet
    assert loading.verdict == p.PortHolderAnswer.NONE and not loading.listeners
    for ours in ("127.0.0.1", "0.0.0.0"):
        with listener(ours, port) as sock:
            held = port_holder_query(p.PortHolderQuery("127.0.0.1", port, (me(),)))
            assert held.ours and held.sockets == (os.fstat(sock.fileno()).st_ino,), (ours, held)
    v6 = port_holder_query(p.PortHolderQuery("::1", port, ()))  # (the squatter is this process's child)
    assert (
        v6.verdict == p.PortHolderAnswer.FOREIGN and v6.foreign == f"pid {pid} (user nobody) listening on [::]:{port}"
    )


def test_the_exact_address_beats_a_wildcard_even_without_sock_diag(squat, monkeypatch):
    """Where the kernel's socket diagnostics are refused, /proc/net/tcp6 cannot tell IPV6_V6ONLY: the [::]
    squatter then counts as dual-stack, yet our socket on the exact address is what a connection lands on."""

    def refused(family):
        raise OSError("sock_diag refused")

    _, port, _ = squat("::", v6only=True)
    monkeypatch.setattr(port_holder, "_diag_listening", refused)
    with listener("127.0.0.1", port):
        assert port_holder_query(p.PortHolderQuery("127.0.0.1", port, (me(),))).ours
    # Nothing on the exact address: the squatter may take IPv4 as far as /proc can tell (a refusal, no leak).
    assert port_holder_query(p.PortHolderQuery("127.0.0.1", port, ())).verdict == p.PortHolderAnswer.FOREIGN


def test_sock_diag_and_proc_list_the_same_listening_sockets(squat):
    _, port, _ = squat("::", v6only=True)
    with listener("127.0.0.1", port) as ours:
        diag = listening_sockets(port)
        proc = port_holder._proc_listening(port)
        inode = os.fstat(ours.fileno()).st_ino
    assert {(s.address, s.uid, s.inode) for s in diag} == {(s.address, s.uid, s.inode) for s in proc}
    assert {s.address: s.v6only for s in diag} == {"127.0.0.1": False, "::": True}
    assert inode in {s.inode for s in diag}


def test_smoke_and_status_pass_beside_an_ipv6_only_squatter(tmp_path, squat, fake_api):
    """Before: verdict "foreign", `smoke` exit 1, `status` a problem line (and reload, bench, tune refused)."""
    api, port, api_log = fake_api
    _, _, log = squat("::", port, v6only=True)
    env_file = recorded(tmp_path, f"http://127.0.0.1:{port}", identity(api))
    smoked = dspark(["smoke", "-c", "2", "--env-file", str(env_file)])
    assert smoked.returncode == 0 and "2 passed, 0 failed" in smoked.stdout, smoked.stdout + smoked.stderr
    view = json.loads(dspark(["status", "--json", "--env-file", str(env_file)]).stdout)
    assert view["server"]["healthy"] and not [line for line in view["problems"] if "VLLM_PORT" in line], view
    assert squatter.connections(log) == []


# --------------------------------------------------------------------------- RISK 5: a check per request


class _Api(ThreadingHTTPServer):
    """A stand-in API in this process (so this process is the recorded server): records (path, Authorization)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                outer.seen.append((self.path, self.headers.get("Authorization", "")))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps(
                    {
                        "data": [{"id": "tiny"}],
                        "usage": {"completion_tokens": 1},
                        "choices": [{"message": {"content": "hi"}}],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[tuple[str, str]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self):
        self.shutdown()
        self.server_close()


@pytest.fixture
def api():
    server = _Api()
    yield server
    server.close()


def _spec(tmp_path: Path) -> ClusterSpec:
    state_dir = tmp_path / "state"
    (state_dir / "logs").mkdir(parents=True, mode=0o700, exist_ok=True)
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


def _server(url: str) -> ServerRecord:
    return ServerRecord(
        marker="dspark-keyed-requests",
        log="",
        url=url,
        served_name="tiny",
        model="tiny",
        started_at=time.time(),
        settings={},
        digest="x",
        cap=1,
        chat=True,
        pid=os.getpid(),
        start_time=procfs.start_time(os.getpid()),
        boot_id=procfs.boot_id(),
    )


def test_a_key_without_its_port_check_is_refused(api):
    with pytest.raises(TypeError, match="only with its port check"):
        http.request(f"{api.url}/v1/models", KEY)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        http.stream(f"{api.url}/v1/completions", KEY, {})  # type: ignore[arg-type]
    assert api.seen == []


def test_the_port_is_checked_again_before_every_keyed_request(tmp_path, fake_api, squat):
    """The window of the issue: the server's listener gone (it died; or it shuts down, its listener closed,
    its process alive) and `nobody` binds the port; the next request of the same command is not sent."""
    api, port, api_log = fake_api
    url = f"http://127.0.0.1:{port}"
    server = dataclasses.replace(_server(url), pid=api.pid, start_time=procfs.start_time(api.pid))
    check = ServerPort(_spec(tmp_path), server)
    key = http.Keyed(KEY, check)
    for _ in range(3):
        assert http.chat(url, key, "tiny", "Hello", 1, 5).status == 200
    assert check.asked == 1  # the head's agent once; then one sock_diag dump per request
    http.metrics(url, 5, key)
    assert api_log.read_text().splitlines()[-1] == "GET /metrics key=no"  # checked, sent without the key
    api.kill()
    api.wait()
    pid, _, log = squat("127.0.0.1", port)
    with pytest.raises(ForeignApiListener, match=rf"held by pid {pid} \(user nobody\) listening on 127.0.0.1:{port}"):
        http.chat(url, key, "tiny", "Hello", 1, 5)
    with pytest.raises(ForeignApiListener):
        http.stream(f"{url}/v1/chat/completions", key, {"model": "tiny"}, 5)
    with pytest.raises(ForeignApiListener):
        http.metrics(url, 5, key)
    assert squatter.connections(log) == []
    assert sum(line.startswith("chat request") for line in api_log.read_text().splitlines()) == 3


def test_nothing_is_sent_while_nothing_of_the_server_listens(tmp_path, api):
    """The recorded server (this process) alive, its listener closed: a request is not sent, status 0."""
    key = http.Keyed(KEY, ServerPort(_spec(tmp_path), _server(api.url)))
    url = api.url
    assert http.chat(url, key, "tiny", "Hello", 1, 5).status == 200
    api.close()
    assert http.chat(url, key, "tiny", "Hello", 1, 5).status == 0
    assert "nothing was sent" in http.stream(f"{url}/v1/chat/completions", key, {}, 5).error
    assert len(api.seen) == 1


class _Counted:
    """A port check that says "ours" `ours` times, then finds another process on the port."""

    def __init__(self, ours: int):
        self.calls, self.ours = 0, ours
        self.lock = threading.Lock()

    def __call__(self, ip: str, port: int) -> bool:
        with self.lock:
            self.calls += 1
            if self.calls > self.ours:
                raise ForeignApiListener(f"VLLM_PORT {port} on {ip} is held by pid 1 (user nobody)")
            return True


def test_smoke_the_load_generator_and_reloads_nudge_check_each_request(api):
    from dspark_launch.serve.reload import _one_token
    from dspark_launch.serve.smoke import smoke
    from dspark_launch.tune import workload as wl
    from dspark_launch.tune.loadgen import Run, Target

    server = _server(api.url)
    counted = _Counted(ours=100)
    assert [r.ok for r in smoke(server, http.Keyed(KEY, counted), 3, 1, 5)] == [True] * 3 and counted.calls == 3

    api.seen.clear()
    counted = _Counted(ours=4)
    run = Run(
        Target(api.url, "tiny", True, http.Keyed(KEY, counted)),
        wl.build(wl.Profile(1024, 256, 32, 4), max_reply=2),
        tokens_per_word=1.0,
        seconds=30,
    )
    with pytest.raises(ForeignApiListener):
        run.run()
    assert len(api.seen) == 4 and counted.calls >= 5  # every lane's next request refused unsent

    api.seen.clear()
    refused: list = []
    _one_token(server, http.Keyed(KEY, _Counted(ours=0)), None, refused)
    assert len(refused) == 1 and isinstance(refused[0], ForeignApiListener) and api.seen == []
