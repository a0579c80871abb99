"""A seeded random load on the real vLLM scheduler, with the scheduler's
invariants checked after every `schedule()` (issue 29).

The load mixes what a served model sees: cold prompts of any length (a third
of them one token past a block boundary, the lengths where a prefix-cache hit
leaves a single token to compute), identical resends ("regenerate", retries),
cached conversation turns, aborts while waiting and mid-prefill, preemption
under a small KV pool, and live changes of the hotfix's cap, gate mode and
aging through its control file. Drafts are handed back as EngineCore does
(`scheduler_harness.hand_back_drafts`).

`run_random_load` raises `InvariantError` (or whatever `schedule()` raised)
at the first violation; the message says the seed and the step.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import random
from collections import deque

from dspark_launch.hotfix import contract
from tools import scheduler_harness as h


class InvariantError(AssertionError):
    pass


@dataclasses.dataclass
class LoadReport:
    steps: int
    requests: int
    finished: int
    aborted: int
    preemptions: int
    padded: int  # admissions vLLM padded to 1 + num_spec_tokens rows
    live_changes: int
    max_partials: int


def _lengths(rng: random.Random, spec: h.SchedulerSpec) -> int:
    """A prompt length, every length vLLM can pad among them: a one-token prompt (one token to compute
    under every drafter), and one token past a block boundary (a full hit leaves one token where the
    drafter keeps the hit's trailing block: ngram, and DSpark from 0.34)."""
    block, threshold = spec.block_size, spec.long_prefill_token_threshold
    roll = rng.random()
    if roll < 0.06:
        return 1
    if roll < 0.35:  # one token past a block boundary: a full hit leaves one token
        return block * rng.randint(1, max(1, 4 * threshold // block)) + 1
    if roll < 0.7:
        return rng.randint(2, threshold)
    return rng.randint(threshold, 6 * threshold)


def run_random_load(
    spec: h.SchedulerSpec, model_dir, seed: int, steps: int, control: pathlib.Path, drain_steps: int = 400
) -> LoadReport:
    """Drive `spec`'s scheduler (patched specs read `control` as their control
    file) through `steps` steps of random events, then to completion."""
    from vllm.v1.request import RequestStatus

    rng = random.Random(seed)
    control.unlink(missing_ok=True)
    patched = spec.policy != "stock"
    if patched:
        spec = dataclasses.replace(spec, extra_env=spec.extra_env + ((contract.ENV_CONTROL, str(control)),))
    sched = h.build_scheduler(spec, model_dir)
    hasher = h._block_hasher(spec, sched.vllm_config)
    k = sched.num_spec_tokens
    spec_cfg = sched.vllm_config.speculative_config
    draft_slots = spec_cfg.max_num_new_slots_for_drafting if spec_cfg is not None else 0
    budget = sched.max_num_scheduled_tokens
    depth = 2 if spec.async_scheduling else 1

    groups: list[tuple[str, int]] = []  # (prefix group, prompt length) of prompts sent so far
    max_tokens: dict[str, int] = {}
    produced: dict[str, int] = {}
    finished: set[str] = set()
    aborted: set[str] = set()
    in_flight: deque = deque()
    report = LoadReport(0, 0, 0, 0, 0, 0, 0, 0)

    def where(step: int) -> str:
        return f"seed {seed}, step {step} ({spec.label}, block {spec.block_size})"

    def process_oldest() -> None:
        out, sampled = in_flight.popleft()
        results = sched.update_from_output(out, h._model_output(out, sampled))
        if not spec.async_scheduling:
            h.hand_back_drafts(sched, out, False)
        for engine_outputs in results.values():
            for o in engine_outputs.outputs:
                produced[o.request_id] = produced.get(o.request_id, 0) + len(o.new_token_ids)
                if o.finish_reason is not None and o.request_id not in aborted:
                    finished.add(o.request_id)

    def add(step: int) -> None:
        rid = f"r{report.requests}"
        report.requests += 1
        roll = rng.random()
        if groups and roll < 0.3:  # an identical resend
            group, length = rng.choice(groups)
        elif groups and roll < 0.5:  # the next turn of a conversation
            group, length = rng.choice(groups)
            length += _lengths(rng, spec) if rng.random() < 0.5 else rng.randint(1, spec.block_size)
        else:
            group, length = rid, _lengths(rng, spec)
        length = min(length, spec.max_model_len - 64)
        groups.append((group, length))
        max_tokens[rid] = rng.choice((1, 2, 5, 16, 40))
        req = h.RequestSpec(
            rid, step, length, max_tokens[rid], prefix_group=group, shared_prefix_len=length, priority=rng.randint(0, 3)
        )
        sched.add_request(h.make_request(req, hasher))

    def abort() -> None:
        live = [r for r in sched.requests.values() if not r.is_finished()]
        if live:
            rid = rng.choice(live).request_id
            sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
            aborted.add(rid)

    def live_change() -> None:
        values = {
            contract.ENV_CAP: str(rng.randint(1, contract.CAP_MAX)),
            contract.ENV_GATE_MODE: str(rng.choice(contract.GATE_MODES)),
            contract.ENV_AGING: str(rng.choice((0, 0.5, 2, 64))),
        }
        tmp = control.with_suffix(".new")
        tmp.write_text(contract.control_text(values))
        os.chmod(tmp, 0o600)
        os.replace(tmp, control)
        sched._dspark_live_next = 0.0  # the next schedule() looks at the file
        report.live_changes += 1

    last_partials = 0
    for step in range(steps + drain_steps):
        events = step < steps
        if events:
            for _ in range(rng.choice((0, 0, 0, 1, 1, 2))):
                add(step)
            if rng.random() < 0.05:
                abort()
            if patched and rng.random() < 0.04:
                live_change()
        elif not sched.has_requests() and not in_flight:
            break
        decoding = {r.request_id: r for r in sched.running if not r.is_prefill_chunk}
        out = sched.schedule()  # any exception is the first violation
        report.steps = step + 1
        if spec.async_scheduling:
            h.hand_back_drafts(sched, out, True)
        scheduled = out.num_scheduled_tokens
        zero = [rid for rid, n in scheduled.items() if n <= 0]
        if zero:
            raise InvariantError(f"{where(step)}: chunks of 0 tokens for {zero}")
        padded = [
            rid
            for rid, toks in out.scheduled_spec_decode_tokens.items()
            if rid in {r.req_id for r in out.scheduled_new_reqs} and toks
        ]
        report.padded += len(padded)
        preempted = set(out.preempted_req_ids or ())
        report.preemptions += len(preempted)
        partials = sum(1 for r in sched.running if r.is_prefill_chunk)
        report.max_partials = max(report.max_partials, partials)
        if patched:
            cap = sched._dspark_max_inflight_prefills
            if partials > max(cap, last_partials):
                # Gate mode 4 lends one slot more to a prompt that finishes within two steps' room.
                mid = {r.request_id for r in sched.running if r.is_prefill_chunk}
                if not (sched._dspark_gate_mode == 4 and partials == cap + 1 and sched._dspark_lent in mid):
                    raise InvariantError(f"{where(step)}: {partials} prompts mid-prefill, cap {cap}")
        last_partials = partials
        used = sum(scheduled.values()) + draft_slots * len(scheduled)
        if not preempted and used + 1 + k + draft_slots <= budget:
            for rid, request in decoding.items():
                if rid in scheduled or request.is_finished() or rid not in sched.requests:
                    continue
                done = request.num_computed_tokens + 2 - request.num_output_placeholders >= (
                    request.num_prompt_tokens + request.max_tokens
                )
                if request.num_output_placeholders and done:
                    continue  # async scheduling: its last step is already in flight (vLLM skips it)
                raise InvariantError(f"{where(step)}: decoding {rid} skipped with {budget - used} budget left")
        still_prefilling = {r.request_id for r in sched.running if r.is_prefill_chunk}
        in_flight.append((out, h.sampled_tokens(out, still_prefilling, step)))
        h.settle(in_flight, depth, bool(scheduled), process_oldest)
    while in_flight:
        process_oldest()

    sent = {f"r{i}" for i in range(report.requests)}
    left = sent - finished - aborted
    if left:
        raise InvariantError(f"seed {seed} ({spec.label}): {len(left)} requests never finished: {sorted(left)[:8]}")
    wrong = {
        rid: (produced.get(rid, 0), max_tokens[rid]) for rid in finished if produced.get(rid, 0) != max_tokens[rid]
    }
    if wrong:
        raise InvariantError(f"seed {seed} ({spec.label}): outputs counted wrong (got, wanted): {wrong}")
    report.finished, report.aborted = len(finished), len(aborted)
    return report


#: A patched scheduler without the padding guard (the hotfix's first-chunk overrides applied to a request
#: vLLM padded for speculative decoding): what the check must catch.
UNGUARDED = "unguarded"


def _unguarded_classes(spec: h.SchedulerSpec) -> tuple[type, type]:
    from unittest import mock

    import vllm.v1.core.sched.scheduler as stock

    from dspark_launch.hotfix import layout

    original = pathlib.Path(stock.__file__).read_bytes()
    with mock.patch.object(layout, "_unpadded", lambda text: ""):
        text = layout.render_patched(original).decode()
    assert "not pad_spec_decode" not in text
    return h.classes_from_text("dspark_unguarded_scheduler", text)


h.POLICY_PROVIDERS[UNGUARDED] = _unguarded_classes


def main() -> None:
    """`python -c 'from tests.support.invariants import main; main()' JOB` under another vLLM (a child
    process, tests/support/newest_vllm.py): JOB is JSON {"specs": [SchedulerSpec fields, ...], "seeds",
    "steps", "workdir"}; prints one JSON line per spec and seed: the report, or the first violation."""
    import json
    import sys
    import traceback
    from fractions import Fraction

    import vllm

    job = json.loads(sys.argv[1])
    work = pathlib.Path(job["workdir"])
    model_dir = h.prepare_environment(work)
    for fields in job["specs"]:
        fields = dict(fields)
        scale = Fraction(fields.pop("scale", 1))
        fields["scheduler_options"] = tuple(tuple(pair) for pair in fields.get("scheduler_options", ()))
        spec = h.recipe_spec(scale, **fields)
        spec = dataclasses.replace(spec, num_blocks=18 * spec.long_prefill_token_threshold // spec.block_size)
        for seed in job["seeds"]:
            out = {
                "vllm": vllm.__version__,
                "label": spec.label,
                "policy": spec.policy,
                "seed": seed,
                "async": spec.async_scheduling,
                "drafter": spec.speculative_method,
            }
            try:
                out["report"] = dataclasses.asdict(
                    run_random_load(spec, model_dir, seed, job["steps"], work / "control")
                )
            except AssertionError as error:
                frame = traceback.extract_tb(error.__traceback__)[-1]
                out["error"] = {
                    "type": type(error).__name__,
                    "invariant": isinstance(error, InvariantError),
                    "message": str(error)[:400],
                    "statement": frame.line,
                }
            print(json.dumps(out), flush=True)
