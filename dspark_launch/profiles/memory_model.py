"""The memory model of a profile (`estimate_memory`), per node: weights / TP, the measured non-KV overhead and the KV
cache of one MAX_MODEL_LEN sequence against memory x utilisation; and vLLM's own start-up gate, free
memory >= utilisation x total, against the node's MemAvailable.

A GB10's GPU memory is the host's memory: an overrun freezes the host, so the
launcher refuses by default. Pure: the weights' size, the model's config.json and
each node's memory come in.

vLLM 0.32 on an integrated GPU (GB10) reads free memory as psutil's `available`, i.e.
MemAvailable (utils/mem_utils.py MemorySnapshot.measure), and refuses to start when it
is below utilisation x total (v1/worker/utils.py request_memory). Its CPU backend does
the same unless the KV size is fixed (VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes:
v1/worker/cpu_worker.py), which is how the CPU testbed runs.

KV bytes per token: each attention layer stores one row per token, whose size in
bytes depends on the KV dtype (`row_bytes`). DeepSeek-V4 compresses most layers'
rows and keeps a sliding window, which no config field states plainly, so a profile
with a measured anchor (eugr: fp8_ds_mla, 1M tokens, 11.04 GiB per node) scales that
measurement by the row size of the chosen dtype instead of counting layers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from dspark_launch.profiles.catalog import DEEPSEEK_V4_ROW
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
            return ModelShape(layers, replace(DEEPSEEK_V4_ROW, nope_dim=int(config["head_dim"]) - rope, rope_dim=rope),
                              dtype_bytes)
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
    if kv_cache_dtype in _EIGHT_BIT and not row.fp8_is_ds_mla:
        return width
    if row.mla and (kv_cache_dtype == "fp8_ds_mla" or kv_cache_dtype in _EIGHT_BIT):
        # fp8 latent, bf16 rotary, the latent's scales: 656 B on V3.2 (fp32 per 128), 584 B on V4 (ue8m0 per 64 + pad)
        scales = math.ceil(row.nope_dim / row.scale_block) * row.scale_bytes
        return row.nope_dim + 2 * row.rope_dim + math.ceil(scales / row.scale_align) * row.scale_align
    if row.mla and kv_cache_dtype == "nvfp4_ds_mla":  # fp4 latent, a scale per 16, 8-bit rotary (352 B on V3.2)
        return row.nope_dim // 2 + row.nope_dim // 16 + row.rope_dim
    return None


@dataclass(frozen=True)
class NodeMemory:
    node: str
    total_bytes: int  # MemTotal: a GB10's GPU memory is the host's
    available_bytes: int | None = None  # MemAvailable now; None: not known
    nvidia_gpu: bool = True  # False: vLLM runs its CPU backend there


@dataclass(frozen=True)
class MemoryFinding:
    node: str
    need_bytes: int
    budget_bytes: int
    fits: bool  # the share fits the budget and (where checked) the free memory passes vLLM's start-up gate
    line: str  # the share against the budget
    free_line: str = ""  # MemAvailable against vLLM's start-up gate; "" when not checked
    fix: str = ""  # the settings that make it fit, with values ("" when it fits)
    share_fits: bool = True
    free_fits: bool | None = None  # None: not checked (unknown, or vLLM's CPU backend with a fixed KV size)

    @property
    def problem(self) -> str:
        """What does not fit: the share, the free-memory gate, or both ("" when it fits)."""
        return "; ".join([self.line] * (not self.share_fits) + [self.free_line] * (self.free_fits is False))


@dataclass(frozen=True)
class MemoryEstimate:
    weights_per_node: int | None
    kv_per_node: int | None
    kv_cache_dtype: str
    context_tokens: int
    basis: str  # how the KV number was made
    findings: tuple[MemoryFinding, ...]
    notes: tuple[str, ...]
    non_kv_bytes: int = 0  # the profile's measured overhead beside weights and KV

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


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


@dataclass(frozen=True)
class _Sizes:
    weights: int | None
    overhead: int
    kv: int | None
    tokens: int
    utilization: float
    dip: int  # the free memory measured to go while weights load (profile's figure)


def _share_fix(sizes: _Sizes, node: NodeMemory, need: int, budget: int) -> str:
    """The two settings that fix a share that does not fit, with the values that would."""
    fixes = []
    if sizes.kv:
        room = budget - (sizes.weights or 0) - sizes.overhead
        longest = int(room / (sizes.kv / sizes.tokens)) // 1024 * 1024 if room > 0 else 0
        fixes.append(f"lower MAX_MODEL_LEN to {longest} or less" if longest > 0
                     else "MAX_MODEL_LEN cannot fix it (weights and overhead alone exceed the budget)")
    wanted = math.ceil(need / node.total_bytes * 100) / 100
    if node.available_bytes is None:
        fixes.append(f"raise GPU_MEMORY_UTILIZATION to {wanted:.2f} (if the node's free memory allows it)")
    else:
        ceiling = math.floor((node.available_bytes - sizes.dip) / node.total_bytes * 100) / 100
        fixes.append(f"raise GPU_MEMORY_UTILIZATION to {wanted:.2f} (the node's free memory allows up to {ceiling:.2f})"
                     if wanted <= ceiling else
                     f"GPU_MEMORY_UTILIZATION cannot fix it here ({wanted:.2f} needed, the node's free memory "
                     f"allows up to {ceiling:.2f})")
    return "; ".join(fixes)


def _free_check(sizes: _Sizes, node: NodeMemory, budget: int, kv_size_fixed: str) -> tuple[bool | None, str, str]:
    """vLLM's start-up gate on this node: (passes, line, fix); (None, why not checked, "")."""
    if node.available_bytes is None:
        return None, "", ""
    if not node.nvidia_gpu and kv_size_fixed:
        return None, (f"{node.node}: no NVIDIA GPU: vLLM's CPU backend with a KV size fixed by {kv_size_fixed} "
                      "has no free-memory gate"), ""
    usable = node.available_bytes - sizes.dip
    dip = f" less {_gib(sizes.dip)} measured to go while weights load" if sizes.dip else ""
    ok = usable >= budget
    line = (f"{node.node}: MemAvailable {_gib(node.available_bytes)}{dip} "
            f"{'>=' if ok else '<'} {node.total_bytes / GIB:.2f} GiB x GPU_MEMORY_UTILIZATION {sizes.utilization} "
            f"= {_gib(budget)} (vLLM refuses to start when free memory is below utilization x total)")
    if ok:
        return True, line, ""
    ceiling = math.floor(usable / node.total_bytes * 100) / 100
    return False, line, (f"free memory on {node.node} (other processes, page cache held by them) or lower "
                         f"GPU_MEMORY_UTILIZATION to {ceiling:.2f} or less")


