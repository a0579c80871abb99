"""The dry boot on other vLLM releases: the default profile's plan holds only values each release's own code
accepts for DeepSeek-V4-Flash-0731 (the shipped config.json), as tests/test_dry_boot.py asserts for the installed
0.32.

Not in the default run (`-m compat`, `make test-compat`). Each release runs in its own venv outside the checkout
(tests/support/compat_vllm.py: its CUDA wheel's Python with --no-deps beside the CPU torch of this run; built on
first use, about 3.7 GB and 8 minutes, reused after). The probe is the product's own
(`probe_installed_vllm` with that venv's Python, this checkout on PYTHONPATH) and the plan the product's own
(`resolve` on the offer it returns). VLLM_TARGET_DEVICE=cpu: the CUDA wheel finds no GPU here, and vLLM's CPU
platform is the one the dry boot patches on the CPU testbed too.
Run with: pytest -m compat tests/test_dry_boot_compat.py -s
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from unittest import mock

import pytest

from dspark_launch.config.profile_resolve import resolve
from dspark_launch.node.vllm_offer import JUDGED_CAPABILITIES, VllmOffer, probe_installed_vllm
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from dspark_launch.profiles.gpu import UNKNOWN
from tests.support.compat_vllm import cannot_build, venv_for
from tests.support.dry_boot_plan import (
    STOCK,
    WITH_B12X,
    assert_gb10_boot_as_vllm_decides,
    line_of,
    plan_for,
    settings,
    value_of,
)
from tests.support.paths import REPO
from tests.support.vllm_parser import refusal

pytestmark = pytest.mark.compat

VERSIONS = ["0.33.0"]
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module", params=VERSIONS)
def release(request) -> tuple[str, VllmOffer]:
    why = cannot_build()
    if why:
        pytest.skip(why)
    started = time.monotonic()
    python = venv_for(request.param)
    built = time.monotonic()
    with mock.patch.dict(os.environ, _ENV):
        offer = probe_installed_vllm(str(python), timeout_s=600)
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print(
            f"\n[dry-boot compat] vllm {request.param}: venv {python.parent.parent} ready in "
            f"{built - started:.0f} s, probe {time.monotonic() - built:.0f} s"
        )
    assert offer.version == request.param
    return str(python), offer


def test_the_dry_boot_runs_on_the_checkpoints_own_config(release):
    _, offer = release
    assert [b.capability for b in offer.boot_judgements] == list(JUDGED_CAPABILITIES), offer.booted_by
    assert_gb10_boot_as_vllm_decides(offer)


def test_every_kv_dtype_the_release_takes_is_judged(release):
    """0.33 checks --kv-cache-dtype in CacheConfig, not by argparse choices: the offer still lists and judges
    every dtype (an empty list would leave every dtype unjudged, so accepted)."""
    _, offer = release
    flag = offer.flag("--kv-cache-dtype")
    assert flag is not None and {"auto", "fp8", "nvfp4_ds_mla"} <= set(flag.choices)
    for judgement in offer.kv_judgements:
        assert [v.dtype for v in judgement.verdicts] == list(flag.choices), judgement.capability
    fp8 = offer.judgement("12.1").verdict("fp8")
    assert fp8 is not None and fp8.layout == "fp8_ds_mla" and not fp8.refusal


def test_gb10_stock_install_gets_an_moe_backend_the_mxfp4_oracle_accepts(release):
    _, offer = release
    resolved = plan_for(offer, "12.1", STOCK)
    chosen = value_of(resolved.serve_args, "--moe-backend")
    assert chosen == "marlin" and dict(resolved.env)["VLLM_USE_DEEP_GEMM"] == "0"
    verdict = offer.boot("12.1").verdict("moe", chosen, "0")
    assert verdict.chosen and not verdict.refusal
    line = line_of(resolved, "moe-backend")
    assert f"b12x needs the b12x package, not installed beside the vLLM {offer.version}" in line
    assert "MoE oracle for the checkpoint's experts (Mxfp4MoEMethod) selects MARLIN with VLLM_USE_DEEP_GEMM=0" in line
    assert "--linear-backend" not in resolved.serve_args
    assert "flashinfer_b12x" not in " ".join(resolved.serve_args)


def test_gb10_with_the_b12x_extra_gets_b12x(release):
    _, offer = release
    resolved = plan_for(offer, "12.1", WITH_B12X)
    assert value_of(resolved.serve_args, "--moe-backend") == "b12x"
    assert value_of(resolved.serve_args, "--linear-backend") == "b12x"
    assert "selects B12X_MXFP4_MXFP8" in line_of(resolved, "moe-backend")
    assert "selects B12xFp8BlockScaledMMKernel" in line_of(resolved, "linear-backend")


@pytest.mark.parametrize("capability", ["9.0", "10.0", "12.1"])
def test_every_judged_value_is_one_the_release_accepts_on_that_capability(release, capability):
    python, offer = release
    resolved = plan_for(offer, capability, WITH_B12X)
    boot, kv = offer.boot(capability), offer.judgement(capability)
    for flag, kind in (("--moe-backend", "moe"), ("--linear-backend", "linear")):
        value = value_of(resolved.serve_args, flag)
        if value is not None:
            assert not boot.verdict(kind, value).refusal, (capability, flag, value)
    kv_verdict = kv.verdict(value_of(resolved.serve_args, "--kv-cache-dtype"))
    assert kv_verdict is not None and not kv_verdict.refusal
    if capability != "12.1":
        assert "--moe-backend" not in resolved.serve_args and "--linear-backend" not in resolved.serve_args
    # The whole argv through the release's own serve parser and its checks (what a starting server runs).
    with mock.patch.dict(os.environ, _ENV):
        assert refusal(resolved.serve_args, python) is None


def test_a_plan_with_prefix_caching_off_uses_the_releases_own_negative(release):
    """0.33 lists a switch's negative as --disable-X (--no-enable-X still parses, hidden from help): the plan
    takes the spelling the offer lists, and the release parses it."""
    python, offer = release
    resolved = plan_for(offer, "12.1", WITH_B12X, {"ENABLE_PREFIX_CACHING": "0"})
    assert "--disable-prefix-caching" in resolved.serve_args
    assert "--enable-prefix-caching" not in resolved.serve_args
    with mock.patch.dict(os.environ, _ENV):
        assert refusal(resolved.serve_args, python) is None


_RESOLVE_BY_HAND = """
from vllm.config.compilation import CompilationConfig, CUDAGraphMode
from vllm.v1.attention.backend import AttentionCGSupport
mode = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE).resolve_cudagraph_mode_and_sizes(
    AttentionCGSupport.ALWAYS, "x", 6, use_v2_model_runner=True, piecewise_capture_available=False)
