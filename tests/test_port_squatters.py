"""Two exploitable holes reproduced on the testbed: another local user (`nobody`) listens
on the head's Ray port and on the API port after our processes are gone (a reboot, a crash).

Before the fix, `status` and `restart` sent the Ray token on file to the Ray port (Ray's GCS client does,
to whoever listens) and `smoke`/`status` the API key to the API port. Now the head's agent checks who
holds each port first (agent/port_holder.py): the squatters get no connection at all, every command names
them by pid and user, the token on file is replaced, and nothing is started against them.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time

import pytest

from dspark_launch import __version__
from dspark_launch.cluster.state import Deployment, NodeRecord, ProcessRecord, ServerRecord, save_state
from tests.support import squatter
from tests.support.on_testbed import API_KEY, run, serving_env

pytestmark = pytest.mark.testbed

RAY_PORT, API_PORT = 6379, 8000
PLANTED_TOKEN = "0123456789abcdef" * 4


def stale_record(tb, state_dir) -> None:
    """A deployment whose every process is gone: pid 1 with another start time is nobody of ours."""
    gone = [
        ProcessRecord(1, 1, cmd="/venv/lib/ray/core/src/ray/gcs/gcs_server"),
        ProcessRecord(1, 2, cmd="/venv/lib/ray/core/src/ray/raylet/raylet"),
    ]
    nodes = [
        NodeRecord(name="head", ip=tb.head.ip, ssh_host=None, marker="dspark-0badcafe-head", processes=list(gone)),
        *(
            NodeRecord(
                name=f"worker{i}",
                ip=w.ip,
                ssh_host=f"root@{w.ip}",
                marker=f"dspark-0badcafe-worker{i}",
                processes=list(gone),
            )
            for i, w in enumerate(tb.workers, 1)
        ),
    ]
    server = ServerRecord(
        marker="dspark-0badcafe-server",
        log=str(state_dir / "logs" / "vllm-serve.log"),
        url=f"http://127.0.0.1:{API_PORT}",
        served_name="tiny",
        model="tiny",
        started_at=time.time() - 3600,
        settings={},
        digest="",
        cap=1,
        pid=1,
        start_time=1,
    )
    save_state(
        state_dir,
        Deployment(
            ray_address=f"{tb.head.ip}:{RAY_PORT}",
            config_digest="x",
            started_at=time.time() - 3600,
            launcher_version=__version__,
            nodes=nodes,
            server=server,
        ),
    )
    token = state_dir / "ray-auth-token"
    token.write_text(PLANTED_TOKEN + "\n")
    token.chmod(0o600)


def squat(tb, tmp_path, host: str, port: int):
    log = tmp_path / f"squatter-{port}.log"
    return squatter.in_node(tb, "head", log, host, port), log


def test_squatters_on_the_ray_and_api_ports_get_nothing(testbed_clean, tmp_path, tiny_model):
    tb = testbed_clean
    env = serving_env(tb, tmp_path, tiny_model)
    state_dir = tmp_path / "state"
    (state_dir / "logs").mkdir(parents=True, mode=0o700)
    state_dir.chmod(0o700)
    stale_record(tb, state_dir)
    ray_squatter, ray_log = squat(tb, tmp_path, tb.head.ip, RAY_PORT)
    api_squatter, api_log = squat(tb, tmp_path, "127.0.0.1", API_PORT)
    try:
        before = {node: tb.pids_in(node, include_infra=False) for node in ("head", "worker1")}
        _check_status_smoke_restart(tb, tmp_path, env, state_dir, ray_squatter.pid, api_squatter.pid)
        # Nothing was started on either node: only the squatters live there.
        after = {node: tb.pids_in(node, include_infra=False) for node in ("head", "worker1")}
        assert after == before, (before, after)
        assert squatter.connections(ray_log) == [] and squatter.connections(api_log) == []
    finally:
        for proc in (ray_squatter, api_squatter):
            proc.kill()
            proc.wait()


def _check_status_smoke_restart(tb, tmp_path, env, state_dir, ray_pid: int, api_pid: int) -> None:
    token_file = state_dir / "ray-auth-token"
    ray_holder = f"pid {ray_pid} (user nobody) listening on {tb.head.ip}:{RAY_PORT}"
    api_holder = f"pid {api_pid} (user nobody) listening on 127.0.0.1:{API_PORT}"

    shown = run(tb, tmp_path, env, "status", "--json", timeout=120)
    view = json.loads(shown.stdout)
    assert view["state"] == "down", shown.stdout
    problems = view["problems"]
    assert any(
        f"RAY_PORT {tb.head.ip}:{RAY_PORT} is held by {ray_holder}" in p and "a new Ray token was drawn" in p
        for p in problems
    ), problems
    assert any(
        f"VLLM_PORT {API_PORT} on 127.0.0.1 is held by {api_holder}" in p and "the API key was not sent" in p
        for p in problems
    ), problems
    # The token on file may have been read by whoever held the port before this launcher: replaced.
    renewed = token_file.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", renewed) and renewed != PLANTED_TOKEN
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    assert PLANTED_TOKEN not in shown.stdout + shown.stderr and API_KEY not in shown.stdout + shown.stderr

    smoked = run(tb, tmp_path, env, "smoke", timeout=120)
    errors = [line for line in smoked.stderr.splitlines() if line.startswith("dspark: error:")]
    assert smoked.returncode == 1 and len(errors) == 1 and api_holder in errors[0], smoked.stderr

    restarted = run(tb, tmp_path, env, "restart", timeout=600)
    out = restarted.stdout + restarted.stderr
    errors = [line for line in restarted.stderr.splitlines() if line.startswith("dspark: error:")]
    assert restarted.returncode != 0 and len(errors) == 1, out[-4000:]
    assert f"{tb.head.ip}:{RAY_PORT} is taken" in errors[0] and ray_holder in errors[0], errors
    assert "Traceback" not in out and API_KEY not in out and renewed not in out
