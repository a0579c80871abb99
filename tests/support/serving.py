"""Real serving without the launcher: a Ray head on loopback, vLLM's API server, HTTP, log tails.

Nothing here is part of the product. Conventions (see tests/SERVING_NOTES.md):
- Processes are started and stopped through tests/support/processes.py (own session,
  identity by pid + start time, never ``ray stop``, never a kill by name).
- Ray runs with ``ray start --block`` so the ``ray start`` process stays the parent
  of gcs_server, raylet and the workers, and the whole node is one process tree.
- Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import ProcRecord, kill_tree, snapshot, start_process, survivors  # noqa: F401 (sh.*)

PLUGIN_ENV = "DSPARK_TEST_RAY_CPU_PLATFORM"


# ---------------------------------------------------------------------- net / http


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# Tests talk to loopback and their own namespaces only: never through a proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with _DIRECT.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post_json(
    url: str, payload: dict, timeout: float = 60.0, headers: dict[str, str] | None = None
) -> tuple[int, dict | str]:
    data = json.dumps(payload).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}, method="POST"
    )
    try:
        with _DIRECT.open(req, timeout=timeout) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        body, status = e.read(), e.code
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


class ServerDied(RuntimeError):
    pass


def wait_http_ready(
    url: str,
    deadline_s: float,
    proc: ProcRecord | None = None,
    interval: float = 0.5,
    log_path: Path | None = None,
) -> float:
    """Poll ``url`` until HTTP 200; return seconds waited.

    Raises ServerDied at once if ``proc`` exits, TimeoutError at the deadline;
    both messages carry the tail of ``log_path``.
    """
    t0 = time.monotonic()
    while True:
        if proc is not None and not proc.alive():
            raise ServerDied(f"process {proc.pid} exited before {url} was ready\n{tail(log_path)}")
        try:
            status, _ = http_get(url, timeout=2.0)
            if status == 200:
                return time.monotonic() - t0
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() - t0 > deadline_s:
            raise TimeoutError(f"{url} not ready after {deadline_s:.0f}s\n{tail(log_path)}")
        time.sleep(interval)


def tail(path: Path | None, n: int = 60) -> str:
    if path is None or not Path(path).exists():
        return ""
    lines = Path(path).read_text(errors="replace").splitlines()
    return "\n".join(lines[-n:])


# ----------------------------------------------------------------------------- ray


def venv_bin(name: str) -> str:
    """A console script beside the running interpreter (the venv's), else on PATH."""
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


def short_scratch_dir(prefix: str = "dspark-srv-") -> Path:
    """A fresh folder directly under /tmp for sockets and Ray's temp dir.

    AF_UNIX socket paths are limited to 107 bytes: Ray's session sockets and
    vLLM's ZMQ ipc sockets (under VLLM_RPC_BASE_PATH) overflow below pytest's
    long tmp_path. The caller removes it when done.
    """
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def base_env(scratch: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment shared by ``ray start`` and vLLM here; all state under ``scratch``.

    Ray workers inherit the raylet's environment, and vLLM copies only VLLM_*,
    NCCL_*, HF_* (and a few) variables from the driver to its Ray workers, so
    GLOO_SOCKET_IFNAME and the plugin switch must be in ``ray start``'s env too.
    """
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(
        {
            "RAY_AUTH_MODE": "disabled",  # Ray 2.60 token-auth trap: always explicit
            "RAY_USAGE_STATS_ENABLED": "0",
            PLUGIN_ENV: "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
            "VLLM_RPC_BASE_PATH": str(scratch / "rpc"),
            "VLLM_HOST_IP": LOOPBACK_NODE_IP,  # = the Ray node IP (see LOOPBACK_NODE_IP)
            "GLOO_SOCKET_IFNAME": "lo",
            "TP_SOCKET_IFNAME": "lo",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            "TMPDIR": str(scratch / "tmp"),  # torch inductor & co. write under it
            "PYTHONUNBUFFERED": "1",
        }
    )
    if extra:
        env.update(extra)
    for key in ("vllm-cache", "rpc", "tmp"):
        (scratch / key).mkdir(parents=True, exist_ok=True)
    return env


@dataclass
class RayNode:
    proc: ProcRecord
    address: str  # "ip:port" of the GCS
    temp_dir: Path
    log_path: Path


# Ray rewrites --node-ip-address 127.0.0.1 (and "localhost") to the host's primary
# address (ray._common.network_utils.is_localhost), so Ray and vLLM traffic would
# go to e.g. 192.0.2.2. Any other loopback address is kept as given: with
# 127.0.0.2 everything stays on `lo` and the test does not depend on the host
# having a routable interface. Keep VLLM_HOST_IP equal to the Ray node IP: the
# older Ray executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0) refuses a mismatch
# ("Every node should have a unique IP address"); RayExecutorV2, the 0.32
# default, served with a mismatch on one node, but multi-node setups rely on it.
LOOPBACK_NODE_IP = "127.0.0.2"


def ray_head_argv(
    ip: str,
    port: int,
    temp_dir: Path,
    num_gpus: int,
    num_cpus: int = 2,
    object_store_bytes: int = 200_000_000,
) -> list[str]:
    """``ray start --head --block`` with every fixed default port replaced by a free one.

    Ray's defaults (client server 10001, dashboard 8265, dashboard agent 52365)
    collide when two heads share a network namespace, even with the dashboard off.
    """
    return [
        venv_bin("ray"),
        "start",
        "--head",
        "--block",
        f"--node-ip-address={ip}",
        f"--port={port}",
        f"--temp-dir={temp_dir}",
        f"--num-gpus={num_gpus}",
        f"--num-cpus={num_cpus}",
        f"--object-store-memory={object_store_bytes}",
        "--include-dashboard=false",
        f"--dashboard-port={free_port()}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--disable-usage-stats",
    ]


def start_ray_head(
    scratch: Path,
    env: dict[str, str],
    log_path: Path,
    num_gpus: int = 2,
    ip: str = LOOPBACK_NODE_IP,
    port: int | None = None,
    wait_s: float = 90.0,
) -> RayNode:
    """Start a Ray head on ``ip`` with its own temp dir; return once it shows ``num_gpus`` GPUs.

    Ray's temp dir is ``scratch/ray`` (keep ``scratch`` short, see
    ``short_scratch_dir``).
    """
    port = port or free_port()
    temp_dir = scratch / "ray"
    temp_dir.mkdir(parents=True, exist_ok=True)
    log = log_path
    argv = ray_head_argv(ip, port, temp_dir, num_gpus)
    proc = start_process(argv, env, log)
    node = RayNode(proc, f"{ip}:{port}", temp_dir, log)
    t0 = time.monotonic()
    while True:
        if not proc.alive():
            raise ServerDied(f"ray head exited\n{tail(log)}")
        res = ray_cluster_query(node.address, env, timeout=30)
        if res and res.get("cluster", {}).get("GPU", 0) >= num_gpus:
            return node
        if time.monotonic() - t0 > wait_s:
            raise TimeoutError(f"ray head not up after {wait_s}s\n{tail(log)}")
        time.sleep(1.0)


_QUERY = r"""
import json, sys
import ray
from ray._private import state
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
actors = []
for a in state.actors().values():
    actors.append({
        "class": a.get("ActorClassName") or a.get("class_name"),
        "state": a.get("State") or a.get("state"),
        "ip": (a.get("Address") or {}).get("IPAddress"),
        "pid": a.get("Pid") or a.get("pid"),
        "node": (a.get("Address") or {}).get("NodeID"),
    })
print("@@" + json.dumps({
    "cluster": ray.cluster_resources(),
    "available": ray.available_resources(),
    "nodes": [{"ip": n["NodeManagerAddress"], "alive": n["Alive"], "host": n.get("NodeManagerHostname")} for n in ray.nodes()],
    "actors": actors,
}))
ray.shutdown()
"""


def ray_cluster_query(address: str, env: dict[str, str], timeout: float = 60) -> dict | None:
    """Resources, nodes and actors of the cluster at ``address``, from a throwaway driver.

    Runs in a subprocess so the test process never imports Ray (and never writes
    ~/.ray). Uses the GCS directly: works with the dashboard disabled.
    """
    qenv = dict(env)
    qenv["RAY_ADDRESS"] = address
    try:
        out = subprocess.run(
            [sys.executable, "-c", _QUERY, address],
            env=qenv,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return None
    for line in out.stdout.splitlines():
        if line.startswith("@@"):
            return json.loads(line[2:])
    return None


# ---------------------------------------------------------------------------- vllm


def vllm_serve_argv(
    model: Path | str,
    port: int,
    served_name: str = "tiny",
    tp: int = 2,
    host: str = "127.0.0.1",
    extra: list[str] | None = None,
) -> list[str]:
    """The API server by module path: the ``vllm`` console script fails with vllm-cpu.

    ``vllm.entrypoints.openai.api_server`` (deprecated alias, warns) and
    ``vllm.entrypoints.launchers.api_server.entry`` (what it runs) take the same
    arguments as ``vllm serve``.
    """
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        served_name,
        "--tensor-parallel-size",
        str(tp),
        "--distributed-executor-backend",
        "ray",
        "--max-model-len",
        "256",
        "--host",
        host,
        "--port",
        str(port),
        *(extra or []),
    ]