print("MODE " + mode.name)
"""


def test_the_effective_cuda_graph_mode_is_the_releases_resolution(release):
    python, offer = release
    resolved = plan_for(offer, "12.1", WITH_B12X)
    assert dict(resolved.env)["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    assert resolved.cuda_graph_mode == "FULL_DECODE_ONLY"
    assert line_of(resolved, "cuda-graphs (effective)").startswith(
        "cuda-graphs (effective) FULL_DECODE_ONLY: FULL_AND_PIECEWISE requested, "
        "VLLM_USE_BREAKABLE_CUDAGRAPH=0: on 12.1 breakable CUDA graphs off"
    )
    # The call vLLM's model runner makes, by hand in the release's venv: no piecewise capture.
    proc = subprocess.run(
        [python, "-c", _RESOLVE_BY_HAND], capture_output=True, text=True, timeout=300, env={**os.environ, **_ENV}
    )
    modes = [line[5:] for line in proc.stdout.splitlines() if line.startswith("MODE ")]
    assert modes == [resolved.cuda_graph_mode], proc.stderr[-2000:]
    unset = plan_for(offer, "12.1", WITH_B12X, {"DSPARK_PROFILE_ENV": "VLLM_USE_BREAKABLE_CUDAGRAPH="})
    assert unset.cuda_graph_mode == "FULL_AND_PIECEWISE"
    assert "VllmConfig turns them on for DeepseekV4ForCausalLM" in line_of(unset, "cuda-graphs (effective)")


def test_no_capability_never_emits_a_value_refused_everywhere(release):
    _, offer = release
    resolved = resolve(DEEPSEEK_V4_FLASH, dataclasses.replace(offer, modules=WITH_B12X), settings(), UNKNOWN)
    assert value_of(resolved.serve_args, "--kv-cache-dtype") == "fp8"
    assert (
        f"nvfp4_ds_mla refused by the installed vLLM {offer.version} on every capability it was asked for"
        in line_of(resolved, "kv-cache-dtype")
    )
    for judgement in offer.kv_judgements:
        verdict = judgement.verdict("nvfp4_ds_mla")
        assert verdict is not None and verdict.refusal  # what makes it "everywhere"
