"""The start script, the systemd unit and the memory pre-flight."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_launch.agent.protocol import MemoryAnswer
from dspark_launch.model.hub import hub_source
from dspark_launch.model.location import local_location
from dspark_launch.model.onnodes import ModelWeights, WantedModel, manifest_weights, placed_weights
from dspark_launch.node.manifest import Manifest, ManifestFile, read_manifest, write_manifest
from dspark_launch.serve.memory_preflight import estimate
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
    assert "placeholders from the example still set: DSPARK_HEAD_IP=192.0.2.1" in proc.stderr


def test_systemd_unit(tmp_path):
    env = tmp_path / "site.env"
    env.write_text("MAX_NUM_SEQS=8\n")
    proc = run_dspark(["systemd-unit", "--env-file", str(env)])
    assert proc.returncode == 0, proc.stderr
    unit = proc.stdout
    assert f'"start" "--foreground" "--env-file" "{env}"' in unit and f'"stop" "--env-file" "{env}"' in unit
    assert "SuccessExitStatus=3 143" in unit and "Restart=on-failure" in unit and "[Install]" in unit
    assert "\nTimeoutStopSec=180\n" in unit  # 120 s of bounded stop waits + the default 60 s drain


def test_systemd_unit_stop_timeout_covers_the_drain(tmp_path):
    env = tmp_path / "site.env"
    env.write_text("DSPARK_DRAIN_TIMEOUT_S=600\n")
    unit = run_dspark(["systemd-unit", "--env-file", str(env)]).stdout
    assert "\nTimeoutStopSec=720\n" in unit
    env.write_text("DSPARK_DRAIN_TIMEOUT_S=0\n")
    assert "\nTimeoutStopSec=120\n" in run_dspark(["systemd-unit", "--env-file", str(env)]).stdout


def placed_model(folder: Path, sizes: dict[str, int], source: str = "", revision: str = "local") -> Path:
    """A model folder as a pull or copy leaves it: sparse files of these sizes and the manifest over them
    (sha256 unknown: the sizes are what the fast check and the memory pre-flight read)."""
    folder.mkdir(parents=True)
    for name, size in sizes.items():
        with open(folder / name, "wb") as handle:
            handle.truncate(size)
    write_manifest(
        folder,
        Manifest(
            source or str(folder), revision, tuple(ManifestFile(name, size, "") for name, size in sorted(sizes.items()))
        ),
    )
    return folder


def hub_cache_model(cache: Path, repo_id: str, sizes: dict[str, int]) -> Path:
    """`repo_id` pulled into the hub cache folder `cache` (refs/main -> one snapshot holding the manifest)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return placed_model(repo / "snapshots" / commit, sizes, repo_id, commit)


def test_memory_preflight_counts_the_verified_weights(tmp_path):
    folder = placed_model(
        tmp_path / "m", {"a.safetensors": 200 * 2**30, "b.safetensors": 100 * 2**30, "config.json": 10}
    )
    weights = manifest_weights(local_location(str(folder)), read_manifest(folder))
    assert weights == ModelWeights(str(folder), 300 * 2**30)  # the shards only
    memory = {"head": MemoryAnswer(128 * 2**30), "worker1": MemoryAnswer(128 * 2**30)}
    found = estimate("none", weights, "auto", 256, 2, 0.835, memory)
    assert not found.fits and [f.fits for f in found.findings] == [False, False]
    assert found.findings[0].line.startswith(
        "head: 150.0 GiB (weights 150.0 GiB) does not fit in 128.0 GiB x GPU_MEMORY_UTILIZATION 0.835 = 106.9 GiB"
    )
    assert estimate("none", ModelWeights(str(folder), 150 * 2**30), "auto", 256, 2, 0.835, memory).fits


def test_weights_without_shards_count_every_file_and_unplaced_weights_are_left_out(tmp_path):
    folder = placed_model(tmp_path / "m", {"pytorch_model.bin": 1000, "config.json": 24})
    assert manifest_weights(local_location(str(folder)), read_manifest(folder)).size_bytes == 1024
    found = estimate("none", None, "auto", 256, 2, 0.835, {"head": MemoryAnswer(2**30)})
    assert found.weights_per_node is None and any("never placed on the head" in n for n in found.notes)


