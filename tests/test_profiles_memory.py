"""Memory pre-flight from the profile: weights / TP + measured overhead + KV at MAX_MODEL_LEN in the chosen KV
dtype against memory x utilisation, and MemAvailable against the installed vLLM release's rule: 0.32/0.33's
start-up gate, 0.34's extensible KV cache (each release's own code: tests/test_memory_rules_vllm.py)."""

from __future__ import annotations

import pytest
from dspark_test_profiles import TINY_TEST

from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH, DEEPSEEK_V4_ROW, NONE
from dspark_launch.profiles.memory_model import (
    EXTENSIBLE_KV,
    EXTENSIBLE_KV_MARGIN,
    GIB,
    START_GATE,
    NodeMemory,
    estimate_memory,
    memory_rule,
    model_shape,
    row_bytes,
)
from dspark_launch.profiles.model import KvRow
from dspark_launch.serve.memory_preflight import extensible_off

SPARKS = (NodeMemory("head", 128 * GIB), NodeMemory("worker1", 128 * GIB))
V4_CONFIG = {
    "model_type": "deepseek_v4",
    "num_hidden_layers": 43,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "compress_ratios": [0, 4, 128],
    "torch_dtype": "bfloat16",
}
TINY_CONFIG = {
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_size": 64,
    "torch_dtype": "float32",
}


def deepseek(dtype: str, tokens: int = 1048576, weights: int | None = None, shape=None, nodes=SPARKS):
    return estimate_memory(DEEPSEEK_V4_FLASH, dtype, tokens, 2, weights, shape, nodes, 0.835)


def test_row_bytes_match_vllms_deepseek_v32_layouts():
    row = KvRow(512, 64)  # kv_lora_rank 512, rope 64: vLLM's 656 B fp8_ds_mla, 352 B nvfp4_ds_mla rows
    assert row_bytes(row, "fp8_ds_mla") == 656 and row_bytes(row, "nvfp4_ds_mla") == 352
    assert row_bytes(KvRow(128, 0, mla=False), "nvfp4_ds_mla") is None


def test_deepseek_v4_rows_are_584_bytes_in_fp8_and_its_alias():
    # vLLM 0.32 flashmla_sparse.py / deepseek_v4 attention: 448 fp8 + 128 B bf16 rope + 7 ue8m0 scales + 1 pad
    # (vLLM issue 47648: 584, not 592); `fp8` is stored in the same layout there.
    assert row_bytes(DEEPSEEK_V4_ROW, "fp8_ds_mla") == 584 == row_bytes(DEEPSEEK_V4_ROW, "fp8")
    assert row_bytes(DEEPSEEK_V4_ROW, "auto") == 1024
    assert DEEPSEEK_V4_FLASH.kv_row == DEEPSEEK_V4_ROW


def test_calibrated_on_eugrs_measurement_at_1m_context():
    estimate = deepseek("fp8_ds_mla")
    assert abs(estimate.kv_per_node - 11.04 * GIB) < 1024
    assert "11.04 GiB for 1048576 tokens in fp8_ds_mla" in estimate.basis


def test_kv_scales_with_the_dtype_and_the_context():
    fp8_ds = deepseek("fp8_ds_mla").kv_per_node
    assert 0.45 < deepseek("nvfp4_ds_mla").kv_per_node / fp8_ds < 0.6
    assert 1.5 < deepseek("auto").kv_per_node / fp8_ds < 2.1  # "auto takes about twice the bytes per token"
    assert deepseek("fp8_ds_mla", tokens=262144).kv_per_node == pytest.approx(fp8_ds / 4, rel=1e-6)


def test_config_json_shape_reports_the_calibration_factor():
    shape = model_shape(V4_CONFIG)
    assert shape.row == DEEPSEEK_V4_ROW
    estimate = deepseek("fp8_ds_mla", shape=shape)
    assert abs(estimate.kv_per_node - 11.04 * GIB) < 1024 and "of 43 full layers" in estimate.basis


def test_refuses_with_the_numbers_when_a_node_cannot_hold_its_share():
    small = (NodeMemory("head", 128 * GIB), NodeMemory("worker1", 112 * GIB))
    # 160 GiB of files / TP 2 = 80 GiB is below the measured 81.34 GiB per node: the measured figure counts.
    estimate = deepseek("fp8_ds_mla", weights=160 * GIB, nodes=small)
    head, worker = estimate.findings
    assert head.fits and not worker.fits and not estimate.fits
    assert worker.line == (
        "worker1: 103.9 GiB (weights 81.3 GiB, non-KV 11.50 GiB, KV 11.04 GiB for 1048576 tokens "
        "in fp8_ds_mla) does not fit in 112.0 GiB x GPU_MEMORY_UTILIZATION 0.835 = 93.5 GiB"
    )
    assert worker.fix.startswith("lower MAX_MODEL_LEN to 64512 or less; raise GPU_MEMORY_UTILIZATION to 0.93")


# eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml, two GB10s, TP 2: a 121.69 GiB node, 81.34 GiB of
# weights each, ~117 GiB MemAvailable idle, 111.04 GiB read by vLLM's gate while weights load.
GB10 = int(121.69 * GIB)
MEASURED = int(2 * 81.34 * GIB)


DIP = int((117 - 111.04) * GIB)


def gb10(utilization: float, available: float = 117.0, dtype: str = "fp8", tokens: int = 1048576, version: str = ""):
    nodes = (NodeMemory("head", GB10, int(available * GIB)), NodeMemory("worker1", GB10, int(117.0 * GIB)))
    return estimate_memory(
        DEEPSEEK_V4_FLASH, dtype, tokens, 2, MEASURED, None, nodes, utilization, vllm_version=version
    )


def test_the_measured_gb10_figures_reproduce_eugrs_result():
    at_085 = gb10(0.85)  # eugr: 10.33 / 10.61 GiB left for KV against 11.04 needed: fails at init
    assert not at_085.fits and all(f.free_fits for f in at_085.findings)
    head = at_085.findings[0]
    assert not head.share_fits and "103.9 GiB" in head.line and "= 103.4 GiB" in head.line
    assert "lower MAX_MODEL_LEN to" in head.fix and "raise GPU_MEMORY_UTILIZATION to 0.86" in head.fix
    assert "allows up to 0.91" in head.fix  # the gate's ceiling eugr found (~0.912)
    assert gb10(0.90).fits  # eugr's recipe: boots with 1M context
    at_095 = gb10(0.95)  # eugr: "refused before allocating anything"
    assert all(f.share_fits for f in at_095.findings) and not at_095.fits
    assert all(f.free_fits is False for f in at_095.findings)
    assert "vLLM refuses to start" in at_095.findings[0].free_line
    assert gb10(0.85, tokens=524288).fits  # the other fix: a shorter context


def test_a_too_small_memavailable_is_refused_naming_the_node():
    estimate = gb10(0.90, available=100.0)
    head, worker = estimate.findings
    assert not estimate.fits and head.share_fits and head.free_fits is False and worker.fits
    assert head.problem == (
        "head: MemAvailable 100.00 GiB less 5.96 GiB measured to go while weights load < "
        "121.69 GiB x GPU_MEMORY_UTILIZATION 0.9 = 109.52 GiB (vLLM refuses to start when free "
        "memory is below utilization x total)"
    )
    assert head.fix == (
        "free memory on head (other processes, page cache held by them) or lower GPU_MEMORY_UTILIZATION to 0.77 or less"
    )


def test_the_installed_release_picks_the_memory_rule():
    assert memory_rule("0.32.0").name == memory_rule("0.33.0").name == START_GATE
    assert "request_memory" in memory_rule("0.32.0").why
    for version in ("0.34.0", "0.34.0+cu130", "0.35.1"):
        rule = memory_rule(version)
        assert rule.name == EXTENSIBLE_KV and rule.extensible and "measure_kv_cache_bytes" in rule.why
    assert memory_rule("not probed").name == START_GATE and "release not known" in memory_rule("").why
    off = memory_rule("0.34.0", "--kv-cache-memory-bytes")
    assert off.name == START_GATE and "with --kv-cache-memory-bytes: the extensible KV cache is off" in off.why
    # What turns it off in the serve arguments, in the spellings vLLM's parser takes.
    assert extensible_off(("m", "--num_gpu_blocks_override=64")) == "--num-gpu-blocks-override"
    assert extensible_off(("m", "--no-enable-extensible-kv-cache")) == "--no-enable-extensible-kv-cache"
    assert extensible_off(("m", "--kv-cache-memory-bytes", "1073741824")) == "--kv-cache-memory-bytes"
    assert extensible_off(("m", "--enable-extensible-kv-cache", "--kv-cache-dtype", "fp8")) == ""


