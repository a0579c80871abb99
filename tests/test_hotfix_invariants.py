"""A seeded random load on the real vLLM 0.32 `Scheduler` and
`AsyncScheduler` in the recipe's scheduler configuration, derived from the
default profile (speculative decoding with its MTP margins, async scheduling,
block 256, prefix caching, budget 8192, threshold 1024, 6 sequences) and at
1/16 of its token counts, under a KV pool small enough to preempt.

Invariants (tests/support/invariants.py): no exception, caps held, no chunk
of 0 tokens, no decoding request skipped while budget remains, every request
finishes, outputs counted right. Patch v6 keeps them; patch v5 (the released
script, tests/data/released-hotfix-scripts.tar.gz) stops the EngineCore on vLLM's
`pad_spec_decode` assert; stock vLLM keeps them (the check itself is sound).
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.support import invariants
from tools import scheduler_harness as h

SEEDS = (1, 2, 3)
STEPS = 300  # of random events, then to completion: about a second a run on these CPUs
CONFIGS = [
    pytest.param(scale, asy, id=f"{h.scale_label(scale)}-{'AsyncScheduler' if asy else 'Scheduler'}")
    for scale in h.RECIPE_SCALES
    for asy in (False, True)
]


def pressured(scale, async_scheduling, **kw) -> h.SchedulerSpec:
    """The recipe's configuration with a pool of 3 x 6 threshold-sized chunks: long prompts preempt."""
    spec = h.recipe_spec(scale, async_scheduling=async_scheduling, **kw)
    return dataclasses.replace(spec, num_blocks=18 * spec.long_prefill_token_threshold // spec.block_size)


@pytest.mark.parametrize(("scale", "async_scheduling"), CONFIGS)
def test_the_patch_keeps_the_invariants_under_a_random_load(model_dir, tmp_path, scale, async_scheduling):
    reports = [
        invariants.run_random_load(pressured(scale, async_scheduling), model_dir, seed, STEPS, tmp_path / "control")
        for seed in SEEDS
    ]
    print(reports)
    # The loads reached what they are for: padded admissions, preemption, live changes, aborts.
    assert sum(r.padded for r in reports) and sum(r.preemptions for r in reports)
    assert all(r.finished > 100 and r.live_changes and r.aborted for r in reports)


@pytest.mark.parametrize(("scale", "async_scheduling"), CONFIGS)
def test_stock_vllm_keeps_the_same_invariants(model_dir, tmp_path, scale, async_scheduling):
    reports = [
        invariants.run_random_load(
            pressured(scale, async_scheduling, policy="stock"), model_dir, seed, STEPS, tmp_path / "control"
        )
        for seed in SEEDS
    ]
    assert sum(r.padded for r in reports) and sum(r.preemptions for r in reports)
    assert all(r.finished > 100 for r in reports)


@pytest.fixture(scope="module")
def patch_v5(tmp_path_factory) -> str:
    return h.released_patch(5, tmp_path_factory.mktemp("v5"))


@pytest.mark.parametrize(("scale", "async_scheduling"), CONFIGS)
def test_the_check_finds_patch_v5s_crash(model_dir, tmp_path, patch_v5, scale, async_scheduling):
    """v5's mode 3 set a padded admission back to one token: vLLM's own
    assert in schedule() (fatal to the EngineCore) on one of the seeds."""
    spec = pressured(scale, async_scheduling, patch_script=patch_v5)
    with pytest.raises(AssertionError) as raised:
        for seed in SEEDS:
            invariants.run_random_load(spec, model_dir, seed, STEPS, tmp_path / "control")
    assert not isinstance(raised.value, invariants.InvariantError)
    assert "assert num_new_tokens == 1 + self.num_spec_tokens" in str(raised.traceback[-1].statement)


@pytest.mark.parametrize(("scale", "async_scheduling"), CONFIGS[1:3])
def test_the_patch_keeps_the_invariants_under_the_priority_policy(model_dir, tmp_path, scale, async_scheduling):
    """`--scheduling-policy priority`: the plan reads the waiting heap from its root (random priorities 0-3)."""
    spec = pressured(scale, async_scheduling, scheduling_policy="priority")
    for seed in SEEDS:
        report = invariants.run_random_load(spec, model_dir, seed, STEPS, tmp_path / "control")
        assert report.finished > 100 and report.live_changes
