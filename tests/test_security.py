"""What listens where, secrets, Ray token auth, the dashboard.

One full `dspark start --foreground` carries most assertions (listening sockets with the
API on 0.0.0.0, two API keys, no secret anywhere it should not be, a client without the
Ray token refused), then loses Ray on the worker (fault matrix: the engine failure is
reported and the launcher exits 1), and finally shows that processes we did not start
survive. Its launcher cannot import vLLM, Ray or torch (everything that touches them runs in
a node's agent): the supervisor, `status` and `stop` work without them. The dashboard is checked on a cluster-only `cluster up`.

Known wildcard listeners (Ray 2.60 and torch cannot bind these to the node IP; see
docs/security.md): anything else listening on 0.0.0.0/::/* fails these tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dspark_launch.node import procfs
from tests.support.on_testbed import (
    dspark,
    launcher_without_vllm,
    ours_left,
    popen,
    read_until_served,
    run,
    serving_env,
    spawn_lookalike,
    state,
    write_env,
)
from tests.support.processes import cmdline, describe, kill_now, survives, wait_until

pytestmark = pytest.mark.testbed

RAY_PORT = 6379
WORKER_PORTS = range(10002, 20000)  # dspark_launch.cluster.ray_cluster.WORKER_PORTS
API_PORT = 8000
DASHBOARD_PORT = 8265
DASHBOARD_METRICS_PORT = 44227  # Ray's dashboard head: its own Prometheus endpoint
KEY1 = "sk-dspark-sec-k1-3b9e7d21a0"
KEY2 = "sk-dspark-sec-k2-c4f08a6e19"
WILDCARD = {"0.0.0.0", "*", "[::]", "::", "[::ffff:0.0.0.0]"}


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    pid: int
    cmd: str

    @property
    def wildcard(self) -> bool:
        return self.address in WILDCARD

    def __str__(self) -> str:
        return f"{self.address}:{self.port} pid {self.pid} {self.cmd[:100]}"


def listeners(tb, node: str) -> list[Listener]:
    """TCP listening sockets in the node's network namespace (`ss -ltnp` there), one per owning pid."""
    out = subprocess.run(
        ["ip", "netns", "exec", tb.node(node).netns, "ss", "-ltnpH"], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        local = fields[3]
        address, port = local.rsplit(":", 1)
        address = address.split("%")[0]
        for pid in sorted({int(p) for p in re.findall(r"pid=(\d+)", line)}):
            found.append(Listener(address, int(port), pid, cmdline(pid)))
    return found


def unexpected_wildcards(found: list[Listener], ours: set[int], allow) -> list[str]:
    """Wildcard listeners of our processes that `allow(listener)` does not name; and the raylet count."""
    bad = [str(l) for l in found if l.pid in ours and l.wildcard and not allow(l)]
    raylet_ports = {l.port for l in found if l.wildcard and "/raylet/raylet" in l.cmd}
    if len(raylet_ports) > 2:
        bad.append(f"raylet listens on {len(raylet_ports)} wildcard ports (node manager + object manager expected)")
    return bad


def ray_known_wildcard(l: Listener) -> str | None:
    """What Ray 2.60 binds to every interface whatever the launcher asks (docs/security.md)."""
    if "/gcs/gcs_server" in l.cmd and l.port == RAY_PORT:
        return "GCS"
    if "/raylet/raylet" in l.cmd:
        return "raylet (node manager / object manager)"
    if l.port in WORKER_PORTS and (l.cmd.startswith(("ray::", "VLLM::")) or "dspark_launch.node.serve_entry" in l.cmd):
        return "Ray core worker or driver gRPC"
    return None


def secrets_in_file_tree(root: Path, secrets: list[str], skip: set[Path] = frozenset()) -> list[str]:
    hits = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            if path in skip:
                continue
            try:
                data = path.read_bytes() if path.is_file() else b""
            except OSError:
                continue
            hits += [f"{path}: {s[:8]}..." for s in secrets if s.encode() in data]
    return hits


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def environ_has(pid: int, needle: str) -> bool:
    return any(needle.encode() in entry for entry in procfs.environ(pid))


def http_from(tb, node: str, url: str, key: str | None = None, payload: dict | None = None) -> int:
    """HTTP status of a request sent from inside `node` (0: no connection); the key goes by environment."""
    code = (
        "import os,sys,urllib.request,urllib.error\n"
        "h={'Content-Type':'application/json'}\n"
        "if os.environ.get('TEST_KEY'): h['Authorization']='Bearer '+os.environ['TEST_KEY']\n"
        "data=os.environ.get('TEST_PAYLOAD','').encode() or None\n"
        "r=urllib.request.Request(sys.argv[1],data=data,headers=h)\n"
        "try:\n  print(urllib.request.urlopen(r,timeout=60).status)\n"
        "except urllib.error.HTTPError as e:\n  print(e.code)\n"
        "except OSError:\n  print(0)\n"
    )
    env = {"TEST_KEY": key or "", "TEST_PAYLOAD": json.dumps(payload) if payload else ""}
    proc = tb.exec(node, [sys.executable, "-c", code, url], env=env, timeout=90)
    return int(proc.stdout.strip() or 0)


# --------------------------------------------------------------------------- one full start


def test_start_exposure_secrets_and_worker_ray_loss(testbed_clean, tmp_path, tiny_model):
    tb = testbed_clean
    env = serving_env(
        tb,
        tmp_path,
        tiny_model,
        VLLM_HOST="0.0.0.0",
        VLLM_API_KEY="",
        DSPARK_API_KEYS=f"{KEY1} {KEY2}",
        DSPARK_RECOVERY_LIMIT="0",
    )  # the first loss ends supervision
    # Processes we did not start, dressed like Ray: they must survive everything below.
    unrelated = {
        "head": spawn_lookalike(tb, "head", "ray::IDLE", sys.executable, "-c", "import time; time.sleep(900)"),
        "worker1": spawn_lookalike(
            tb, "worker1", "/opt/ray/core/src/ray/raylet/raylet --node_ip_address=x", "sleep", "900"
        ),
    }
    unrelated_pids = {pid for pid, _ in unrelated.values()}

    cli = launcher_without_vllm(tmp_path)
    probe = tb.exec("head", [sys.executable, "-c", "import vllm"], env=cli)
    assert probe.returncode != 0 and "not for the launcher" in probe.stderr
    proc = popen(tb, tmp_path, env, "start", "--foreground", merge=True, launcher=cli)
    seen: list[str] = []
    try:
        seen = read_until_served(proc)
        assert "hotfix worker1: applied" in "".join(seen)
        assert not any("RAY_AUTH_MODE=disabled" in l for l in seen)  # token auth is the default: no warning
        server = state(tmp_path)["server"]
        token_file = tmp_path / "state" / "ray-auth-token"
        token = token_file.read_text().strip()
        assert len(token) >= 32
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        assert oct((tmp_path / "state").stat().st_mode & 0o777) == "0o700"

        # The API on 0.0.0.0 answers on the fabric too, and only with one of the keys.
        models = f"http://{tb.head.ip}:{API_PORT}/v1/models"
        assert http_from(tb, "worker1", models) == 401
        assert http_from(tb, "worker1", models, "sk-wrong") == 401
        assert http_from(tb, "worker1", models, KEY1) == 200
        assert http_from(tb, "worker1", models, KEY2) == 200
        completion = {"model": "tiny", "prompt": "Hello", "max_tokens": 2}
        assert http_from(tb, "head", f"http://127.0.0.1:{API_PORT}/v1/completions", KEY2, completion) == 200
        assert http_from(tb, "head", f"http://127.0.0.1:{API_PORT}/v1/completions", None, completion) == 401

        status = run(tb, tmp_path, env, "status", "--json", launcher=cli)
        assert status.returncode == 0, status.stdout + status.stderr
        data = json.loads(status.stdout)
        assert data["state"] == "up" and data["server"]["healthy"] and data["problems"] == []
        assert [n["registered_ip"] for n in data["nodes"]] == [n["ip"] for n in data["nodes"]]

        # Listening sockets: nothing of ours on a wildcard address but what Ray/torch cannot bind,
        # and the API port, because VLLM_HOST=0.0.0.0 asked for it.
        log = Path(server["log"]).read_text(errors="replace")
        init_ports = {int(p) for p in re.findall(rf"tcp://{re.escape(tb.head.ip)}:(\d+)", log)}
        assert len(init_ports) == 1, init_ports  # torch.distributed's rendezvous (TCPStore) of TP rank 0

        def allow(l: Listener) -> bool:
            if l.port == API_PORT and l.pid == server["pid"]:
                return True
            if l.port in init_ports and "RayWorkerProc" in l.cmd:
                return True
            return ray_known_wildcard(l) is not None

        for node in ("head", "worker1"):
            found = listeners(tb, node)
            ours = tb.pids_in(node, include_infra=False) - unrelated_pids
            assert unexpected_wildcards(found, ours, allow) == [], node
            # What can be bound is: on the node's fabric IP or loopback only.
            assert {
                l.address.replace("[::ffff:", "").rstrip("]") for l in found if l.pid in ours and not l.wildcard
            } <= {tb.node(node).ip, "127.0.0.1"}, [str(l) for l in found]
        head = listeners(tb, "head")
        assert any(l.port == API_PORT and l.wildcard and l.pid == server["pid"] for l in head)
        assert any(l.port == RAY_PORT and "/gcs/gcs_server" in l.cmd for l in head)
        assert not any(l.port == 44217 for l in head), "Ray's autoscaler metrics server runs (--no-monitor missing)"
        assert not any(l.port == DASHBOARD_PORT for l in head), "the dashboard runs although it is off"

        # Ray refuses a client without the cluster's token (reaching the GCS from the worker node).
        probe = (
            "from ray._raylet import GcsClient\n"
            "try:\n  GcsClient(address='%s:%d').get_all_node_info(timeout=10); print('ACCEPTED')\n"
            "except Exception as e:\n  print('REFUSED', type(e).__name__, e)\n"
        ) % (tb.head.ip, RAY_PORT)
        for mode in ("token", "disabled"):
            refused = tb.exec(
                "worker1",
                [sys.executable, "-c", probe],
                timeout=60,
                env={"RAY_AUTH_MODE": mode, "RAY_AUTH_TOKEN": "0" * 64},
            )
            assert "REFUSED" in refused.stdout and "InvalidAuthToken" in refused.stdout, refused.stdout[-600:]

        # No key or token in any argv, on either node.
        secrets = [KEY1, KEY2, token]
        for node in ("head", "worker1"):
            for pid in tb.pids_in(node):
                line = cmdline(pid)
                assert not any(s in line for s in secrets), describe({pid})
        # The keys stay in the API server's process tree: never on the worker node, never in Ray's processes.
        server_session = os.getsid(server["pid"])
        for node in ("head", "worker1"):
            for pid in tb.pids_in(node):
                if any(environ_has(pid, k) for k in (KEY1, KEY2)):
                    assert node == "head" and session_of(pid) in (server_session, None), describe({pid})
        # No secret in the state folder (the server log and Ray's start logs are there; the token's own
        # file is the one exception), in the Ray logs of either node, or in status.
        assert secrets_in_file_tree(tmp_path / "state", secrets, {token_file}) == []
        for record in state(tmp_path)["nodes"]:
            assert secrets_in_file_tree(Path(record["ray_temp_dir"]), secrets) == [], record["name"]
        assert not any(s in status.stdout + status.stderr for s in secrets)

        # Fault matrix: Ray on the worker dies while serving. The engine fails, the launcher
        # reports it in one line and exits 1 so a supervisor restarts it; everything is stopped.
        worker_ray = tb.pids_in("worker1", include_infra=False) - unrelated_pids
        assert worker_ray
        kill_now(worker_ray)  # a pid may be gone already: a child of one killed before it
        rest, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(seen) + rest
    assert proc.returncode == 1, output[-4000:]
    errors = [l for l in rest.splitlines() if l.startswith("dspark: error:")]
    assert len(errors) == 1, rest[-4000:]
    print(errors[0])
    assert f"vllm serve (pid {server['pid']}) exited" in errors[0] or "Ray on worker1" in errors[0], errors[0]
    assert "worker1 (10.213.0.2)" in errors[0] and server["log"] in errors[0], errors[0]
    assert "stopped everything this run started" in rest
    assert not any(s in output for s in secrets)
    assert wait_until(lambda: not ours_left(tb, unrelated_pids), 30), describe(ours_left(tb, unrelated_pids))

    # `dspark stop` afterwards has nothing left to stop, and what we did not start still runs.
    stopped = run(tb, tmp_path, env, "stop", launcher=cli)
    assert stopped.returncode == 0, stopped.stderr
    for pid, started in unrelated.values():
        assert survives(pid, started), f"{pid} ({cmdline(pid)}) was killed"


# --------------------------------------------------------------------------- dashboard, auth disabled


def dashboard_wheelhouse() -> Path | None:
    """Wheels for Ray's dashboard dependencies (`ray[default]` minus Ray), downloaded once; None offline."""
    from importlib import metadata

    otel = metadata.version("opentelemetry-semantic-conventions")  # same release train as the exporter
    packages = ["aiohttp-cors", "opencensus", f"opentelemetry-exporter-prometheus=={otel}"]
    cache = Path("/tmp/dspark-test-wheels") / f"ray-dashboard-{metadata.version('ray')}-otel-{otel}"
    if (cache / ".complete").exists():
        return cache
    partial = cache.with_name(cache.name + f".part{os.getpid()}")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(partial), *packages],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        return None
    (partial / ".complete").write_text(" ".join(packages) + "\n")
    partial.rename(cache)
    return cache


