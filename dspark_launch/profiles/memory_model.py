"""The memory model of a profile (`estimate_memory`), per node: weights / TP, the measured non-KV overhead and the KV
cache of one MAX_MODEL_LEN sequence against memory x utilisation; and the free-memory rule of the installed vLLM
release (`memory_rule`) against the node's MemAvailable.

A GB10's GPU memory is the host's memory: an overrun freezes the host, so the
launcher refuses by default. Pure: the weights' size, the model's config.json, the
installed vLLM's version and each node's memory come in.

On an integrated GPU (GB10) vLLM reads free memory as psutil's `available`, i.e. MemAvailable
(utils/mem_utils.py: MemorySnapshot.measure in 0.32, device_memory_info in 0.34). What it does with it
depends on the release:

- 0.32 and 0.33, the start-up gate: vLLM refuses to start when free memory is below utilisation x total
  (v1/worker/utils.py request_memory), and the KV cache is the budget left after the profiled non-KV
  memory (v1/worker/gpu_worker.py determine_available_memory).
- 0.34, the extensible KV cache, on by default on CUDA (config/vllm.py VllmConfig._resolve_extensible_kv_cache;
  off on other platforms and with --kv-cache-memory-bytes, --num-gpu-blocks-override or
  --no-enable-extensible-kv-cache): request_memory skips the refusal; after warmup and CUDA-graph capture
  the KV cache gets min(utilisation x total, free memory at start less a margin of at least 1 GiB) less
  what the engine then uses (v1/worker/extensible_kv_cache.py measure_kv_cache_bytes), and start fails
  when that cannot hold one MAX_MODEL_LEN sequence (v1/core/kv_cache_planning.py shrink_kv_cache_configs).
  Utilisation is a cap, no longer a gate. Should a node's driver lack virtual memory management, vLLM
  turns the extensible cache off there (v1/engine/core.py, executor.disable_extensible_kv_cache) and the
  start-up gate applies again (v1/worker/gpu_worker.py _resolve_requested_memory -> request_memory).

vLLM's CPU backend has the start-up gate on every release unless the KV size is fixed (VLLM_CPU_KVCACHE_SPACE
or --kv-cache-memory-bytes: v1/worker/cpu_worker.py), which is how the CPU testbed runs.

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

from dspark_launch.node.vllm_releases import release_key
from dspark_launch.profiles.catalog import DEEPSEEK_V4_ROW
from dspark_launch.profiles.model import KvRow, Profile

GIB = 1 << 30
#: The first release whose default on CUDA is the extensible KV cache (vLLM 0.34.0 config/cache.py
#: CacheConfig.enable_extensible_kv_cache, settled by config/vllm.py VllmConfig._resolve_extensible_kv_cache).
EXTENSIBLE_KV_FROM = (0, 34, 0)
#: What vLLM 0.34 keeps free of the free memory it sizes the KV cache from: max(this, 0.75 x the transient peak
#: warmup measured) (v1/worker/extensible_kv_cache.py KV_CACHE_MARGIN_FLOOR_BYTES on CUDA, KV_CACHE_MARGIN_FRACTION).
EXTENSIBLE_KV_MARGIN = 1 << 30
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
            return ModelShape(
                layers, replace(DEEPSEEK_V4_ROW, nope_dim=int(config["head_dim"]) - rope, rope_dim=rope), dtype_bytes
            )
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


START_GATE = "start-up gate"
EXTENSIBLE_KV = "extensible KV cache"


@dataclass(frozen=True)
class MemoryRule:
    """What the installed vLLM does with a GPU node's free memory at start (see the module docstring)."""

    name: str  # START_GATE or EXTENSIBLE_KV
    vllm_version: str  # as the head reported it; "" when not known
    why: str  # one line: the release, the rule, vLLM's code that makes it

    @property
    def extensible(self) -> bool:
        return self.name == EXTENSIBLE_KV


