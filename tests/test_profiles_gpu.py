"""Each flag judged for the GPU it will run on: the installed vLLM 0.32's own DeepSeek-V4 code run for a
compute capability on this CPU, the GB10 speed settings against the install and recorded older builds."""

from __future__ import annotations

import dataclasses
import json

import pytest
from dspark_test_profiles import TINY_TEST

from dspark_launch.agent.handlers.hotfix import gpu_query, proc_driver_version, version_row
from dspark_launch.config.profile_resolve import resolve
from dspark_launch.config.settings import resolve as load_settings
from dspark_launch.errors import EXIT_BAD_CONFIG, ConfigError
from dspark_launch.node.values import VersionRow
from dspark_launch.node.versions import differing_rows
from dspark_launch.node.vllm_offer import KvVerdict, VllmOffer
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from dspark_launch.profiles.gpu import Capability, gpu_target, parse_capability
from tests.support.paths import DATA, REPO
from tests.support.vllm_parser import refusal

GB10 = gpu_target({"head": "12.1", "worker1": "12.1"})
B200 = gpu_target({"head": "10.0", "worker1": "10.0"})
# What a GB10 node with the recipes' libraries (pip install b12x instanttensor nvidia-cutlass-dsl) reports.
GB10_LIBRARIES = ("b12x", "flashinfer", "instanttensor", "cutlass")


@pytest.fixture(scope="module")
def installed(installed_vllm_offer) -> VllmOffer:
    return installed_vllm_offer


def settings(environ: dict[str, str] | None = None):
    return load_settings(env_file=str(REPO / ".env.dspark.example"), environ=environ or {})


def recorded(version: str) -> VllmOffer:
    return VllmOffer.from_json((DATA / f"vllm-{version}-offer.json").read_text())


def line_of(resolved, subject: str) -> str:
    return next(d.line for d in resolved.decisions if d.subject == subject)


def value_of(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_capabilities_parse_and_nodes_agree_or_are_not_judged():
    assert parse_capability("12.1") == Capability(12, 1) and parse_capability(" 9.0 ") == Capability(9, 0)
    assert parse_capability(None) is None and parse_capability("") is None and parse_capability("12") is None
    assert Capability(12, 1).matches("12") and Capability(12, 1).matches("12.1")
    assert not Capability(12, 0).matches("12.1") and not Capability(10, 0).matches("12")
    assert GB10.capability == Capability(12, 1) and GB10.basis == "compute capability 12.1 on head, worker1"
    cpu = gpu_target({"head": None, "worker1": None})
    assert not cpu.known and "no node reported a GPU compute capability" in cpu.basis
    mixed = gpu_target({"head": "12.1", "worker1": "10.0"})
    assert not mixed.known and "nodes differ in compute capability (head 12.1, worker1 10.0)" in mixed.basis
    partly = gpu_target({"head": "12.1", "worker1": None})
    assert partly.capability == Capability(12, 1) and "(worker1 reported none)" in partly.basis


def test_the_version_row_reads_capability_and_driver_without_torch():
    assert gpu_query("12.1, 580.95.05\n") == ("12.1", "580.95.05")
    assert gpu_query("9.0, 550.54.15\n9.0, 550.54.15\n") == ("9.0", "550.54.15")
    assert gpu_query("8.0, 550.1\n9.0, 550.1\n") == ("8.0/9.0", "550.1")  # unequal GPUs differ in the matrix
    assert gpu_query("") == (None, None) and gpu_query("[N/A], 580.1\n") == ("[N/A]", "580.1")
    assert (
        proc_driver_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release "
            "Build  (dvs-builder@U16-I3-B03-4-3)"
        )
        == "580.95.05"
    )
    assert proc_driver_version("nothing here") is None


