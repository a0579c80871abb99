"""Memory pre-flight from the profile: weights / TP plus the KV cache of one MAX_MODEL_LEN sequence, per node.

A GB10's GPU memory is the host's memory: an overrun freezes the host, so the
launcher refuses by default when a node's share exceeds memory x utilisation.
Pure: the weights' size, the model's config.json and each node's memory come in.

KV bytes per token: each attention layer stores one row per token, whose size in
bytes depends on the KV dtype (`row_bytes`). DeepSeek-V4 compresses most layers'
rows and keeps a sliding window, which no config field states plainly, so a profile
with a measured anchor (eugr: fp8_ds_mla, 1M tokens, 11.04 GiB per node) scales that
measurement by the row size of the chosen dtype instead of counting layers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from dspark_launch.profiles.model import KvRow, Profile

GIB = 1 << 30
_SIXTEEN_BIT = ("auto", "bfloat16", "float16")
_EIGHT_BIT = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")


@dataclass(frozen=True)
class ModelShape:
    """What the KV estimate needs from config.json."""

    layers: int
    row: KvRow
    dtype_bytes: int  # the model dtype: KV in "auto" is stored in it
    kv_heads: int = 0  # standard attention: heads split over TP ranks (0 for MLA: every rank keeps the row)


def model_shape(config: Mapping[str, object]) -> ModelShape | None:
    """The shape from a config.json's contents; None when it describes no attention this knows."""
    try:
        layers = int(config["num_hidden_layers"])
        dtype_bytes = 4 if (config.get("torch_dtype") or config.get("dtype")) == "float32" else 2
        rope = int(config.get("qk_rope_head_dim", 0))
        if "kv_lora_rank" in config:  # DeepSeek V2/V3 MLA: latent + rotary key
            return ModelShape(layers, KvRow(int(config["kv_lora_rank"]), rope), dtype_bytes)
        if "compress_ratios" in config:  # DeepSeek V4: one head_dim row with the rotary part inside
            return ModelShape(layers, KvRow(int(config["head_dim"]) - rope, rope), dtype_bytes)
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        return ModelShape(layers, KvRow(2 * kv_heads * head_dim, 0, mla=False), dtype_bytes, kv_heads)
    except (KeyError, TypeError, ValueError):
        return None


def read_model_shape(folder: Path) -> ModelShape | None:
    """The shape from `folder/config.json` (the model's local snapshot), None when absent or unreadable."""
    try:
        return model_shape(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError):
        return None


def row_bytes(row: KvRow, kv_cache_dtype: str, dtype_bytes: int = 2) -> int | None:
    """Bytes one token's row takes in one layer; None for a dtype this does not model."""
    width = row.nope_dim + row.rope_dim
    if kv_cache_dtype in _SIXTEEN_BIT:
        return width * dtype_bytes
    if kv_cache_dtype in _EIGHT_BIT:
        return width
    if row.mla and kv_cache_dtype == "fp8_ds_mla":  # fp8 latent, bf16 rotary, fp32 scale per 128 (656 B on V3.2)
        return row.nope_dim + 2 * row.rope_dim + 4 * math.ceil(row.nope_dim / 128)
    if row.mla and kv_cache_dtype == "nvfp4_ds_mla":  # fp4 latent, a scale per 16, 8-bit rotary (352 B on V3.2)
        return row.nope_dim // 2 + row.nope_dim // 16 + row.rope_dim
    return None


@dataclass(frozen=True)
class NodeMemory:
    node: str
    total_bytes: int  # MemTotal: a GB10's GPU memory is the host's


@dataclass(frozen=True)
class MemoryFinding:
    node: str
    need_bytes: int
    budget_bytes: int
    fits: bool
    line: str


@dataclass(frozen=True)
class MemoryEstimate:
    weights_per_node: int | None
    kv_per_node: int | None
    kv_cache_dtype: str
    context_tokens: int
    basis: str  # how the KV number was made
    findings: tuple[MemoryFinding, ...]
    notes: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return all(f.fits for f in self.findings)


def _kv_per_node(profile: Profile, shape: ModelShape | None, dtype: str, tokens: int, tp: int
                 ) -> tuple[int | None, str]:
    anchor, row = profile.kv_anchor, (shape.row if shape else profile.kv_row)
    if anchor is not None and row is not None:
        mine, measured = row_bytes(row, dtype), row_bytes(row, anchor.kv_cache_dtype)
        if mine is None or measured is None:
            return None, f"no byte model for kv-cache-dtype {dtype}"
        per_token = anchor.bytes_per_node / anchor.context_tokens * mine / measured
        basis = (f"{anchor.bytes_per_node / GIB:.2f} GiB for {anchor.context_tokens} tokens in "
                 f"{anchor.kv_cache_dtype} ({anchor.source}), x {mine}/{measured} B per row for {dtype}")
        if shape is not None:
            factor = anchor.bytes_per_node / anchor.context_tokens / (shape.layers * measured)
            basis += f"; {factor:.3f} of {shape.layers} full layers (compression and window)"
        return round(per_token * tokens), basis
    if shape is None:
        return None, "no config.json at hand and no recorded KV shape"
    per_layer = row_bytes(shape.row, dtype, shape.dtype_bytes)
    if per_layer is None:
        return None, f"no byte model for kv-cache-dtype {dtype} on this attention"
    split = tp if not shape.row.mla and shape.kv_heads % tp == 0 else 1
    return (shape.layers * per_layer * tokens) // split, \
        f"config.json: {shape.layers} layers x {per_layer} B per token{f' / TP {split}' if split > 1 else ''}"


def memory_preflight(profile: Profile, kv_cache_dtype: str, context_tokens: int, tp: int, weights_bytes: int | None,
                     shape: ModelShape | None, nodes: tuple[NodeMemory, ...], utilization: float) -> MemoryEstimate:
    """Per node: weights / TP + KV for one `context_tokens` sequence, against memory x utilisation."""
    weights = None if weights_bytes is None else weights_bytes // tp
    kv, basis = _kv_per_node(profile, shape, kv_cache_dtype, context_tokens, tp)
    notes = ["vLLM also needs activations and CUDA graphs beyond this: a fit by a few GiB is not safe"]
    if weights is None:
        notes.append("weights size unknown (never placed on the head: `dspark model pull`): weights not counted")
    if kv is None:
        notes.append(f"KV cache not counted: {basis}")
    need = (weights or 0) + (kv or 0)
    findings = []
    for node in nodes:
        budget = int(node.total_bytes * utilization)
        parts = [f"weights {weights / GIB:.1f} GiB" if weights is not None else "",
                 f"KV {kv / GIB:.2f} GiB for {context_tokens} tokens in {kv_cache_dtype}" if kv is not None else ""]
        verb = "fits" if need <= budget else "does not fit"
        findings.append(MemoryFinding(node.node, need, budget, need <= budget,
                                      f"{node.node}: {need / GIB:.1f} GiB ({', '.join(p for p in parts if p)}) "
                                      f"{verb} in {node.total_bytes / GIB:.1f} GiB x GPU_MEMORY_UTILIZATION "
                                      f"{utilization} = {budget / GIB:.1f} GiB"))
    return MemoryEstimate(weights, kv, kv_cache_dtype, context_tokens, basis, tuple(findings), tuple(notes))
