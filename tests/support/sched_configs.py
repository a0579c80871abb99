"""The two scheduler configurations the hotfix's behavioural tests run in (issue 29).

`toy`: the harness's `SchedulerSpec` defaults the older tests were written for (threshold 256, budget
2,048, block 16, 16 sequences, no speculative decoding, no prefix caching, the sync `Scheduler`).
`recipe`: `scheduler_harness.recipe_spec` at full scale, derived from the default profile (MTP with 5
drafts, async scheduling, block 256, budget 8,192, threshold 1,024, 6 sequences, prefix caching), with
a KV pool of the toy's size counted in thresholds (256 of them) so that only the tests that want KV
pressure get it. A test's own fields (`async_scheduling`, `enable_prefix_caching`, ...) override both.

A load written for the toy is carried over by `tokens` (prompt lengths, in thresholds), `aligned`
(a cached prefix, to whole blocks) and `outputs` (a stream's output tokens, so that it decodes for at
least as many steps when every draft is accepted).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from tools import scheduler_harness as h

TOY, RECIPE = "toy", "recipe"
#: The recipe's token counts at full scale (a step of these loads costs milliseconds).
RECIPE_SCALE = Fraction(1)
#: The threshold the toy loads were written for.
TOY_THRESHOLD = h.SchedulerSpec().long_prefill_token_threshold
#: The toy's KV pool, in thresholds (4,096 blocks of 16 tokens).
POOL_THRESHOLDS = h.SchedulerSpec().num_blocks * h.SchedulerSpec().block_size // TOY_THRESHOLD

CONFIGS = pytest.mark.parametrize("config", [TOY, RECIPE])


def spec(config: str, **fields) -> h.SchedulerSpec:
    """A patched scheduler in `config`, `fields` replacing its values."""
    fields.setdefault("policy", "patched")
    if config == TOY:
        return h.SchedulerSpec(**fields)
    if config != RECIPE:
        raise ValueError(f"unknown configuration {config!r}")
    base = h.recipe_spec(RECIPE_SCALE)
    fields.setdefault("num_blocks", POOL_THRESHOLDS * base.long_prefill_token_threshold // base.block_size)
    return dataclasses.replace(base, **fields)


def tokens(base: h.SchedulerSpec, at_toy: int) -> int:
    """A token count written for the toy's threshold, at `base`'s threshold (at least 2)."""
    return max(2, at_toy * base.long_prefill_token_threshold // TOY_THRESHOLD)


def aligned(base: h.SchedulerSpec, at_toy: int) -> int:
    """`tokens` cut to whole blocks: a prefix the prefix cache holds all of."""
    return tokens(base, at_toy) // base.block_size * base.block_size


def outputs(base: h.SchedulerSpec, at_toy: int) -> int:
    """Output tokens of a stream written for one token a step: one plus every draft a step, so that
    the stream decodes for at least `at_toy` steps."""
    return at_toy * (1 + base.num_speculative_tokens)


def blocks(base: h.SchedulerSpec, toy_blocks: int) -> int:
    """A KV pool of `toy_blocks` toy blocks, in `base`'s blocks (the same tokens per threshold)."""
    return tokens(base, toy_blocks * h.SchedulerSpec().block_size) // base.block_size


def stream_count(base: h.SchedulerSpec, at_toy: int, free: int = 4) -> int:
    """`at_toy` decoding streams, fewer where they would leave under `free` of `base`'s seats (the
    recipe has 6: the loads need room for cap 3 prompts and a short one beside them)."""
    return max(1, min(at_toy, base.max_num_seqs - free))