def memory_rule(vllm_version: str, extensible_off: str = "") -> MemoryRule:
    """The rule of vLLM `vllm_version` on a CUDA node; `extensible_off`: what in the serve arguments turns 0.34's
    extensible KV cache off ("" when nothing does). An unknown version gets the start-up gate."""
    key = release_key(vllm_version)
    gate = (
        "free memory at start must reach utilization x total or vLLM refuses to start (v1/worker/utils.py "
        "request_memory); the KV cache gets the budget left after the profiled non-KV memory "
        "(v1/worker/gpu_worker.py determine_available_memory)"
    )
    if key is None:
        return MemoryRule(
            START_GATE, vllm_version, f"vLLM release not known: the start-up gate of 0.32/0.33 assumed: {gate}"
        )
    if key < EXTENSIBLE_KV_FROM:
        return MemoryRule(START_GATE, vllm_version, f"vLLM {vllm_version}, the start-up gate: {gate}")
    if extensible_off:
        return MemoryRule(
            START_GATE,
            vllm_version,
            f"vLLM {vllm_version} with {extensible_off}: the extensible KV cache is off "
            f"(config/vllm.py VllmConfig._resolve_extensible_kv_cache), so the start-up gate: {gate}",
        )
    return MemoryRule(
        EXTENSIBLE_KV,
        vllm_version,
        f"vLLM {vllm_version}, the extensible KV cache (on by default on CUDA: config/vllm.py "
        "VllmConfig._resolve_extensible_kv_cache): no start-up gate (v1/worker/utils.py request_memory "
        "skips it); after warmup the KV cache gets min(utilization x total, free memory at start less "
        f"a margin of at least {_gib(EXTENSIBLE_KV_MARGIN)}) less what the engine uses "
        "(v1/worker/extensible_kv_cache.py measure_kv_cache_bytes), and start fails when that cannot "
        "hold one MAX_MODEL_LEN sequence (v1/core/kv_cache_planning.py shrink_kv_cache_configs)",
    )


@dataclass(frozen=True, kw_only=True)
class MemoryFinding:
    node: str
    need_bytes: int
    budget_bytes: int
    fits: bool  # the share fits the budget and (where checked) the free memory passes vLLM's start-up gate
    line: str  # the share against the budget
    free_line: str = ""  # MemAvailable against the release's free-memory rule (`rule`); "" when not checked
    fix: str = ""  # the settings that make it fit, with values ("" when it fits)
    share_fits: bool = True
    free_fits: bool | None = None  # None: not checked (unknown, or vLLM's CPU backend with a fixed KV size)
    rule: str = START_GATE  # the free-memory rule checked on this node: START_GATE or EXTENSIBLE_KV

    @property
    def problem(self) -> str:
        """What does not fit: the share, the free-memory rule, or both ("" when it fits)."""
        return "; ".join([self.line] * (not self.share_fits) + [self.free_line] * (self.free_fits is False))


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    weights_per_node: int | None
    kv_per_node: int | None
    kv_cache_dtype: str
    context_tokens: int
    basis: str  # how the KV number was made
    findings: tuple[MemoryFinding, ...]
    notes: tuple[str, ...]
    non_kv_bytes: int = 0  # the profile's measured overhead beside weights and KV
    rule: str = START_GATE  # the installed vLLM's rule on its GPU nodes (`memory_rule`): START_GATE or EXTENSIBLE_KV

    @property
    def fits(self) -> bool:
        return all(f.fits for f in self.findings)


def _kv_per_node(
    profile: Profile, shape: ModelShape | None, dtype: str, tokens: int, tp: int
) -> tuple[int | None, str]:
    anchor, row = profile.kv_anchor, (shape.row if shape else profile.kv_row)
    if anchor is not None and row is not None:
        mine, measured = row_bytes(row, dtype), row_bytes(row, anchor.kv_cache_dtype)
        if mine is None or measured is None:
            return None, f"no byte model for kv-cache-dtype {dtype}"
        per_token = anchor.bytes_per_node / anchor.context_tokens * mine / measured
        basis = (
            f"{anchor.bytes_per_node / GIB:.2f} GiB for {anchor.context_tokens} tokens in "
            f"{anchor.kv_cache_dtype} ({anchor.source}), x {mine}/{measured} B per row for {dtype}"
        )
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
    return (
        shape.layers * per_layer * tokens
    ) // split, f"config.json: {shape.layers} layers x {per_layer} B per token{f' / TP {split}' if split > 1 else ''}"


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


def _longest(sizes: _Sizes, room: int) -> str:
    """The MAX_MODEL_LEN fix for `room` bytes left for the KV cache ("" without a KV size)."""
    if not sizes.kv:
        return ""
    longest = int(room / (sizes.kv / sizes.tokens)) // 1024 * 1024 if room > 0 else 0
    return (
        f"lower MAX_MODEL_LEN to {longest} or less"
        if longest > 0
        else "MAX_MODEL_LEN cannot fix it (weights and overhead alone exceed the budget)"
    )