def test_dashboard_local_and_auth_disabled(testbed_clean, tmp_path):
    tb = testbed_clean
    env = write_env(tb, tmp_path, DSPARK_RAY_DASHBOARD="local", RAY_AUTH_MODE="disabled")
    unrelated: set[int] = set()

    deps = tb.exec("head", [sys.executable, "-c", "import ray.dashboard.optional_deps"])
    if deps.returncode != 0:
        # Plain `pip install ray` (as vLLM installs it) cannot run the dashboard: a pre-flight line, nothing started.
        refused = dspark(tb, env, "cluster", "up")
        assert refused.returncode == 1, refused.stderr
        errors = [l for l in refused.stderr.splitlines() if l.startswith("dspark: error:")]
        assert len(errors) == 1 and "head (10.213.0.1): dashboard: DSPARK_RAY_DASHBOARD=local" in errors[0], errors
        assert "ray[default]" in errors[0] and "DSPARK_RAY_DASHBOARD=off" in errors[0]
        assert "starting Ray" not in refused.stderr
        assert ours_left(tb, unrelated) == set()
        wheels = dashboard_wheelhouse()
        if wheels is None:
            pytest.skip("Ray's dashboard packages are not installed and cannot be downloaded here")
        # Into the head node's own copy of the venv (an overlay): the host's venv is untouched.
        installed = tb.exec(
            "head",
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--find-links",
                str(wheels),
                *(wheels / ".complete").read_text().split(),
            ],
            timeout=300,
        )
        assert installed.returncode == 0, installed.stderr[-2000:]

    up = dspark(tb, env, "cluster", "up")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        warnings = [l for l in up.stderr.splitlines() if "RAY_AUTH_MODE=disabled" in l]
        assert len(warnings) == 1 and warnings[0].startswith("dspark: warning:") and "isolated fabric" in warnings[0]
        hint = [l for l in up.stdout.splitlines() if l.startswith("Ray dashboard:")]
        assert len(hint) == 1, up.stdout
        assert f"ssh -N -L {DASHBOARD_PORT}:127.0.0.1:{DASHBOARD_PORT} root@{tb.head.hostname}" in hint[0], hint

        def dashboard_up():
            return any(l.port == DASHBOARD_PORT for l in listeners(tb, "head"))

        assert wait_until(dashboard_up, 60), [str(l) for l in listeners(tb, "head")]
        head = listeners(tb, "head")
        ours = tb.pids_in("head", include_infra=False)
        assert {l.address for l in head if l.port == DASHBOARD_PORT} == {"127.0.0.1"}, [str(l) for l in head]
        assert http_from(tb, "head", f"http://127.0.0.1:{DASHBOARD_PORT}/api/version") == 200
        assert http_from(tb, "worker1", f"http://{tb.head.ip}:{DASHBOARD_PORT}/api/version") == 0  # not on the fabric

        def allow(l: Listener) -> bool:
            if ray_known_wildcard(l):
                return True
            if "ray::DashboardAgent" in l.cmd:  # the agent's gRPC server (ray[default] only)
                return True
            return l.port == DASHBOARD_METRICS_PORT and "dashboard/dashboard.py" in l.cmd

        assert unexpected_wildcards(head, ours, allow) == []
        assert unexpected_wildcards(listeners(tb, "worker1"), tb.pids_in("worker1", include_infra=False), allow) == []
    finally:
        down = dspark(tb, env, "stop")
    assert down.returncode == 0, down.stderr
    assert ours_left(tb, unrelated) == set(), describe(ours_left(tb, unrelated))
