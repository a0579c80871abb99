"""Memory pre-flight: weights ÷ TP plus the KV cache at MAX_MODEL_LEN, against each node's (unified) memory.

The model's size and shape come from its local copy (a folder, or the head's Hugging
Face cache: never downloaded); the KV bytes from the profile (`profiles/memory.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dspark_launch.profiles.catalog import profile_named
from dspark_launch.profiles.memory import MemoryEstimate, NodeMemory, memory_preflight, read_model_shape


def hf_cache_snapshot(model: str, revision: str) -> Path | None:
    """The local Hugging Face cache folder of `model`, if it is there (never downloads)."""
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub")
    repo = hub / f"models--{model.replace('/', '--')}"
    if not repo.is_dir():
        return None
    ref = repo / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else (revision or "")
    snapshot = repo / "snapshots" / commit
    if commit and snapshot.is_dir():
        return snapshot
    snapshots = sorted((repo / "snapshots").glob("*"))
    return snapshots[-1] if snapshots else None


def weights_bytes(folder: Path) -> int | None:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
            if total:
                return int(total)
        except (ValueError, OSError):
            pass
    files = list(folder.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None


def local_snapshot(model: str, revision: str) -> Path | None:
    """The model's folder when `model` is one, else its snapshot in the local Hugging Face cache."""
    path = Path(model).expanduser()
    return path if path.is_dir() else hf_cache_snapshot(model, revision)


def estimate(profile: str, model: str, revision: str, kv_cache_dtype: str, max_model_len: int, tp: int,
             utilization: float, node_memory: dict[str, int | None]) -> MemoryEstimate:
    """Per node: weights / TP + KV for one MAX_MODEL_LEN sequence, against memory x utilisation.
    Nodes whose memory is unknown (None) are left out."""
    folder = local_snapshot(model, revision)
    return memory_preflight(profile_named(profile), kv_cache_dtype, max_model_len, tp,
                            weights_bytes(folder) if folder else None, read_model_shape(folder) if folder else None,
                            tuple(NodeMemory(node, total) for node, total in node_memory.items() if total),
                            utilization)
