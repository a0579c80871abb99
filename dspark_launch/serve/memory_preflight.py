"""Memory pre-flight: weights ÷ TP, the profile's measured non-KV overhead and the KV cache at MAX_MODEL_LEN
against each node's (unified) memory x utilisation; each node's MemAvailable against vLLM's start-up gate.

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


def kv_size_fixed(serve_args: tuple[str, ...], env: dict[str, str]) -> str:
    """What fixes the KV size of vLLM's CPU backend in this serve spec ("" when nothing): then that backend
    checks no utilisation share of free memory (vllm/v1/worker/cpu_worker.py)."""
    if any(a == KV_SIZE_FLAG or a.startswith(KV_SIZE_FLAG + "=") for a in serve_args):
        return KV_SIZE_FLAG
    return CPU_KV_SIZE_VAR if env.get(CPU_KV_SIZE_VAR, "") != "" else ""


def estimate(profile: str, weights: ModelWeights | None, kv_cache_dtype: str, max_model_len: int, tp: int,
             utilization: float, node_memory: Mapping[str, MemoryAnswer | None], fixed_kv: str = "") -> MemoryEstimate:
    """Per node: weights / TP + overhead + KV for one MAX_MODEL_LEN sequence against memory x utilisation, and
    MemAvailable against vLLM's start-up gate. `weights` None (never placed: only `dspark plan` sees that)
    leaves them to the profile's measured figure, if any; nodes whose memory is unknown are left out."""
    nodes = tuple(NodeMemory(node, answer.total_bytes, answer.available_bytes, answer.nvidia_gpu)
                  for node, answer in node_memory.items() if answer is not None and answer.total_bytes)
    return estimate_memory(profile_named(profile), kv_cache_dtype, max_model_len, tp,
                           weights.size_bytes if weights else None,
                           read_model_shape(Path(weights.folder)) if weights else None,
                           nodes, utilization, fixed_kv)