def test_the_same_figures_on_034_make_utilization_a_cap_not_a_gate():
    # eugr's 0.95, refused by 0.32's gate ("refused before allocating anything"), starts on 0.34: the KV cache is
    # sized from the node's free memory and holds 1M context.
    at_095 = gb10(0.95, version="0.34.0")
    assert at_095.fits and at_095.rule == EXTENSIBLE_KV and not gb10(0.95, version="0.32.0").fits
    head = at_095.findings[0]
    assert head.rule == EXTENSIBLE_KV and head.share_fits and head.free_fits
    assert head.free_line == (
        "head: MemAvailable 117.00 GiB less 5.96 GiB measured to go while weights load less "
        "vLLM's 1.00 GiB margin = 110.04 GiB >= 103.88 GiB needed (vLLM 0.34.0 sizes the KV "
        "cache after warmup from this, capped at utilization x total, and fails at start when "
        "it cannot hold one MAX_MODEL_LEN sequence; no start-up gate)"
    )
    assert at_095.notes[0].startswith("memory rule: vLLM 0.34.0, the extensible KV cache")
    # The cap still bounds the KV cache: eugr's 0.85 at 1M is as short on 0.34; the fix stays within free memory.
    at_085 = gb10(0.85, version="0.34.0").findings[0]
    assert not at_085.fits and not at_085.share_fits and at_085.free_fits
    assert "raise GPU_MEMORY_UTILIZATION to 0.86 (the node's free memory allows up to 0.90)" in at_085.fix
    assert gb10(0.90, available=113.0, version="0.34.0").fits  # 0.32's gate refuses this one
    assert not gb10(0.90, available=113.0, version="0.32.0").fits


def test_on_034_free_memory_short_of_the_share_fails_after_warmup_and_utilization_cannot_fix_it():
    estimate = gb10(0.87, available=100.0, version="0.34.0")
    head, worker = estimate.findings
    assert not estimate.fits and head.share_fits and head.free_fits is False and worker.fits
    assert head.problem == (
        "head: MemAvailable 100.00 GiB less 5.96 GiB measured to go while weights load less "
        "vLLM's 1.00 GiB margin = 93.04 GiB < 103.88 GiB needed (vLLM 0.34.0 sizes the KV cache "
        "after warmup from this, capped at utilization x total, and fails at start when it cannot "
        "hold one MAX_MODEL_LEN sequence; no start-up gate)"
    )
    assert head.fix == (
        "free memory on head (other processes, page cache held by them) or lower MAX_MODEL_LEN to "
        "18432 or less (a higher GPU_MEMORY_UTILIZATION does not help: the node's free memory, not "
        "the cap, limits the KV cache here)"
    )
    assert gb10(0.87, available=100.0, version="0.34.0", tokens=18432).fits
    # Should vLLM find no virtual memory management on a node, 0.33's gate applies there: the note says where.
    fallback = next(n for n in estimate.notes if "Disabling the extensible KV cache" in n)
    assert "it would refuse here (head: MemAvailable 100.00 GiB" in fallback and "worker1" not in fallback
    # A flag that turns the extensible KV cache off gives the gate back.
    nodes = (NodeMemory("head", GB10, int(113 * GIB)),)
    off = estimate_memory(
        DEEPSEEK_V4_FLASH,
        "fp8",
        1048576,
        2,
        MEASURED,
        None,
        nodes,
        0.90,
        vllm_version="0.34.0",
        extensible_off="--num-gpu-blocks-override",
    )
    assert off.rule == START_GATE and off.findings[0].free_fits is False


def test_the_default_utilization_per_release_with_its_reason():
    default = next(d for d in DEEPSEEK_V4_FLASH.settings if d.setting == "GPU_MEMORY_UTILIZATION")
    gate, cap = default.for_release("0.33.0"), default.for_release("0.34.0")
    assert default.for_release("") == default == gate and gate.value == cap.value == 0.87
    assert "request_memory" in gate.why
    assert "measure_kv_cache_bytes" in cap.why and "_resolve_extensible_kv_cache" in cap.why
    # 0.32/0.33: the largest value whose gate a fresh headless node at 113 GiB passes, with 1M context.
    assert gb10(0.87, available=113.0, version="0.32.0").fits and not gb10(0.88, available=113.0, version="0.32.0").fits
    # 0.34: the largest cap below that node's free memory less the margin (the cap, not the host's memory, bounds
    # the KV cache), with 1M context.
    free_side = int(113 * GIB) - DIP - EXTENSIBLE_KV_MARGIN
    at_087, at_088 = (gb10(u, available=113.0, version="0.34.0").findings[0] for u in (0.87, 0.88))
    assert at_087.fits and at_087.budget_bytes <= free_side < at_088.budget_bytes