def test_plan_reads_the_heads_manifest_in_the_configured_cache_only(tmp_path):
    # DSPARK_MODEL_CACHE is a folder the hub's own cache lookup (HF_HUB_CACHE / HF_HOME) never visits.
    cache = tmp_path / "weights-cache"
    folder = hub_cache_model(cache, "org/huge", {"model.safetensors": 3 * 2**40})
    wanted = WantedModel("org/huge", "", hub_source("org/huge", "", str(cache), {"HF_HOME": str(tmp_path / "hf")}), 1)
    assert placed_weights(wanted) == ModelWeights(str(folder), 3 * 2**40)
    elsewhere = hub_source("org/huge", "", str(tmp_path / "empty"), {})
    assert placed_weights(WantedModel("org/huge", "", elsewhere, 1)) is None


@pytest.mark.testbed
@pytest.mark.parametrize("where", ["local folder", "hub cache outside HF_HOME"])
def test_memory_preflight_refuses_by_default_before_anything_starts(testbed_clean, tmp_path, where):
    """The verified weights (a sparse TiB: the nodes share this filesystem, so the weights pre-flight passes)
    are what the memory pre-flight counts, wherever the weights pre-flight found them."""
    from tests.support.on_testbed import dspark, our_pids, write_env

    shards = {"model.safetensors": 2**40, "config.json": 2}
    if where == "local folder":
        env = write_env(testbed_clean, tmp_path, DSPARK_MODEL=str(placed_model(tmp_path / "huge-model", shards)))
    else:
        cache = tmp_path / "weights-cache"
        hub_cache_model(cache, "org/huge", shards)
        env = write_env(testbed_clean, tmp_path, DSPARK_MODEL="org/huge", DSPARK_MODEL_CACHE=str(cache))
    proc = dspark(testbed_clean, env, "start")
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error: ")]
    assert len(errors) == 1 and "memory pre-flight: head (10.213.0.1): " in errors[0], proc.stderr
    assert "does not fit in" in errors[0] and "GPU_MEMORY_UTILIZATION 0.87 " in errors[0] and "--force" in errors[0]
    assert "lower MAX_MODEL_LEN" in errors[0] or "MAX_MODEL_LEN cannot fix it" in errors[0]
    assert "(weights 512.0 GiB" in errors[0] or "(weights 1024.0 GiB" in errors[0]  # / TP
    assert "starting Ray" not in proc.stderr
    assert our_pids(testbed_clean, "head") == set() and our_pids(testbed_clean, "worker1") == set()
    warn = dspark(testbed_clean, env, "start", "--help")
    assert warn.returncode == 0


def test_what_fixes_the_kv_size_of_vllms_cpu_backend_turns_its_free_memory_gate_off():
    from dspark_launch.serve.memory_preflight import kv_size_fixed

    assert kv_size_fixed(("m", "--kv-cache-memory-bytes=2G"), {}) == "--kv-cache-memory-bytes"
    assert kv_size_fixed(("m",), {"VLLM_CPU_KVCACHE_SPACE": "1"}) == "VLLM_CPU_KVCACHE_SPACE"
    assert kv_size_fixed(("m",), {"VLLM_CPU_KVCACHE_SPACE": ""}) == ""  # vllm/platforms/cpu.py: empty is unset
    busy = {"head": MemoryAnswer(24 * 2**30, 2 * 2**30, nvidia_gpu=False)}
    assert estimate("none", None, "auto", 256, 2, 0.5, busy, "VLLM_CPU_KVCACHE_SPACE").fits
    refused = estimate("none", None, "auto", 256, 2, 0.5, busy, "")
    assert not refused.fits and refused.findings[0].problem.startswith("head: MemAvailable 2.00 GiB < 24.00 GiB x")
    gpu = {"head": MemoryAnswer(24 * 2**30, 2 * 2**30, nvidia_gpu=True)}  # a GPU node: the gate always applies
    assert not estimate("none", None, "auto", 256, 2, 0.5, gpu, "VLLM_CPU_KVCACHE_SPACE").fits
