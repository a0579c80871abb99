"""Memory pre-flight from the profile: weights / TP + KV at MAX_MODEL_LEN with the chosen KV dtype."""

from __future__ import annotations

import pytest

from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH, NONE
from dspark_launch.profiles.memory import GIB, NodeMemory, memory_preflight, model_shape, row_bytes
from dspark_launch.profiles.model import KvRow

SPARKS = (NodeMemory("head", 128 * GIB), NodeMemory("worker1", 128 * GIB))
V4_CONFIG = {"model_type": "deepseek_v4", "num_hidden_layers": 43, "head_dim": 512, "qk_rope_head_dim": 64,
             "compress_ratios": [0, 4, 128], "torch_dtype": "bfloat16"}
TINY_CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32,
               "hidden_size": 64, "torch_dtype": "float32"}


def deepseek(dtype: str, tokens: int = 1048576, weights: int | None = None, shape=None, nodes=SPARKS):
    return memory_preflight(DEEPSEEK_V4_FLASH, dtype, tokens, 2, weights, shape, nodes, 0.835)


def test_row_bytes_match_vllms_deepseek_v32_layouts():
    row = KvRow(512, 64)  # kv_lora_rank 512, rope 64: vLLM's 656 B fp8_ds_mla, 352 B nvfp4_ds_mla rows
    assert row_bytes(row, "fp8_ds_mla") == 656 and row_bytes(row, "nvfp4_ds_mla") == 352
    assert row_bytes(KvRow(128, 0, mla=False), "nvfp4_ds_mla") is None


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
    assert shape.row == KvRow(448, 64)
    estimate = deepseek("fp8_ds_mla", shape=shape)
    assert abs(estimate.kv_per_node - 11.04 * GIB) < 1024 and "of 43 full layers" in estimate.basis


def test_refuses_with_the_numbers_when_a_node_cannot_hold_its_share():
    small = (NodeMemory("head", 128 * GIB), NodeMemory("worker1", 96 * GIB))
    estimate = deepseek("fp8_ds_mla", weights=160 * GIB, nodes=small)
    head, worker = estimate.findings
    assert head.fits and not worker.fits and not estimate.fits
    assert worker.line == ("worker1: 91.0 GiB (weights 80.0 GiB, KV 11.04 GiB for 1048576 tokens in fp8_ds_mla) "
                           "does not fit in 96.0 GiB x GPU_MEMORY_UTILIZATION 0.835 = 80.2 GiB")


def test_unknown_weights_count_the_kv_only_and_say_so():
    estimate = deepseek("nvfp4_ds_mla")
    assert estimate.weights_per_node is None and estimate.fits
    assert any("weights size unknown" in note for note in estimate.notes)


def test_standard_attention_from_config_json_splits_over_tp():
    shape = model_shape(TINY_CONFIG)
    estimate = memory_preflight(NONE, "auto", 256, 2, 1 << 20, shape, SPARKS, 0.5)
    assert estimate.kv_per_node == 2 * (2 * 2 * 32 * 4) * 256 // 2  # layers x K+V x heads x dim x fp32, / TP
    assert estimate.weights_per_node == 1 << 19 and "config.json: 2 layers x 512 B per token / TP 2" == estimate.basis


def test_the_tiny_models_own_config_json_is_read(tmp_path):
    from dspark_launch.profiles.memory import read_model_shape
    from tests.support.tiny_model import build_tiny_model

    shape = read_model_shape(build_tiny_model(tmp_path / "tiny"))
    assert shape is not None and shape.layers == 2 and not shape.row.mla
    assert read_model_shape(tmp_path) is None


def test_no_shape_no_anchor_counts_weights_only():
    estimate = memory_preflight(NONE, "auto", 256, 1, 10 * GIB, None, SPARKS, 0.5)
    assert estimate.kv_per_node is None and any("KV cache not counted" in n for n in estimate.notes)
    assert model_shape({"num_hidden_layers": "x"}) is None
