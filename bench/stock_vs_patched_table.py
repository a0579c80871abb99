#!/usr/bin/env python3
"""Stock vs patched vLLM scheduler on the issue-27 synthetic loads.

Runs the real vLLM v1 scheduler (installed vllm, no model) through
tools.scheduler_harness on two loads and prints JSON (default) or the
Markdown table used in docs/hotfix.md:

* wave: 4 decode streams (48-token prompts, 120 tokens each), then 8 prompts
  of 1500 tokens arriving at step 4; KV pool of 4096 blocks (no pressure).
* kv-pressure: the wave plus 4 more streams arriving at steps 6..9, in a KV
  pool of 300 blocks x 16 tokens (the wave alone needs 750).

Scheduler: max_num_seqs 16, max_num_batched_tokens 2048,
long_prefill_token_threshold 256, block size 16, chunked prefill.

    python bench/stock_vs_patched_table.py [--markdown] [--async-scheduling] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import scheduler_harness as h  # noqa: E402

THRESHOLD = 256
POLICIES = [("stock", None), ("patched", 1), ("patched", 2), ("patched", 3)]


def loads() -> dict[str, tuple[list[h.RequestSpec], int]]:
    wave = h.wave_workload(n_streams=4, stream_tokens=120, n_wave=8, wave_prompt=1500, wave_tokens=16)
    pressure = h.wave_workload(n_streams=4, stream_tokens=120, n_wave=8, wave_prompt=1500, wave_tokens=32)
    pressure += [h.RequestSpec(f"stream-late-{i}", 6 + i, 48, 120) for i in range(4)]
    return {"wave": (wave, 4096), "kv-pressure": (pressure, 300)}


def measure(async_scheduling: bool) -> list[dict]:
    model_dir = h.prepare_environment(tempfile.mkdtemp(prefix="dspark-issue27-table-"))
    rows = []
    for load_name, (workload, num_blocks) in loads().items():
        streams = [r.req_id for r in workload if r.req_id.startswith("stream-")]
        prompts = [r.req_id for r in workload if r.req_id.startswith("wave-")]
        for policy, cap in POLICIES:
            spec = h.SchedulerSpec(
                policy=policy,
                cap=cap,
                async_scheduling=async_scheduling,
                long_prefill_token_threshold=THRESHOLD,
                num_blocks=num_blocks,
            )
            run = h.run_workload(spec, workload, model_dir)
            row = {"load": load_name, **run.summary(streams, prompts)}
            row["longest_decode_gap_steps"] = run.longest_decode_gap()
            row["unfinished"] = sorted(run.unfinished)
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    head = (
        "| load | scheduler | max concurrent partial prefills | max prefill tokens in a decode step "
        "| latency proxy p50 / mean / p99 / max (batch tokens per stream token) | preemptions "
        "| longest decode gap (steps) | TTFT mean / max (steps) |"
    )
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['load']} | {r['label']} | {r['max_concurrent_partial_prefills']} "
            f"| {r['max_prefill_tokens_in_decode_step']} "
            f"| {r['latency_proxy_p50']:.0f} / {r['latency_proxy_mean']:.0f} / {r['latency_proxy_p99']:.0f} "
            f"/ {r['latency_proxy_max']} "
            f"| {r['preemptions']} | {r['longest_decode_gap_steps']} "
            f"| {r['ttft_mean_steps']:.1f} / {r['ttft_max_steps']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the Markdown table")
    parser.add_argument("--async-scheduling", action="store_true", help="use AsyncScheduler")
    parser.add_argument("--out", type=pathlib.Path, help="also write the JSON rows here")
    args = parser.parse_args(argv)
    rows = measure(args.async_scheduling)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=2))
    return 0 if not any(r["unfinished"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