def test_nodes_on_different_gpus_or_nccl_differ_in_the_version_matrix():
    rows = {
        "head": VersionRow(compute_capability="12.1", nccl="2.27.7 (nvidia-nccl-cu13)"),
        "worker1": VersionRow(compute_capability="10.0", nccl="2.30.4 (nvidia-nccl-cu13)"),
    }
    assert differing_rows(rows) == ["compute_capability", "nccl"]
    row = version_row()  # this CPU machine: no GPU, no NCCL wheel beside torch+cpu
    assert row.compute_capability is None and row.nccl is None


def test_the_installed_032_judges_deepseek_v4_kv_per_capability(installed):
    assert "_select_dsv4_attn_cls" in installed.kv_judged_by
    gb10, b200 = installed.judgement("12.1"), installed.judgement("10.0")
    assert gb10.attention.startswith("DeepseekV4FlashInferSM120Attention")
    assert b200.attention.startswith("DeepseekV4FlashMLAAttention")
    for judgement in (gb10, b200):
        assert judgement.verdict("fp8") == KvVerdict("fp8", "fp8_ds_mla")  # fp8 is an alias of fp8_ds_mla
        nvfp4 = judgement.verdict("nvfp4_ds_mla")
        assert not nvfp4.layout and "fp8_ds_mla layout only supports fp8 kv-cache" in nvfp4.refusal
    assert gb10.verdict("auto").refusal and b200.verdict("auto").layout == "fp8_ds_mla"  # SM12x: fp8 only
    assert set(installed.modules) <= {"b12x", "flashinfer", "instanttensor", "fastsafetensors", "cutlass", "deep_gemm"}
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH" in installed.env_names and "probabilistic" in installed.draft_sample_methods
    assert "B12X_MLA_SPARSE" not in installed.flag("--attention-backend").choices
    assert "instanttensor" in installed.flag("--load-format").choices
    assert VllmOffer.from_json(installed.to_json()) == installed


def test_gb10_takes_fp8_stored_as_fp8_ds_mla_and_the_real_parser_accepts_it(installed):
    resolved = resolve(DEEPSEEK_V4_FLASH, installed, settings(), GB10)
    assert value_of(resolved.serve_args, "--kv-cache-dtype") == "fp8"
    assert (resolved.kv_cache.value, resolved.kv_cache.layout, resolved.kv_cache.judged) == ("fp8", "fp8_ds_mla", True)
    line = line_of(resolved, "kv-cache-dtype")
    assert line.startswith(
        "kv-cache-dtype fp8: nvfp4_ds_mla refused on 12.1 by the installed vLLM 0.32.0's "
        "DeepseekV4FlashInferSM120Attention"
    )
    assert "fp8_ds_mla layout only supports fp8 kv-cache" in line and "stored as fp8_ds_mla" in line
    assert refusal(list(resolved.serve_args)) is None


def test_capability_10_takes_fp8_too_and_leaves_out_the_gb10_settings(installed):
    """vLLM 0.32's DeepSeek-V4 on 10.0 is DeepseekV4FlashMLAAttention: its backend takes auto/fp8/fp8_ds_mla and
    its layout refuses nvfp4_ds_mla (flashmla_sparse.py's 10.x nvfp4 gate is the V3.2 backend's)."""
    resolved = resolve(DEEPSEEK_V4_FLASH, dataclasses.replace(installed, modules=GB10_LIBRARIES), settings(), B200)
    assert resolved.kv_cache == type(resolved.kv_cache)("fp8", "fp8_ds_mla", True)
    assert "refused on 10.0 by the installed vLLM 0.32.0's DeepseekV4FlashMLAAttention" in line_of(
        resolved, "kv-cache-dtype"
    )
    for flag in ("--moe-backend", "--linear-backend", "--attention-backend"):
        assert flag not in resolved.serve_args
        assert "for compute capability 12; the nodes have compute capability 10.0 on head, worker1" in line_of(
            resolved, flag.lstrip("-")
        )
    assert "CUTE_DSL_ARCH" not in dict(resolved.env) and "VLLM_USE_DEEP_GEMM" not in dict(resolved.env)
    assert line_of(resolved, "CUTE_DSL_ARCH").startswith("CUTE_DSL_ARCH omitted: sm_121a: for compute capability 12.1")