def estimate_memory(profile: Profile, kv_cache_dtype: str, context_tokens: int, tp: int, weights_bytes: int | None,
                    shape: ModelShape | None, nodes: tuple[NodeMemory, ...], utilization: float,
                    kv_size_fixed: str = "") -> MemoryEstimate:
    """Per node: weights / TP + the profile's measured non-KV overhead + KV for one `context_tokens` sequence,
    against memory x utilisation; and MemAvailable against vLLM's start-up gate. `kv_size_fixed`: what fixes
    the KV size on vLLM's CPU backend (its free-memory gate is off then), "" when nothing does."""
    measured = profile.measured_memory
    notes = []
    weights = None if weights_bytes is None else weights_bytes // tp
    if measured is not None:
        notes.append(f"measured per node: weights {_gib(measured.weights_per_node)}, non-KV overhead "
                     f"{_gib(measured.non_kv_bytes)} (activations, non-torch memory, CUDA graphs, draft/indexer "
                     f"scratch), free memory drop while weights load {_gib(measured.startup_free_dip)} "
                     f"({measured.source})")
    if weights is None and measured is not None:
        weights = measured.weights_per_node
        notes.append(f"weights not placed on the head yet: the measured {_gib(weights)} per node counted")
    elif weights is not None and measured is not None and weights < measured.weights_per_node:
        # File size / TP ignores the tensors every rank holds in full (embeddings, norms, the MTP head ...).
        notes.append(f"weights {_gib(weights)} per node by file size / TP {tp} is below the {_gib(measured.weights_per_node)} "
                     f"measured per node (tensors every rank holds in full): the measured figure counted")
        weights = measured.weights_per_node
    elif weights is None:
        notes.append("weights size unknown (never placed on the head: `dspark model pull`): weights not counted")
    kv, basis = _kv_per_node(profile, shape, kv_cache_dtype, context_tokens, tp)
    overhead = measured.non_kv_bytes if measured else 0
    if measured is None:
        notes.append("vLLM also needs activations and CUDA graphs beyond this: a fit by a few GiB is not safe")
    if kv is None:
        notes.append(f"KV cache not counted: {basis}")
    sizes = _Sizes(weights, overhead, kv, context_tokens, utilization, measured.startup_free_dip if measured else 0)
    need = (weights or 0) + overhead + (kv or 0)
    findings = []
    for node in nodes:
        budget = int(node.total_bytes * utilization)
        parts = [f"weights {weights / GIB:.1f} GiB" if weights is not None else "",
                 f"non-KV {_gib(overhead)}" if overhead else "",
                 f"KV {kv / GIB:.2f} GiB for {context_tokens} tokens in {kv_cache_dtype}" if kv is not None else ""]
        share_fits = need <= budget
        line = (f"{node.node}: {need / GIB:.1f} GiB ({', '.join(p for p in parts if p)}) "
                f"{'fits' if share_fits else 'does not fit'} in {node.total_bytes / GIB:.1f} GiB x "
                f"GPU_MEMORY_UTILIZATION {utilization} = {budget / GIB:.1f} GiB")
        free_fits, free_line, free_fix = _free_check(sizes, node, budget, kv_size_fixed)
        fix = "" if share_fits else _share_fix(sizes, node, need, budget)
        fix = "; ".join(f for f in (fix, free_fix) if f)
        findings.append(MemoryFinding(node.node, need, budget, share_fits and free_fits is not False, line,
                                      free_line, fix, share_fits, free_fits))
    return MemoryEstimate(weights, kv, kv_cache_dtype, context_tokens, basis, tuple(findings), tuple(notes),
                          overhead)
