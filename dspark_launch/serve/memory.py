"""Memory pre-flight: weights ÷ TP plus the KV cache at MAX_MODEL_LEN, against each node's (unified) memory.

The weights' folder and size come in from the weights pre-flight (`model/onnodes.py`: the
manifest every node was just checked against), never from a lookup of this module's own;
the model's shape from config.json in that folder; the KV bytes from the profile
(`profiles/memory.py`).
"""

from __future__ import annotations

from pathlib import Path

from dspark_launch.model.onnodes import ModelWeights
from dspark_launch.profiles.catalog import profile_named
from dspark_launch.profiles.memory import MemoryEstimate, NodeMemory, memory_preflight, read_model_shape


def estimate(profile: str, weights: ModelWeights | None, kv_cache_dtype: str, max_model_len: int, tp: int,
             utilization: float, node_memory: dict[str, int | None]) -> MemoryEstimate:
    """Per node: weights / TP + KV for one MAX_MODEL_LEN sequence, against memory x utilisation.
    `weights` None (never placed: only `dspark plan` sees that) leaves them out; so are nodes whose
    memory is unknown (None)."""
    return memory_preflight(profile_named(profile), kv_cache_dtype, max_model_len, tp,
                            weights.size_bytes if weights else None,
                            read_model_shape(Path(weights.folder)) if weights else None,
                            tuple(NodeMemory(node, total) for node, total in node_memory.items() if total),
                            utilization)
