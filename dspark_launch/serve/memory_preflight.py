"""Memory pre-flight: weights ÷ TP, the profile's measured non-KV overhead and the KV cache at MAX_MODEL_LEN
against each node's (unified) memory x utilisation; each node's MemAvailable against the free-memory rule of the
installed vLLM release (0.32/0.33's start-up gate, 0.34's extensible KV cache: `profiles/memory_model.py`).

The weights' folder and size come in from the weights pre-flight (`model/onnodes.py`: the
manifest every node was just checked against), never from a lookup of this module's own;
the model's shape from config.json in that folder; the KV bytes from the profile
(`profiles/memory_model.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dspark_launch.agent.protocol import MemoryAnswer
from dspark_launch.model.onnodes import ModelWeights
from dspark_launch.profiles.catalog import profile_named
from dspark_launch.profiles.memory_model import MemoryEstimate, NodeMemory, estimate_memory, read_model_shape

CPU_KV_SIZE_VAR = "VLLM_CPU_KVCACHE_SPACE"  # vllm/platforms/cpu.py: fixes the KV size on the CPU backend
KV_SIZE_FLAG = "--kv-cache-memory-bytes"
# What turns vLLM 0.34's extensible KV cache off on CUDA (config/vllm.py VllmConfig._resolve_extensible_kv_cache):
# a fixed KV size or block count, the flag's negative, elastic EP; a KV connector may (legacy IPC, its own memory
# pool, NIXL without an IMEX channel), so one counts as off: the start-up gate, the stricter rule at start.
EXTENSIBLE_OFF_FLAGS = (
    KV_SIZE_FLAG,
    "--num-gpu-blocks-override",
    "--no-enable-extensible-kv-cache",
    "--enable-elastic-ep",
    "--kv-transfer-config",
)


def _given(serve_args: tuple[str, ...], flag: str) -> bool:
    """Whether `flag` is among the arguments, as `--flag`, `--flag=value` or with underscores (vLLM's parser takes
    both spellings)."""
    return any(a.split("=", 1)[0].replace("_", "-") == flag for a in serve_args if a.startswith("--"))


def extensible_off(serve_args: tuple[str, ...]) -> str:
    """The flag in the serve arguments that turns vLLM 0.34's extensible KV cache off ("" when none does)."""
    return next((flag for flag in EXTENSIBLE_OFF_FLAGS if _given(serve_args, flag)), "")


def kv_size_fixed(serve_args: tuple[str, ...], env: dict[str, str]) -> str:
    """What fixes the KV size of vLLM's CPU backend in this serve spec ("" when nothing): then that backend
    checks no utilisation share of free memory (vllm/v1/worker/cpu_worker.py)."""
    if any(a == KV_SIZE_FLAG or a.startswith(KV_SIZE_FLAG + "=") for a in serve_args):
        return KV_SIZE_FLAG
    return CPU_KV_SIZE_VAR if env.get(CPU_KV_SIZE_VAR, "") != "" else ""


def estimate(
    profile: str,
    weights: ModelWeights | None,
    kv_cache_dtype: str,
    max_model_len: int,
    tp: int,
    utilization: float,
    node_memory: Mapping[str, MemoryAnswer | None],
    fixed_kv: str = "",
    vllm_version: str = "",
    serve_args: tuple[str, ...] = (),
) -> MemoryEstimate:
    """Per node: weights / TP + overhead + KV for one MAX_MODEL_LEN sequence against memory x utilisation, and
    MemAvailable against the free-memory rule of vLLM `vllm_version` (the head's; the version matrix holds every
    node to it) with `serve_args`. `weights` None (never placed: only `dspark plan` sees that) leaves them to the
    profile's measured figure, if any; nodes whose memory is unknown are left out."""
    nodes = tuple(
        NodeMemory(node, answer.total_bytes, answer.available_bytes, answer.nvidia_gpu)
        for node, answer in node_memory.items()
        if answer is not None and answer.total_bytes
    )
    return estimate_memory(
        profile_named(profile),
        kv_cache_dtype,
        max_model_len,
        tp,
        weights.size_bytes if weights else None,
        read_model_shape(Path(weights.folder)) if weights else None,
        nodes,
        utilization,
        fixed_kv,
        vllm_version,
        extensible_off(serve_args),
    )