def test_nvfp4_where_the_build_takes_it_for_the_nodes_capability(installed):
    """A build whose DeepSeek-V4 attention takes nvfp4_ds_mla on 10.0 only (as a patched image reports it)."""
    patched = dataclasses.replace(
        installed,
        kv_judgements=tuple(
            dataclasses.replace(
                j,
                verdicts=tuple(
                    KvVerdict(v.dtype, "nvfp4_ds_mla") if v.dtype == "nvfp4_ds_mla" else v for v in j.verdicts
                ),
            )
            if j.capability == "10.0"
            else j
            for j in installed.kv_judgements
        ),
    )
    on_b200 = resolve(DEEPSEEK_V4_FLASH, patched, settings(), B200)
    assert on_b200.kv_cache.value == "nvfp4_ds_mla" and on_b200.kv_cache.judged
    assert line_of(on_b200, "kv-cache-dtype").startswith("kv-cache-dtype nvfp4_ds_mla: the profile's first choice")
    assert resolve(DEEPSEEK_V4_FLASH, patched, settings(), GB10).kv_cache.value == "fp8"


def test_gb10_speed_settings_kept_where_032_has_them_each_with_its_recipe(installed):
    resolved = resolve(DEEPSEEK_V4_FLASH, dataclasses.replace(installed, modules=GB10_LIBRARIES), settings(), GB10)
    args, env = resolved.serve_args, dict(resolved.env)
    assert value_of(args, "--moe-backend") == "b12x" and value_of(args, "--linear-backend") == "b12x"
    assert value_of(args, "--load-format") == "instanttensor"
    assert value_of(args, "--max-cudagraph-capture-size") == "36"  # MAX_NUM_SEQS 6 x (5 + 1)
    assert json.loads(value_of(args, "--compilation-config"))["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert json.loads(value_of(args, "--reasoning-config"))["reasoning_end_str"] == "</think>"
    assert json.loads(value_of(args, "--speculative-config"))["draft_sample_method"] == "probabilistic"
    assert env == {
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800",
        "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
        "VLLM_USE_FLASHINFER_SAMPLER": "1",
        "CUTE_DSL_ARCH": "sm_121a",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "256",
        "VLLM_USE_DEEP_GEMM": "0",
    }
    assert "vLLM recipe dgx_spark_gb10 and eugr 0731-1m: b12x" in line_of(resolved, "moe-backend")
    assert (
        "on 12.1 the installed vLLM's MoE oracle for the checkpoint's experts (Mxfp4MoEMethod) selects B12X_MXFP4_MXFP8"
    ) in line_of(resolved, "moe-backend")
    assert "read by the installed vLLM 0.32.0 (vllm/envs.py)" in line_of(resolved, "VLLM_USE_BREAKABLE_CUDAGRAPH")
    # 0.32 has no B12X_MLA_SPARSE: the attention backend (and the drafter's) is left out, with the reason.
    assert "--attention-backend" not in args and "attention_backend" not in value_of(args, "--speculative-config")
    assert "B12X_MLA_SPARSE not offered by the installed vLLM 0.32.0" in line_of(resolved, "attention-backend")
    assert refusal(list(args)) is None  # the real 0.32 parser and validator take every kept flag


def test_a_library_the_node_lacks_drops_its_value_and_falls_back(installed):
    resolved = resolve(
        DEEPSEEK_V4_FLASH, dataclasses.replace(installed, modules=("flashinfer", "fastsafetensors")), settings(), GB10
    )
    assert value_of(resolved.serve_args, "--moe-backend") == "marlin"  # not auto: DeepGEMM where the build has it
    assert line_of(resolved, "moe-backend").startswith(
        "moe-backend marlin: b12x needs the b12x package, not installed beside the vLLM 0.32.0"
    )
    assert value_of(resolved.serve_args, "--load-format") == "fastsafetensors"
    assert "--linear-backend" not in resolved.serve_args and "CUTE_DSL_ARCH" not in dict(resolved.env)
    assert line_of(resolved, "CUTE_DSL_ARCH") == (
        "CUTE_DSL_ARCH omitted: read by cutlass, not installed beside the vLLM 0.32.0 "
        "(MiaAI, vLLM recipe dgx_spark_gb10, eugr)"
    )


def test_speed_settings_a_recorded_older_build_lacks_are_dropped_with_the_reason():
    resolved = resolve(
        DEEPSEEK_V4_FLASH, recorded("0.10.1.1"), settings({"VLLM_EXTRA_ARGS": "--tokenizer-mode=auto"}), GB10
    )
    for flag in (
        "--moe-backend",
        "--linear-backend",
        "--attention-backend",
        "--reasoning-config",
        "--max-cudagraph-capture-size",
    ):
        assert flag not in resolved.serve_args
        assert f"the installed vLLM 0.10.1.1 has no {flag}" in line_of(resolved, flag.lstrip("-"))
    # A recorded description holds no KV judgement: the line says the dtype was not judged for 12.1.
    assert "not judged for 12.1: the offer holds no KV judgement" in line_of(resolved, "kv-cache-dtype")
    assert "not checked: the offer does not list the variables vLLM reads" in line_of(
        resolved, "VLLM_USE_BREAKABLE_CUDAGRAPH"
    )


def test_the_operator_sets_or_unsets_a_profile_variable_and_others_are_refused(installed):
    given = settings({"DSPARK_PROFILE_ENV": "VLLM_USE_FLASHINFER_SAMPLER=0 PYTORCH_CUDA_ALLOC_CONF="})
    resolved = resolve(DEEPSEEK_V4_FLASH, installed, given, GB10)
    env = dict(resolved.env)
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert line_of(resolved, "VLLM_USE_FLASHINFER_SAMPLER") == (
        "VLLM_USE_FLASHINFER_SAMPLER 0: the operator's, from DSPARK_PROFILE_ENV in environment (the profile gives 1)"
    )
    assert line_of(resolved, "PYTORCH_CUDA_ALLOC_CONF").startswith(
        "PYTORCH_CUDA_ALLOC_CONF omitted: left unset by DSPARK_PROFILE_ENV from environment"
    )
    with pytest.raises(ConfigError) as caught:
        resolve(TINY_TEST, installed, settings({"DSPARK_PROFILE_ENV": "NCCL_DEBUG=INFO"}))
    assert caught.value.exit_code == EXIT_BAD_CONFIG
    assert str(caught.value).startswith(
        "DSPARK_PROFILE_ENV=NCCL_DEBUG=INFO from environment: NCCL_DEBUG is not a "
        "variable of profile tiny-test; allowed: VLLM_ALLOW_LONG_MAX_MODEL_LEN"
    )
    with pytest.raises(ConfigError, match=r"DSPARK_PROFILE_ENV.*space-separated NAME=VALUE"):
        settings({"DSPARK_PROFILE_ENV": "VLLM_USE_DEEP_GEMM"})
    with pytest.raises(ConfigError, match=r"DSPARK_PROFILE_ENV.*LD_PRELOAD"):
        settings({"DSPARK_PROFILE_ENV": "LD_PRELOAD=/x.so"})


def test_the_operators_flag_wins_and_its_kv_layout_is_judged(installed):
    resolved = resolve(
        DEEPSEEK_V4_FLASH,
        installed,
        settings({"VLLM_EXTRA_ARGS": "--kv-cache-dtype fp8_ds_mla --moe-backend auto"}),
        GB10,
    )
    assert resolved.kv_cache.value == "fp8_ds_mla" and resolved.kv_cache.layout == "fp8_ds_mla"
    assert line_of(resolved, "moe-backend").startswith("moe-backend auto: VLLM_EXTRA_ARGS from environment")
