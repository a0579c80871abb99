"""Memory pre-flight from the profile: weights / TP + measured overhead + KV at MAX_MODEL_LEN in the chosen KV
dtype against memory x utilisation, and MemAvailable against vLLM's start-up gate."""

from __future__ import annotations

import pytest

from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH, DEEPSEEK_V4_ROW, NONE
from dspark_test_profiles import TINY_TEST
from dspark_launch.profiles.memory_model import GIB, NodeMemory, estimate_memory, model_shape, row_bytes
from dspark_launch.profiles.model import KvRow

SPARKS = (NodeMemory("head", 128 * GIB), NodeMemory("worker1", 128 * GIB))
V4_CONFIG = {"model_type": "deepseek_v4", "num_hidden_layers": 43, "head_dim": 512, "qk_rope_head_dim": 64,
             "compress_ratios": [0, 4, 128], "torch_dtype": "bfloat16"}
TINY_CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32,
               "hidden_size": 64, "torch_dtype": "float32"}


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
    assert worker.line == ("worker1: 103.9 GiB (weights 81.3 GiB, non-KV 11.50 GiB, KV 11.04 GiB for 1048576 tokens "
                           "in fp8_ds_mla) does not fit in 112.0 GiB x GPU_MEMORY_UTILIZATION 0.835 = 93.5 GiB")
    assert worker.fix.startswith("lower MAX_MODEL_LEN to 64512 or less; raise GPU_MEMORY_UTILIZATION to 0.93")


# eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml, two GB10s, TP 2: a 121.69 GiB node, 81.34 GiB of
# weights each, ~117 GiB MemAvailable idle, 111.04 GiB read by vLLM's gate while weights load.
GB10 = int(121.69 * GIB)
MEASURED = int(2 * 81.34 * GIB)


def gb10(utilization: float, available: float = 117.0, dtype: str = "fp8", tokens: int = 1048576):
    nodes = (NodeMemory("head", GB10, int(available * GIB)), NodeMemory("worker1", GB10, int(117.0 * GIB)))
    return estimate_memory(DEEPSEEK_V4_FLASH, dtype, tokens, 2, MEASURED, None, nodes, utilization)


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
    assert head.problem == ("head: MemAvailable 100.00 GiB less 5.96 GiB measured to go while weights load < "
                            "121.69 GiB x GPU_MEMORY_UTILIZATION 0.9 = 109.52 GiB (vLLM refuses to start when free "
                            "memory is below utilization x total)")
    assert head.fix == ("free memory on head (other processes, page cache held by them) or lower "
                        "GPU_MEMORY_UTILIZATION to 0.77 or less")


def test_the_free_memory_gate_on_vllms_cpu_backend():
    # A node without an NVIDIA GPU runs vLLM's CPU backend: no gate once VLLM_CPU_KVCACHE_SPACE fixes the KV size
    # (the CPU testbed), the same gate as on a GPU without it (vllm/v1/worker/cpu_worker.py).
    cpu = (NodeMemory("head", 24 * GIB, 4 * GIB, nvidia_gpu=False),)
    fixed = estimate_memory(TINY_TEST, "auto", 256, 2, 1 << 20, None, cpu, 0.835, "VLLM_CPU_KVCACHE_SPACE")
    assert fixed.fits and fixed.findings[0].free_fits is None
    assert "VLLM_CPU_KVCACHE_SPACE" in fixed.findings[0].free_line
    unfixed = estimate_memory(TINY_TEST, "auto", 256, 2, 1 << 20, None, cpu, 0.835)
    assert not unfixed.fits and unfixed.findings[0].free_fits is False


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