def test_the_resolution_gives_the_reason_of_the_installed_release(clean_environ):
    from dataclasses import replace

    from dspark_launch.config.profile_resolve import resolve
    from dspark_launch.config.settings import resolve as load_settings
    from dspark_launch.node.vllm_offer import VllmOffer
    from tests.support.paths import DATA, REPO

    settings = load_settings(env_file=str(REPO / ".env.dspark.example"), environ=clean_environ)
    offer = VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text())
    reasons = {}
    for version in ("0.32.0", "0.34.0"):
        resolved = resolve(DEEPSEEK_V4_FLASH, replace(offer, version=version), settings)
        assert resolved.gpu_memory_utilization == 0.87
        reasons[version] = next(d.reason for d in resolved.decisions if d.subject == "GPU_MEMORY_UTILIZATION")
    assert "request_memory" in reasons["0.32.0"] and "measure_kv_cache_bytes" not in reasons["0.32.0"]
    assert "measure_kv_cache_bytes" in reasons["0.34.0"]


def test_the_free_memory_gate_on_vllms_cpu_backend():
    # A node without an NVIDIA GPU runs vLLM's CPU backend: no gate once VLLM_CPU_KVCACHE_SPACE fixes the KV size
    # (the CPU testbed), the same gate as on a GPU without it (vllm/v1/worker/cpu_worker.py).
    cpu = (NodeMemory("head", 24 * GIB, 4 * GIB, nvidia_gpu=False),)
    fixed = estimate_memory(TINY_TEST, "auto", 256, 2, 1 << 20, None, cpu, 0.835, "VLLM_CPU_KVCACHE_SPACE")
    assert fixed.fits and fixed.findings[0].free_fits is None
    assert "VLLM_CPU_KVCACHE_SPACE" in fixed.findings[0].free_line
    unfixed = estimate_memory(TINY_TEST, "auto", 256, 2, 1 << 20, None, cpu, 0.835)
    assert not unfixed.fits and unfixed.findings[0].free_fits is False
    # 0.34 has no extensible KV cache on its CPU backend (config/vllm.py): the same rule there, no rule note.
    on_034 = estimate_memory(
        TINY_TEST, "auto", 256, 2, 1 << 20, None, cpu, 0.835, "VLLM_CPU_KVCACHE_SPACE", vllm_version="0.34.0"
    )
    assert on_034.fits and on_034.findings[0].rule == START_GATE and on_034.findings[0].free_fits is None
    assert not any(n.startswith("memory rule:") for n in on_034.notes)


def test_unplaced_weights_count_the_measured_figure_and_say_so():
    estimate = deepseek("fp8")
    assert estimate.weights_per_node == int(81.34 * GIB) and estimate.non_kv_bytes == int(11.5 * GIB)
    assert any("weights not placed on the head yet" in note for note in estimate.notes)


def test_unknown_weights_without_a_measurement_count_the_kv_only_and_say_so():
    estimate = estimate_memory(NONE, "auto", 256, 1, None, model_shape(TINY_CONFIG), SPARKS, 0.5)
    assert estimate.weights_per_node is None and estimate.fits
    assert any("weights size unknown" in note for note in estimate.notes)


def test_standard_attention_from_config_json_splits_over_tp():
    shape = model_shape(TINY_CONFIG)
    estimate = estimate_memory(NONE, "auto", 256, 2, 1 << 20, shape, SPARKS, 0.5)
    assert estimate.kv_per_node == 2 * (2 * 2 * 32 * 4) * 256 // 2  # layers x K+V x heads x dim x fp32, / TP
    assert estimate.weights_per_node == 1 << 19 and "config.json: 2 layers x 512 B per token / TP 2" == estimate.basis


def test_the_tiny_models_own_config_json_is_read(tmp_path, tiny_model):
    from dspark_launch.profiles.memory_model import read_model_shape

    shape = read_model_shape(tiny_model)
    assert shape is not None and shape.layers == 2 and not shape.row.mla
    assert read_model_shape(tmp_path) is None


def test_no_shape_no_anchor_counts_weights_only():
    estimate = estimate_memory(NONE, "auto", 256, 1, 10 * GIB, None, SPARKS, 0.5)
    assert estimate.kv_per_node is None and any("KV cache not counted" in n for n in estimate.notes)
    assert model_shape({"num_hidden_layers": "x"}) is None
