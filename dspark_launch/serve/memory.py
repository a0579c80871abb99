"""Memory pre-flight: will the weights fit each node's (unified) memory?"""

from __future__ import annotations

import json
import os
from pathlib import Path


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


def fit_report(weights: int, tp: int, node_memory: dict[str, int], utilization: float) -> list[str]:
    """One line per node whose share of the weights exceeds memory x utilization."""
    share = weights / tp
    problems = []
    for node, total in node_memory.items():
        budget = total * utilization
        if share > budget:
            problems.append(f"{node}: weights need {share / 2**30:.1f} GiB per node, but "
                            f"{total / 2**30:.1f} GiB x GPU_MEMORY_UTILIZATION {utilization} = {budget / 2**30:.1f} GiB")
    return problems