def _share_fix(sizes: _Sizes, node: NodeMemory, need: int, budget: int, reserve: int = 0) -> str:
    """The two settings that fix a share that does not fit, with the values that would. `reserve`: what the release
    keeps free of the node's free memory beside the share (0.34's margin), which bounds a higher utilization."""
    fixes = [_longest(sizes, budget - (sizes.weights or 0) - sizes.overhead)]
    wanted = math.ceil(need / node.total_bytes * 100) / 100
    if node.available_bytes is None:
        fixes.append(f"raise GPU_MEMORY_UTILIZATION to {wanted:.2f} (if the node's free memory allows it)")
    else:
        ceiling = math.floor((node.available_bytes - sizes.dip - reserve) / node.total_bytes * 100) / 100
        fixes.append(
            f"raise GPU_MEMORY_UTILIZATION to {wanted:.2f} (the node's free memory allows up to {ceiling:.2f})"
            if wanted <= ceiling
            else f"GPU_MEMORY_UTILIZATION cannot fix it here ({wanted:.2f} needed, the node's free memory "
            f"allows up to {ceiling:.2f})"
        )
    return "; ".join(f for f in fixes if f)


def _dip_clause(sizes: _Sizes) -> str:
    return f" less {_gib(sizes.dip)} measured to go while weights load" if sizes.dip else ""


def _free_check(sizes: _Sizes, node: NodeMemory, budget: int, kv_size_fixed: str) -> tuple[bool | None, str, str]:
    """The start-up gate (0.32, 0.33) on this node: (passes, line, fix); (None, why not checked, "")."""
    if node.available_bytes is None:
        return None, "", ""
    if not node.nvidia_gpu and kv_size_fixed:
        return (
            None,
            (
                f"{node.node}: no NVIDIA GPU: vLLM's CPU backend with a KV size fixed by {kv_size_fixed} "
                "has no free-memory gate"
            ),
            "",
        )
    usable = node.available_bytes - sizes.dip
    ok = usable >= budget
    line = (
        f"{node.node}: MemAvailable {_gib(node.available_bytes)}{_dip_clause(sizes)} "
        f"{'>=' if ok else '<'} {node.total_bytes / GIB:.2f} GiB x GPU_MEMORY_UTILIZATION {sizes.utilization} "
        f"= {_gib(budget)} (vLLM refuses to start when free memory is below utilization x total)"
    )
    if ok:
        return True, line, ""
    ceiling = math.floor(usable / node.total_bytes * 100) / 100
    return (
        False,
        line,
        (
            f"free memory on {node.node} (other processes, page cache held by them) or lower "
            f"GPU_MEMORY_UTILIZATION to {ceiling:.2f} or less"
        ),
    )


def _after_warmup_check(sizes: _Sizes, node: NodeMemory, need: int, rule: MemoryRule) -> tuple[bool | None, str, str]:
    """The extensible KV cache (0.34) on this node: the free side of its sizing must hold the share too, or the KV
    cache after warmup is short of one MAX_MODEL_LEN sequence: (passes, line, fix); (None, "", "") when unknown."""
    if node.available_bytes is None:
        return None, "", ""
    usable = node.available_bytes - sizes.dip - EXTENSIBLE_KV_MARGIN
    ok = usable >= need
    line = (
        f"{node.node}: MemAvailable {_gib(node.available_bytes)}{_dip_clause(sizes)} less vLLM's "
        f"{_gib(EXTENSIBLE_KV_MARGIN)} margin = {_gib(usable)} {'>=' if ok else '<'} {_gib(need)} needed "
        f"(vLLM {rule.vllm_version} sizes the KV cache after warmup from this, capped at utilization x total, and "
        "fails at start when it cannot hold one MAX_MODEL_LEN sequence; no start-up gate)"
    )
    if ok:
        return True, line, ""
    fixes = [
        f"free memory on {node.node} (other processes, page cache held by them)",
        _longest(sizes, usable - (sizes.weights or 0) - sizes.overhead),
    ]
    return (
        False,
        line,
        (
            " or ".join(f for f in fixes if f) + " (a higher GPU_MEMORY_UTILIZATION does not help: "
            "the node's free memory, not the cap, limits the KV cache here)"
        ),
    )


