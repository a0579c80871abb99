#!/usr/bin/env python3
"""Prototype admission gates (issue 6) and the full scheduler experiment grid.

`python -m bench.scheduler` measures what an operator runs (stock, the
community baseline, the shipped hotfix at their settings). This script runs
the grid behind the research log bench/results/scheduler.md: caps 1..3 in every gate
mode, the community gate at 1..3, and the prototypes below, which are written
on top of the hotfix by replacing its gate text in a patched copy (bench
only; the one that won was shipped as a gate mode).

    python bench/scheduler_experiments.py [--scale 1] [--grid full] [--out bench/results/scheduler.json]
    python bench/scheduler_tables.py bench/results/scheduler.json   # then refill the log's tables

The raw JSON is not kept in git (about 34k lines); the tables in
bench/results/scheduler.md are what is kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scheduler import policies as p  # noqa: E402
from bench.scheduler import report, scheduler_bench  # noqa: E402
from dspark_launch.hotfix.contract import ENV_GATE_MODE, GATE_MODES  # noqa: E402
from dspark_launch.hotfix.layout import render_patched  # noqa: E402
from tools import scheduler_harness as h  # noqa: E402

#: Plain cap 1 of patch v1: the reference of the experiment tables.
CAP1 = p.hotfix_name(1, 0)

# Our hotfix's gate, as it appears in a patched copy (replaced by variants,
# which run the hotfix in mode 0 so that its own step bound is off).
_HOTFIX_GATE_PREFIX = "                if (  # dspark-issue27\n"
_HOTFIX_GATE_END = "                    continue\n"

_SPENT_HELPER = '''

def _bench_prefill_spent(sched, num_scheduled_tokens):
    """Prefill tokens the running prefills claim this step (bench variants):
    each its next chunk, min(threshold, remaining), whether or not the budget
    let the running loop schedule all of it."""
    thr = sched.scheduler_config.long_prefill_token_threshold
    spent = 0
    for request in sched.running:
        if request.is_prefill_chunk:
            left = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
            scheduled = num_scheduled_tokens.get(request.request_id, 0)
            spent += max(scheduled, min(left, thr)) if thr > 0 else scheduled
    return spent


def _bench_decoding(sched):
    return any(not request.is_prefill_chunk for request in sched.running)
'''

# Prototype gates (issue 6, "go beyond the plain cap"). Names used below:
# c = cap, T = long_prefill_token_threshold, K = a per-step prefill token
# bound. `_bench_need` is the peeked prompt's remaining tokens (an upper
# bound: prefix-cache hits are not known yet), `_bench_chunk` the chunk it
# would get, `_bench_partial_after` whether it stays mid-prefill.
_VARIANT_PREAMBLE = (
    "                _bench_req = request_queue.peek_request()\n"
    "                _bench_thr = self.scheduler_config.long_prefill_token_threshold\n"
    "                _bench_need = _bench_req.num_tokens - _bench_req.num_computed_tokens\n"
    "                _bench_chunk = min(_bench_need, _bench_thr if _bench_thr > 0 else token_budget)\n"
    "                _bench_partial_after = _bench_chunk < _bench_need\n"
    "                _bench_free = _dspark_hotfix_holds_kv(_bench_req)\n"
)

VARIANT_GATES: dict[str, tuple[str, str]] = {
    # Count cap c for prompts that stay mid-prefill; prompts that finish
    # within the step pass while the step's prefill tokens stay <= (c+1) * T;
    # a blocked long head is stepped over (at most 8 per step) so that a short
    # prompt queued behind it is not held back.
    "lane-skip": (
        "count gate for prompts that stay partial, prompts finishing in the step pass while prefill tokens <= "
        "(cap+1) x threshold, up to 8 blocked long prompts per step stepped over",
        _VARIANT_PREAMBLE + "                if not _bench_free and (\n"
        "                    (_bench_partial_after and _dspark_partial >= self._dspark_max_inflight_prefills)\n"
        "                    or (_bench_thr > 0 and _bench_spent and _bench_spent + _bench_chunk\n"
        "                        > (self._dspark_max_inflight_prefills + 1) * _bench_thr)\n"
        "                ):\n"
        "                    if _bench_skips >= 8 or not (_bench_partial_after and _dspark_partial >= "
        "self._dspark_max_inflight_prefills):\n"
        "                        break\n"
        "                    _bench_skips += 1\n"
        "                    skip_request(request_queue)\n"
        "                    continue\n",
    ),
    # The hotfix's count gate, and the waiting section gets only the prefill
    # tokens left under K = c * T: a new prompt's first chunk fills what the
    # previous prompt's last chunk left (the step never exceeds K).
    "budget": (
        "count gate + the waiting section's token budget cut to cap x threshold minus running prefills' chunks",
        _VARIANT_PREAMBLE + "                if (\n"
        "                    _dspark_partial >= self._dspark_max_inflight_prefills\n"
        "                    and not _bench_free\n"
        "                ):\n"
        "                    break\n",
    ),
    # Mode-0 count gate for prompts that stay partial (blocked ones stepped
    # over, 8 per step); prompts that finish within the step pass while the
    # step's prefill tokens stay <= (cap + 1/2) x threshold.
    "shortlane": (
        "count gate for prompts that stay partial (blocked ones stepped over, 8 per step); prompts finishing "
        "within the step pass while prefill tokens <= (cap + 1/2) x threshold",
        _VARIANT_PREAMBLE + "                if not _bench_free:\n"
        "                    if _bench_partial_after:\n"
        "                        if _dspark_partial >= self._dspark_max_inflight_prefills:\n"
        "                            if _bench_skips >= 8:\n"
        "                                break\n"
        "                            _bench_skips += 1\n"
        "                            skip_request(request_queue)\n"
        "                            continue\n"
        "                    elif _bench_thr > 0 and _bench_spent and (\n"
        "                        _bench_spent + _bench_chunk > (self._dspark_max_inflight_prefills + 0.5) * "
        "_bench_thr\n"
        "                    ):\n"
        "                        break\n",
    ),
    # Gate only while a decode-active request runs (idle: admit like stock).
    "decode-aware": (
        "cap applies only while a decode-active request is running",
        _VARIANT_PREAMBLE + "                if (\n"
        "                    _bench_decoding_now\n"
        "                    and _dspark_partial >= self._dspark_max_inflight_prefills\n"
        "                    and not _bench_free\n"
        "                ):\n"
        "                    break\n",
    ),
}


def _hotfix_text(original: str) -> str:
    return render_patched(original.encode("utf-8")).decode("utf-8")


def variant_text(original: str, name: str) -> str:
    """Our hotfix with its gate replaced by the prototype `name`."""
    text = _hotfix_text(original)
    start = text.index(_HOTFIX_GATE_PREFIX)
    end = text.index(_HOTFIX_GATE_END, start) + len(_HOTFIX_GATE_END)
    text = text[:start] + VARIANT_GATES[name][1] + text[end:]
    site = "        _dspark_partial, _dspark_spent = _dspark_hotfix_running_partials(  # dspark-issue27\n"
    assert text.count(site) == 1
    text = text.replace(
        site,
        "        _bench_spent = _bench_prefill_spent(self, num_scheduled_tokens)\n"
        "        _bench_decoding_now = _bench_decoding(self)\n"
        "        _bench_skips = 0\n" + site,
        1,
    )
    if name == "budget":
        share = "0.0"
        section = "        # Next, schedule the WAITING requests.\n"
        assert text.count(section) == 1
        text = text.replace(
            section,
            "        _bench_thr_cfg = self.scheduler_config.long_prefill_token_threshold\n"
            "        if _bench_thr_cfg > 0:\n"
            "            _bench_k = int((self._dspark_max_inflight_prefills + " + share + ") * _bench_thr_cfg)\n"
            "            token_budget = min(token_budget, max(0, _bench_k - _bench_spent))\n" + section,
            1,
        )
    admit = "                    _dspark_partial += 1\n"
    assert text.count(admit) == 1
    text = text.replace(admit, admit + "                _bench_spent += num_new_tokens\n", 1)
    block = "# >>> dspark-issue27 hotfix >>>\n"
    return text.replace(block, block + _SPENT_HELPER.lstrip("\n") + "\n", 1)


def _variant_provider(name: str):
    def provide(spec: h.SchedulerSpec) -> tuple[type, type]:
        module = "dspark_bench_variant_" + name.replace("-", "_")
        return p.classes_from_text(module, variant_text(p.installed_text(), name))

    return provide


def _room(half_chunks: float | None, chunk: int) -> int:
    return (1 << 30) if half_chunks is None else int(half_chunks * chunk / 2)


@dataclasses.dataclass(frozen=True)
class CandidateRoom:
    """A gate mode 2 candidate (issue 15), as a widening of the shipped rule.

    `half_chunks`: the room beyond the step bound that a prompt with no
    prefix-cache hit finishing within the step may use, in half-thresholds
    (None: the whole budget); `split_chunks`: prompts of up to that many
    thresholds are exempt from the count; `cached_half_chunks`: the same room
    for cached tails (0: only what is left of the bound, the shipped rule);
    `shortest_first`: a prompt that needs the in-flight slot is held while a
    waiting request with fewer tokens to compute (after a prefix-cache lookup
    of its own) waits: shortest first instead of vLLM's arrival order.
    """

    half_chunks: float | None
    split_chunks: int
    cached_half_chunks: float | None
    shortest_first: bool = False
    #: > 0: a cached tail's tokens count (1 + hit / depth_tokens) each against
    #: the bound (they attend over the hit: the step-time model's alpha/beta is 66K).
    depth_tokens: float = 0.0

    def short_room(self, chunk: int) -> int:
        return _room(self.half_chunks, chunk)

    def cached_room(self, chunk: int) -> int:
        return _room(self.cached_half_chunks, chunk)


def _same(half_chunks: float | None, split_chunks: int = 0) -> CandidateRoom:
    """The room for every prompt that finishes within the step, cached or not."""
    return CandidateRoom(half_chunks, split_chunks, half_chunks)


#: The candidates of the docs' table. The shipped one is m2-fresh-quarter
#: (contract.SHORT_ROOM_SHARE, uncached prompts only).
SHORT_ROOMS = {
    "m2-room0": _same(0),
    "m2-room-eighth": _same(0.25),
    "m2-room-quarter": _same(0.5),
    "m2-room-half": _same(1),
    "m2-room-chunk": _same(2),
    "m2-room-budget": _same(None),
    "m2-split2-half": _same(1, 2),
    "m2-split2-chunk": _same(2, 2),
    "m2-split2-quarter": _same(0.5, 2),
    "m2-split1-half": _same(1, 1),
    "m2-fresh-eighth": CandidateRoom(0.25, 0, 0),
    "m2-fresh-quarter": CandidateRoom(0.5, 0, 0),
    "m2-fresh-half": CandidateRoom(1, 0, 0),
    # Issue 15's lower bound leaves the cached target open on the agent workload (docs:
    # "Hotfix v3"): cached tails that finish within the step always pass; cached tails
    # weighted by their depth; shortest first among prompts that need the slot; both.
    "m2-fresh-quarter-cached-budget": CandidateRoom(0.5, 0, None),
    "m2-weighted": CandidateRoom(0.5, 0, 0, False, 66_000.0),
    "m2-spt": CandidateRoom(0.5, 0, 0, True),
    "m2-spt-weighted": CandidateRoom(0.5, 0, 0, True, 66_000.0),
}

_CANDIDATE_MODULE = "dspark_bench_mode2_candidates"


def _tokens_to_compute(sched, request) -> int:
    """What a waiting request still has to compute, after a prefix-cache
    lookup of its own (bench only: one more lookup per waiting request)."""
    return request.num_tokens - sched.kv_cache_manager.get_computed_blocks(request)[1]


def _candidate_admit(shipped, holds_kv):
    """The shipped mode 2 decision (`shipped`, the patched module's own
    `_dspark_hotfix_admit`) widened by the scheduler's `_bench_room`; the uncached
    room is the scheduler's `_dspark_short_room`, which the candidate's class
    sets. Same arguments and results as the shipped function."""

    def admit(sched, request, computed, token_budget, partial, spent):
        chunk = sched._dspark_chunk
        if not chunk or holds_kv(request):
            return shipped(sched, request, computed, token_budget, partial, spent)
        room = sched._bench_room
        need = request.num_tokens - computed
        left = sched._dspark_step_bound - spent
        cached_room = room.cached_room(chunk)
        weight = 1.0 + computed / room.depth_tokens if room.depth_tokens else 1.0
        if computed and need <= min(chunk, token_budget) and need * weight <= left + cached_room:
            return 0
        decision = shipped(sched, request, computed, token_budget, partial, spent)
        if computed and weight > 1.0:
            # The shipped rule's pass and first chunk, counted in weighted tokens.
            if decision == 0 and need * weight > left + cached_room:
                decision = -1 if partial >= sched._dspark_max_inflight_prefills or left <= 0 else left
            if decision > 0:
                decision = int(decision / weight) or -1
        # Nonzero: it does not finish within the bound (and room) this step.
        if decision and need <= room.split_chunks * chunk and left + sched._dspark_short_room > 0:
            return left + sched._dspark_short_room
        if (
            decision > 0
            and room.shortest_first
            and any(
                other is not request and not holds_kv(other) and _tokens_to_compute(sched, other) < need
                for other in sched.waiting
            )
        ):
            return -1
        return decision

    return admit


def _candidate_classes() -> tuple[type, type]:
    """(Scheduler, AsyncScheduler) of a patched copy of their own, whose
    admission calls the candidates' rule: the shipped hotfix's module and
    the injected code are left as shipped."""
    sync_cls, async_cls = p.classes_from_text(_CANDIDATE_MODULE, _hotfix_text(p.installed_text()))
    module = sys.modules[_CANDIDATE_MODULE]
    if not hasattr(module, "_bench_shipped_admit"):
        module._bench_shipped_admit = module._dspark_hotfix_admit
        module._dspark_hotfix_admit = _candidate_admit(module._bench_shipped_admit, module._dspark_hotfix_holds_kv)
    return sync_cls, async_cls


def _with_room(cls: type, name: str, room: CandidateRoom) -> type:
    def __init__(self, *args, **kwargs):
        cls.__init__(self, *args, **kwargs)
        self._dspark_short_room = room.short_room(self._dspark_chunk)
        self._bench_room = room

    return type(f"{cls.__name__}_{name.replace('-', '_')}", (cls,), {"__init__": __init__})


def _room_provider(name: str):
    def provide(spec: h.SchedulerSpec) -> tuple[type, type]:
        sync_cls, async_cls = _candidate_classes()
        return _with_room(sync_cls, name, SHORT_ROOMS[name]), _with_room(async_cls, name, SHORT_ROOMS[name])

    return provide


def register() -> None:
    p.register()
    for name in VARIANT_GATES:
        h.POLICY_PROVIDERS[f"bench-variant-{name}"] = _variant_provider(name)
    for name in SHORT_ROOMS:
        h.POLICY_PROVIDERS[f"bench-{name}"] = _room_provider(name)


def candidate_policies() -> list[p.Policy]:
    """Gate mode 2 with each short-prompt room, at cap 1."""
    return [
        p.Policy(
            f"{name}:1",
            "variant",
            cap=1,
            mode=name,
            provider=f"bench-{name}",
            env=((ENV_GATE_MODE, "2"),),
            description=f"gate mode 2, short-prompt room "
            f"{'the budget' if r.half_chunks is None else f'{r.half_chunks} x threshold/2'}"
            + (
                ""
                if r.cached_half_chunks == r.half_chunks
                else f", cached tails "
                f"{'the budget' if r.cached_half_chunks is None else f'{r.cached_half_chunks} x threshold/2'}"
            )
            + (f"; prompts up to {r.split_chunks} chunks exempt from the count" if r.split_chunks else "")
            + ("; shortest first among prompts that need the slot" if r.shortest_first else ""),
        )
        for name, r in SHORT_ROOMS.items()
    ]


def experiment_policies(variants: bool = True, candidates: bool = True) -> list[p.Policy]:
    """Every policy of the experiment grid, in table order (`candidates`: mode 2's room and split candidates)."""
    pols = p.stock_policies() + [p.community(c) for c in (1, 2, 3)]
    pols += [p.hotfix(c, m) for m in GATE_MODES for c in (1, 2, 3)]
    if candidates:
        pols += candidate_policies()
    if variants:
        pols += [
            p.Policy(
                f"{name}:1",
                "variant",
                cap=1,
                mode=name,
                description=desc,
                provider=f"bench-variant-{name}",
                env=((ENV_GATE_MODE, "0"),),
            )
            for name, (desc, _) in VARIANT_GATES.items()
        ]
    return pols


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="1")
    parser.add_argument("--grid", default="full", choices=("full", "ci"))
    parser.add_argument("--scheduler", action="append", choices=scheduler_bench.SCHEDULERS)
    parser.add_argument("--no-variants", action="store_true")
    parser.add_argument(
        "--candidates",
        action="store_true",
        help="only stock+thr, patch v2's gate and the gate mode 2 candidates (issue 15)",
    )
    parser.add_argument("--no-overhead", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "results" / "scheduler.json")
    parser.add_argument(
        "--plot", type=pathlib.Path, default=REPO / "bench" / "results" / "scheduler-tokens-per-step.png"
    )
    args = parser.parse_args(argv)
    register()
    result = scheduler_bench.run(
        scheduler_bench.parse_scale(args.scale),
        compared=([p.stock_policies()[1], p.hotfix(1, 1), p.hotfix(1, 2)] + candidate_policies())
        if args.candidates
        else experiment_policies(not args.no_variants),
        reference=p.hotfix_name(1, 1) if args.candidates else CAP1,
        grid=args.grid,
        schedulers=tuple(args.scheduler or scheduler_bench.SCHEDULERS),
        overhead_reps=None if args.no_overhead else (2000, 400),
        overhead_compared=None
        if args.no_overhead
        else p.overhead_policies()[:3] + [p.hotfix(1, 0)] + [p.hotfix(1, m) for m in GATE_MODES if m],
        plot_path=args.plot if importlib.util.find_spec("matplotlib") else None,
        plot_policies=(p.STOCK_THR, CAP1, p.SHIPPED),
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        command=["python", "bench/scheduler_experiments.py", *(argv or sys.argv[1:])],
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(report.terminal(result))
    return 0 if not any(r["unfinished"] for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
