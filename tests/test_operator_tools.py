"""The start script, the systemd unit and the memory pre-flight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_launch.serve.memory import estimate, weights_bytes
from tests.support.launcher_env import run_dspark
from tests.support.paths import REPO

SCRIPT = REPO / "start-deepseek-v4-flash-dspark.sh"


def _script(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run([str(SCRIPT)], capture_output=True, text=True, env={**base, **env}, timeout=120, cwd=REPO)


def test_start_script_fails_in_bash_before_python(tmp_path):
    # Python would complain about this missing env file first; bash must stop earlier.
    proc = _script({"DSPARK_MAX_INFLIGHT_PREFILLS": "two", "DSPARK_ENV_FILE": str(tmp_path / "missing.env")})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "DSPARK_MAX_INFLIGHT_PREFILLS=two from environment" in lines[0]


def test_start_script_execs_dspark_start(tmp_path):
    proc = _script({"DSPARK_MAX_INFLIGHT_PREFILLS": "2", "DSPARK_ENV_FILE": str(REPO / ".env.dspark.example")})
    assert proc.returncode == 2
    assert "placeholder from the example file" in proc.stderr


def test_systemd_unit(tmp_path):
    env = tmp_path / "site.env"
    env.write_text("MAX_NUM_SEQS=8\n")
    proc = run_dspark(["systemd-unit", "--env-file", str(env)])
    assert proc.returncode == 0, proc.stderr
    unit = proc.stdout
    assert f'"start" "--foreground" "--env-file" "{env}"' in unit and f'"stop" "--env-file" "{env}"' in unit
    assert "SuccessExitStatus=3 143" in unit and "Restart=on-failure" in unit and "[Install]" in unit


def test_weights_from_the_safetensors_index(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 300 * 2**30}}))
    assert weights_bytes(tmp_path) == 300 * 2**30
    memory = {"head": 128 * 2**30, "worker1": 128 * 2**30}
    found = estimate("none", str(tmp_path), "", "auto", 256, 2, 0.835, memory)
    assert not found.fits and [f.fits for f in found.findings] == [False, False]
    assert found.findings[0].line.startswith("head: 150.0 GiB (weights 150.0 GiB) does not fit in 128.0 GiB x "
                                             "GPU_MEMORY_UTILIZATION 0.835 = 106.9 GiB")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 150 * 2**30}}))
    assert estimate("none", str(tmp_path), "", "auto", 256, 2, 0.835, memory).fits


def test_weights_from_safetensors_files(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "b.safetensors").write_bytes(b"x" * 24)
    assert weights_bytes(tmp_path) == 1024
    assert weights_bytes(tmp_path / "nope") is None


@pytest.mark.testbed
def test_memory_preflight_refuses_by_default_before_anything_starts(testbed_clean, tmp_path):
    from tests.support.on_testbed import dspark, our_pids, write_env

    model = tmp_path / "huge-model"
    model.mkdir()
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 2**50}}))
    from dspark_launch.model.local_model import prepare_local

    prepare_local(str(model))  # placed (the nodes share this filesystem): the weights pre-flight passes
    env = write_env(testbed_clean, tmp_path, DSPARK_MODEL=str(model))
    proc = dspark(testbed_clean, env, "start")
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error: ")]
    assert len(errors) == 1 and "memory pre-flight: head (10.213.0.1): " in errors[0], proc.stderr
    assert "does not fit in" in errors[0] and "GPU_MEMORY_UTILIZATION 0.835" in errors[0] and "--force" in errors[0]
    assert "starting Ray" not in proc.stderr
    assert our_pids(testbed_clean, "head") == set() and our_pids(testbed_clean, "worker1") == set()
    warn = dspark(testbed_clean, env, "start", "--help")
    assert warn.returncode == 0
