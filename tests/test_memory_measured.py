"""The memory pre-flight from measured figures after a pull too, and the default utilization against vLLM's
free-memory gate at the public idle readings of a GB10."""

from __future__ import annotations

import shutil

from dspark_launch.agent.protocol import MemoryAnswer
from dspark_launch.model.onnodes import ModelWeights
from dspark_launch.node.vllm_dryboot import SHIPPED_CONFIG
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from dspark_launch.profiles.memory_model import GIB
from dspark_launch.serve.memory_preflight import estimate

GB10 = int(121.69 * GIB)  # eugr's two GB10s (recipes/deepseek-v4-flash-0731-1m.yaml)
RECIPE_CHECKPOINT = 167 * 10**9  # vLLM's recipe: the 0731 checkpoint is about 167 GB on disk
DEFAULT_UTILIZATION = float(next(d.value for d in DEEPSEEK_V4_FLASH.settings if d.setting == "GPU_MEMORY_UTILIZATION"))


def pulled(tmp_path) -> ModelWeights:
    """What `dspark model pull` leaves for the pre-flight: the folder (its config.json) and the shards' size."""
    shutil.copy(SHIPPED_CONFIG, tmp_path / "config.json")
    return ModelWeights(str(tmp_path), RECIPE_CHECKPOINT)


def nodes(available_gib: float) -> dict[str, MemoryAnswer]:
    return {name: MemoryAnswer(GB10, int(available_gib * GIB), nvidia_gpu=True) for name in ("head", "worker1")}


def test_after_a_pull_of_the_recipe_sized_checkpoint_085_at_1m_is_refused(tmp_path):
    found = estimate(DEEPSEEK_V4_FLASH.name, pulled(tmp_path), "fp8_ds_mla", 1048576, 2, 0.85, nodes(117.0))
    assert RECIPE_CHECKPOINT // 2 < int(81.34 * GIB)  # file size / 2 alone (77.8 GiB) would let 0.85 pass
    assert found.weights_per_node == int(81.34 * GIB)
    assert any("below the 81.34 GiB measured per node" in note for note in found.notes)
    assert not found.fits and all(not f.share_fits for f in found.findings)  # eugr: 0.85 fails at 1M


def test_the_default_utilization_passes_the_gate_of_a_fresh_headless_gb10_at_1m(tmp_path):
    """Public idle readings of a headless GB10: 113-117 GiB MemAvailable. The default holds 1M context and passes
    vLLM's gate at the low end; 0.90 (the former default) does not pass it there."""
    for available in (113.0, 117.0):
        found = estimate(
            DEEPSEEK_V4_FLASH.name, pulled(tmp_path), "fp8_ds_mla", 1048576, 2, DEFAULT_UTILIZATION, nodes(available)
        )
        assert found.fits, (available, [f.line + " / " + f.free_line for f in found.findings])
    former = estimate(DEEPSEEK_V4_FLASH.name, pulled(tmp_path), "fp8_ds_mla", 1048576, 2, 0.90, nodes(113.0))
    assert not former.fits and all(f.share_fits and f.free_fits is False for f in former.findings)
    # A desktop session's 101 GiB (a GLM-on-Spark report): refused, with the context that would fit.
    busy = estimate(
        DEEPSEEK_V4_FLASH.name, pulled(tmp_path), "fp8_ds_mla", 1048576, 2, DEFAULT_UTILIZATION, nodes(101.0)
    )
    assert not busy.fits and "lower GPU_MEMORY_UTILIZATION to 0.78 or less" in busy.findings[0].fix
