"""Workloads of the scheduler benchmark, shaped like the reported cases.

Token counts are given at full size (the GB10 deployment: budget 8192,
threshold 1024) and multiplied by `scale` (e.g. 1/64 for CI). Output lengths
(decode steps) and arrival steps are not scaled, so every shape keeps its
number of steps: a 32K prompt at threshold 1024 takes 32 chunks at any scale.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction

from tools.scheduler_harness import RequestSpec

K = 1000  # "8K" is 8,000 tokens: real prompts are not multiples of the chunk size
FULL_BUDGET = 8192
FULL_THRESHOLD = 1024
STREAM_PROMPT = 512  # full-size prompt of a decoding stream
SHORT_MAX = 2 * K  # full-size prompts up to this are the "short" class
BLOCK_SIZE = 16


def scaled(tokens: int, scale: Fraction) -> int:
    return max(1, int(tokens * scale))


@dataclasses.dataclass(frozen=True)
class Workload:
    """Requests plus the scheduler settings they run under.

    `kind`: wave | steady | kv-pressure. `n_streams`: requests decoding when
    the prompts of interest arrive (for the ideal time to first token).
    `prompts`: ids whose time to first token is reported.
    """

    name: str
    kind: str
    requests: tuple[RequestSpec, ...]
    prompts: tuple[str, ...]
    n_streams: int
    max_num_seqs: int
    budget: int
    threshold: int
    num_blocks: int
    max_model_len: int
    scale: Fraction
    params: dict
    # Request class -> ids (cached turn, short, long) for per-class time to first token.
    classes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    prefix_caching: bool = False

    def scheduler_kwargs(self) -> dict:
        return dict(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.budget,
            long_prefill_token_threshold=self.threshold,
            num_blocks=self.num_blocks,
            block_size=BLOCK_SIZE,
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.prefix_caching,
        )

    def describe(self) -> dict:
        """The exact workload, for the JSON output."""
        return {
            "name": self.name,
            "kind": self.kind,
            "params": self.params,
            "scale": str(self.scale),
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.budget,
            "long_prefill_token_threshold": self.threshold,
            "num_blocks": self.num_blocks,
            "block_size": BLOCK_SIZE,
            "max_model_len": self.max_model_len,
            "n_streams": self.n_streams,
            "prefix_caching": self.prefix_caching,
            "classes": {name: list(ids) for name, ids in self.classes},
            "requests": [
                [r.req_id, r.arrival_step if r.arrival_ms is None else None, r.arrival_ms, r.prompt_len, r.max_tokens]
                for r in self.requests
            ],
        }


def _settings(scale: Fraction) -> tuple[int, int]:
    return scaled(FULL_BUDGET, scale), scaled(FULL_THRESHOLD, scale)


def _max_len(requests: Sequence[RequestSpec]) -> int:
    longest = max(r.prompt_len + r.max_tokens for r in requests)
    return max(1024, int(math.ceil(longest / 1024) * 1024))


def _blocks(tokens: int) -> int:
    return math.ceil(tokens / BLOCK_SIZE)


def _unpressured(
    name: str,
    kind: str,
    streams: list,
    prompts: list,
    max_num_seqs: int,
    budget: int,
    threshold: int,
    scale: Fraction,
    params: dict,
    classes: dict[str, list[str]] | None = None,
    prefix_caching: bool = False,
) -> Workload:
    """A workload whose KV pool holds every request at once (64 spare blocks).

    `classes` defaults to prompts up to SHORT_MAX (full size) as "short", the rest "long"."""
    requests = streams + prompts
    tokens = sum(r.prompt_len + r.max_tokens for r in requests)
    if classes is None:
        short = scaled(SHORT_MAX, scale)
        classes = {
            "short": [r.req_id for r in prompts if r.prompt_len <= short],
            "long": [r.req_id for r in prompts if r.prompt_len > short],
        }
    return Workload(
        name=name,
        kind=kind,
        requests=tuple(requests),
        prompts=tuple(r.req_id for r in prompts),
        n_streams=len(streams),
        max_num_seqs=max_num_seqs,
        budget=budget,
        threshold=threshold,
        num_blocks=_blocks(tokens) + 64,
        max_model_len=_max_len(requests),
        scale=scale,
        params=params,
        classes=tuple((k, tuple(v)) for k, v in classes.items() if v),
        prefix_caching=prefix_caching,
    )


def wave(
    prompt_k: int, n_wave: int, max_num_seqs: int, scale: Fraction, n_streams: int = 4, wave_tokens: int = 32
) -> Workload:
    """`n_streams` streams decoding, then `n_wave` cold prompts of `prompt_k` K tokens at once.

    The streams keep decoding until well after the wave is prefilled at cap 1.
    KV pool: everything fits (no pressure).
    """
    budget, threshold = _settings(scale)
    prompt = scaled(prompt_k * K, scale)
    stream_prompt = scaled(STREAM_PROMPT, scale)
    arrival = 2 + math.ceil(stream_prompt / max(1, budget // max(1, n_streams)))
    serial_steps = n_wave * math.ceil(prompt / threshold)
    stream_tokens = serial_steps + 2 * wave_tokens + 16
    streams = [RequestSpec(f"stream-{i}", 0, stream_prompt, stream_tokens) for i in range(n_streams)]
    prompts = [RequestSpec(f"wave-{i}", arrival, prompt, wave_tokens) for i in range(n_wave)]
    return _unpressured(
        f"wave-{prompt_k}k-x{n_wave}-seqs{max_num_seqs}",
        "wave",
        streams,
        prompts,
        max_num_seqs,
        budget,
        threshold,
        scale,
        {
            "prompt_tokens_full": prompt_k * K,
            "n_wave": n_wave,
            "n_streams": n_streams,
            "wave_output_tokens": wave_tokens,
            "arrival_step": arrival,
        },
    )


# Prompt sizes of the steady loads, in K tokens. "docs": mostly mid-size
# prompts, now and then a long document (mean 11.75K); "chat": mostly short
# chats with a long document now and then (mean 4.4K).
STEADY_MIX = (2, 8, 1, 16, 4, 32, 2, 1, 8, 62, 1, 4)
CHAT_MIX = (1, 0.5, 2, 1, 0.3, 32, 1, 0.5, 4, 1, 2, 8)


def steady(
    scale: Fraction,
    n_prompts: int = 36,
    every_ms: float = 1200.0,
    n_streams: int = 2,
    max_num_seqs: int = 16,
    mix: tuple = STEADY_MIX,
    label: str = "docs",
) -> Workload:
    """Two long-lived streams; a prompt arrives every `every_ms` of modelled
    time (not every N steps: capped steps are lighter, so a step count would
    offer a capped scheduler more prompts per second), sizes cycling through
    `mix`, outputs of 48 to 111 tokens."""
    budget, threshold = _settings(scale)
    stream_prompt = scaled(STREAM_PROMPT, scale)
    prompts = []
    for i in range(n_prompts):
        size = mix[i % len(mix)]
        prompts.append(
            RequestSpec(
                f"req-{i:02d}", 0, scaled(int(size * K), scale), 48 + (i * 37) % 64, arrival_ms=200.0 + i * every_ms
            )
        )
    # The streams decode until every prompt is served, even at cap 1.
    horizon = sum(math.ceil(p.prompt_len / threshold) + p.max_tokens for p in prompts) + 64
    streams = [RequestSpec(f"stream-{i}", 0, stream_prompt, horizon) for i in range(n_streams)]
    return _unpressured(
        f"steady-{label}-{n_prompts}x-every{every_ms:g}ms",
        "steady",
        streams,
        prompts,
        max_num_seqs,
        budget,
        threshold,
        scale,
        {"n_prompts": n_prompts, "every_ms_model": every_ms, "mix_k": list(mix), "n_streams": n_streams},
    )


def kv_pressure(
    scale: Fraction, prompt_k: int = 16, n_wave: int = 8, pool_share: float = 0.4, max_num_seqs: int = 16
) -> Workload:
    """4 streams, a wave of `n_wave` x `prompt_k` K prompts, then 4 more streams
    arriving while it is ingested, in a KV pool that holds the streams plus
    `pool_share` of the wave's prompt tokens: too small for stock to keep
    everything resident."""
    budget, threshold = _settings(scale)
    prompt = scaled(prompt_k * K, scale)
    stream_prompt = scaled(STREAM_PROMPT, scale)
    stream_tokens = n_wave * math.ceil(prompt / threshold) + 96
    streams = [RequestSpec(f"stream-{i}", 0, stream_prompt, stream_tokens) for i in range(4)]
    prompts = [RequestSpec(f"wave-{i}", 4, prompt, 64) for i in range(n_wave)]
    late = [RequestSpec(f"stream-late-{i}", 6 + i, stream_prompt, stream_tokens) for i in range(4)]
    requests = streams + prompts + late
    return Workload(
        name=f"kv-pressure-{prompt_k}k-x{n_wave}",
        kind="kv-pressure",
        requests=tuple(requests),
        prompts=tuple(r.req_id for r in prompts + late),
        n_streams=4,
        max_num_seqs=max_num_seqs,
        budget=budget,
        threshold=threshold,
        # The streams' whole lengths fit; the wave's prompts get `pool_share`
        # of what they need (so the shape holds at any scale: outputs are not
        # scaled, prompts are).
        num_blocks=_blocks(int(n_wave * prompt * pool_share))
        + sum(_blocks(r.prompt_len + r.max_tokens) for r in streams + late),
        max_model_len=_max_len(requests),
        scale=scale,
        params={"prompt_tokens_full": prompt_k * K, "n_wave": n_wave, "pool_share": pool_share, "late_streams": 4},
        classes=(("short", tuple(r.req_id for r in late)), ("long", tuple(r.req_id for r in prompts))),
    )


def agent(
    scale: Fraction,
    n_sessions: int = 4,
    turns: int = 6,
    every_ms: float = 6000.0,
    n_docs: int = 4,
    doc_k: int = 32,
    doc_every_ms: float = 8000.0,
    n_streams: int = 2,
    max_num_seqs: int = 16,
) -> Workload:
    """Coding-agent sessions beside cold long documents, prefix caching on.

    Each session's turn resends the whole conversation: turn 1 is cold (16K to
    28K tokens), every later turn is the previous one plus 2 % to 8 % (so 92 %
    to 98 % of it is a prefix-cache hit once the previous turn is in the
    cache). A turn arrives every `every_ms` of modelled time per session; a
    cold `doc_k` K document every `doc_every_ms`."""
    budget, threshold = _settings(scale)
    stream_prompt = scaled(STREAM_PROMPT, scale)
    growth = (0.02, 0.05, 0.08, 0.03)
    turns_out, first, later = [], [], []
    for s in range(n_sessions):
        length = (16 + 4 * s) * K
        for k in range(turns):
            if k:
                length = int(length * (1 + growth[(s + k) % len(growth)]))
            rid = f"turn-{s}-{k}"
            size = scaled(length, scale)
            turns_out.append(
                RequestSpec(
                    rid,
                    0,
                    size,
                    64,
                    prefix_group=f"session-{s}",
                    shared_prefix_len=size,
                    arrival_ms=300.0 + 700.0 * s + k * every_ms,
                )
            )
            (later if k else first).append(rid)
    docs = [
        RequestSpec(f"doc-{i}", 0, scaled(doc_k * K, scale), 64, arrival_ms=1000.0 + i * doc_every_ms)
        for i in range(n_docs)
    ]
    prompts = sorted(turns_out + docs, key=lambda r: r.arrival_ms)
    horizon = sum(math.ceil(p.prompt_len / threshold) + p.max_tokens for p in prompts) + 64
    streams = [RequestSpec(f"stream-{i}", 0, stream_prompt, horizon) for i in range(n_streams)]
    return _unpressured(
        f"agent-{n_sessions}x{turns}-docs{doc_k}k",
        "agent",
        streams,
        prompts,
        max_num_seqs,
        budget,
        threshold,
        scale,
        {
            "n_sessions": n_sessions,
            "turns": turns,
            "every_ms_model": every_ms,
            "n_docs": n_docs,
            "doc_tokens_full": doc_k * K,
            "doc_every_ms_model": doc_every_ms,
            "n_streams": n_streams,
        },
        classes={"cached": later, "long": first + [d.req_id for d in docs]},
        prefix_caching=True,
    )


SHORT_MIX = (0.3, 0.5, 1, 2, 0.8, 1.5)


def short_stream(
    scale: Fraction,
    n_prompts: int = 60,
    every_ms: float = 400.0,
    long_k: int = 62,
    long_at_ms: float = 2000.0,
    n_streams: int = 2,
    max_num_seqs: int = 16,
    replies: tuple[int, int] | None = None,
) -> Workload:
    """A sustained stream of short prompts (0.3K to 2K, one every `every_ms` of
    modelled time) with one cold `long_k` K document among them.

    `replies` (first, spread): the shorts' replies are `first` to
    `first + spread` tokens (realistic chat answers: about ten shorts decode
    while the document is ingested); default 16 to 31."""
    budget, threshold = _settings(scale)
    stream_prompt = scaled(STREAM_PROMPT, scale)
    first, spread = replies or (16, 16)
    prompts = [
        RequestSpec(
            f"short-{i:02d}",
            0,
            scaled(int(SHORT_MIX[i % len(SHORT_MIX)] * K), scale),
            first + (i * 7) % spread,
            arrival_ms=200.0 + i * every_ms,
        )
        for i in range(n_prompts)
    ]
    prompts.append(RequestSpec("long-0", 0, scaled(long_k * K, scale), 64, arrival_ms=long_at_ms))
    prompts.sort(key=lambda r: r.arrival_ms)
    horizon = sum(math.ceil(p.prompt_len / threshold) + p.max_tokens for p in prompts) + 64
    streams = [RequestSpec(f"stream-{i}", 0, stream_prompt, horizon) for i in range(n_streams)]
    suffix = f"-replies{first}-{first + spread - 1}" if replies else ""
    return _unpressured(
        f"short-stream-{n_prompts}x-every{every_ms:g}ms-long{long_k}k{suffix}",
        "short-stream",
        streams,
        prompts,
        max_num_seqs,
        budget,
        threshold,
        scale,
        {
            "n_prompts": n_prompts,
            "every_ms_model": every_ms,
            "mix_k": list(SHORT_MIX),
            "long_tokens_full": long_k * K,
            "long_at_ms_model": long_at_ms,
            "n_streams": n_streams,
            "reply_tokens": [first, first + spread - 1],
        },
    )


def suite(scale: Fraction, grid: str = "full") -> list[Workload]:
    """The benchmark's workloads. `grid`: full (every reported shape) or ci."""
    if grid == "ci":
        return [
            wave(32, 8, 16, scale),
            wave(8, 4, 6, scale),
            steady(scale, n_prompts=16),
            kv_pressure(scale),
            agent(scale, n_sessions=2, turns=4, n_docs=3),
            short_stream(scale, n_prompts=30),
        ]
    loads = [wave(p, n, 16, scale) for p in (8, 16, 32, 62) for n in (2, 4, 8)]
    loads += [wave(p, 8, 6, scale) for p in (8, 32, 62)]
    loads += [
        steady(scale),
        steady(scale, n_prompts=48, every_ms=500.0, mix=CHAT_MIX, label="chat"),
        kv_pressure(scale),
        agent(scale),
        short_stream(scale),
        short_stream(scale, every_ms=250.0, long_k=32),
        short_stream(scale, every_ms=1000.0, replies=(200, 300)),
    ]
    return loads