def estimate_memory(
    profile: Profile,
    kv_cache_dtype: str,
    context_tokens: int,
    tp: int,
    weights_bytes: int | None,
    shape: ModelShape | None,
    nodes: tuple[NodeMemory, ...],
    utilization: float,
    kv_size_fixed: str = "",
    vllm_version: str = "",
    extensible_off: str = "",
) -> MemoryEstimate:
    """Per node: weights / TP + the profile's measured non-KV overhead + KV for one `context_tokens` sequence,
    against memory x utilisation; and MemAvailable against the free-memory rule of vLLM `vllm_version`
    (`memory_rule`; "" when not known: the start-up gate). `kv_size_fixed`: what fixes the KV size on vLLM's CPU
    backend (its free-memory gate is off then), "" when nothing does; `extensible_off`: what in the serve
    arguments turns 0.34's extensible KV cache off, "" when nothing does."""
    measured = profile.measured_memory
    rule = memory_rule(vllm_version, extensible_off)
    gpus = [node for node in nodes if node.nvidia_gpu]
    notes = [f"memory rule: {rule.why}"] if gpus or not nodes else []
    weights = None if weights_bytes is None else weights_bytes // tp
    if measured is not None:
        notes.append(
            f"measured per node: weights {_gib(measured.weights_per_node)}, non-KV overhead "
            f"{_gib(measured.non_kv_bytes)} (activations, non-torch memory, CUDA graphs, draft/indexer "
            f"scratch), free memory drop while weights load {_gib(measured.startup_free_dip)} "
            f"({measured.source})"
        )
    if weights is None and measured is not None:
        weights = measured.weights_per_node
        notes.append(f"weights not placed on the head yet: the measured {_gib(weights)} per node counted")
    elif weights is not None and measured is not None and weights < measured.weights_per_node:
        # File size / TP ignores the tensors every rank holds in full (embeddings, norms, the MTP head ...).
        notes.append(
            f"weights {_gib(weights)} per node by file size / TP {tp} is below the {_gib(measured.weights_per_node)} "
            f"measured per node (tensors every rank holds in full): the measured figure counted"
        )
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
        parts = [
            f"weights {weights / GIB:.1f} GiB" if weights is not None else "",
            f"non-KV {_gib(overhead)}" if overhead else "",
            f"KV {kv / GIB:.2f} GiB for {context_tokens} tokens in {kv_cache_dtype}" if kv is not None else "",
        ]
        share_fits = need <= budget
        line = (
            f"{node.node}: {need / GIB:.1f} GiB ({', '.join(p for p in parts if p)}) "
            f"{'fits' if share_fits else 'does not fit'} in {node.total_bytes / GIB:.1f} GiB x "
            f"GPU_MEMORY_UTILIZATION {utilization} = {budget / GIB:.1f} GiB"
        )
        extensible = rule.extensible and node.nvidia_gpu  # vLLM's CPU backend has no extensible KV cache
        if extensible:
            free_fits, free_line, free_fix = _after_warmup_check(sizes, node, need, rule)
        else:
            free_fits, free_line, free_fix = _free_check(sizes, node, budget, kv_size_fixed)
        fix = "" if share_fits else _share_fix(sizes, node, need, budget, EXTENSIBLE_KV_MARGIN if extensible else 0)
        fix = "; ".join(f for f in (fix, free_fix) if f)
        findings.append(
            MemoryFinding(
                node=node.node,
                need_bytes=need,
                budget_bytes=budget,
                fits=share_fits and free_fits is not False,
                line=line,
                free_line=free_line,
                fix=fix,
                share_fits=share_fits,
                free_fits=free_fits,
                rule=EXTENSIBLE_KV if extensible else START_GATE,
            )
        )
    if rule.extensible and gpus:
        notes.append(_fallback_note(sizes, gpus, utilization))
    return MemoryEstimate(
        weights_per_node=weights,
        kv_per_node=kv,
        kv_cache_dtype=kv_cache_dtype,
        context_tokens=context_tokens,
        basis=basis,
        findings=tuple(findings),
        notes=tuple(notes),
        non_kv_bytes=overhead,
        rule=rule.name,
    )


def _fallback_note(sizes: _Sizes, gpus: list[NodeMemory], utilization: float) -> str:
    """0.34 turns the extensible KV cache off on a driver without virtual memory management, and the start-up gate
    applies there: say so, and on which nodes that gate would refuse."""
    refused = [
        line
        for ok, line, _ in (_free_check(sizes, node, int(node.total_bytes * utilization), "") for node in gpus)
        if ok is False
    ]
    return (
        "the margin is vLLM's floor: it keeps 0.75 x the transient peak warmup measured when that is larger "
        "(v1/worker/extensible_kv_cache.py measure_kv_cache_bytes); should a node's driver lack virtual memory "
        'management, vLLM turns the extensible KV cache off ("Disabling the extensible KV cache" in its log: '
        "v1/engine/core.py, executor.disable_extensible_kv_cache) and the start-up gate applies"
        + (f": it would refuse here ({'; '.join(refused)})" if refused else ": every node here passes it")
    )
