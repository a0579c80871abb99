"""Gate mode 4 on the two-node testbed: the real CPU vLLM serving the tiny model under `dspark bench`'s mixed load,
the step time read from the scheduler's own diagnostics lines (`period_ms`), per target step time.

    python -m bench.time_bound_testbed [--targets 20,30,40] [--runs 3] [--seconds 60] [--out FILE]

Uses the running `make demo` (brings one up, and down again at the end, when none runs). For each point, gate mode 3
(the token bound, for reference) and mode 4 at each target: the live settings reloaded (`dspark reload`, diagnostics
on), the workload run (`dspark bench`), then the server log's new diagnostics lines read. A step counts while
requests decode and the line before it was a busy step too (an idle spell's gap is no step time); a mixed step
also carries prefill. Out (JSON, `dspark-time-bound-testbed/1`): per point the p50, p99 and max step time, the p99
over the target, how many mixed steps ran (prompts progressed) and the bench's per-class first tokens. Timings of a
2-core CPU box with other work on it say nothing about a GB10: they show whether the controller holds a target on a
real engine's own step times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dspark_launch.hotfix import contract

_DIAG = re.compile(
    r"dspark-issue27 step=(?P<step>\d+) .*?prefill_tokens=(?P<prefill>\d+) decode_tokens=\d+ "
    r"decode_reqs=(?P<decoders>\d+) .*? mode=(?P<mode>\d+) .*? room=(?P<room>\S+) target_ms=(?P<target>\S+) "
    r"fit=\[(?P<fit>.*?)\] period_ms=(?P<period>\S+)$"
)
SCHEMA = "dspark-time-bound-testbed/1"


def diag_lines(text: str) -> list[dict]:
    """The diagnostics lines of a log, parsed (lines of other patch versions are left out)."""
    out = []
    for line in text.splitlines():
        match = _DIAG.search(line)
        if match:
            out.append(match.groupdict())
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def step_times(lines: list[dict]) -> dict:
    """Busy steps' times (requests decoding, the previous line a busy step too), and those that carried prefill."""
    busy, mixed = [], []
    for before, line in zip(lines, lines[1:]):
        if line["period"] == "-" or not int(line["decoders"]) or not int(before["decoders"]):
            continue
        ms = float(line["period"])
        busy.append(ms)
        if int(line["prefill"]):
            mixed.append(ms)

    def summary(values: list[float]) -> dict:
        return {
            "steps": len(values),
            "p50_ms": percentile(values, 0.5),
            "p99_ms": percentile(values, 0.99),
            "max_ms": max(values) if values else None,
        }

    return {"busy": summary(busy), "mixed": summary(mixed), "last_fit": lines[-1]["fit"] if lines else None}


class Demo:
    """The `make demo` cluster: `dspark` inside its head node, its env file."""

    def __init__(self) -> None:
        import demo.__main__ as demo

        self.demo = demo
        self.testbed = demo.testbed()
        self.env_file = demo.WORK / "dspark.env"
        self.started = False

    def ensure_up(self) -> None:
        if self.testbed.is_up() and self.env_file.exists() and self.dspark("status", quiet=True) == 0:
            return
        if self.demo.up() != 0:
            raise SystemExit("time_bound_testbed: `make demo` did not come up")
        self.started = True

    def dspark(self, *args: str, quiet: bool = False, capture: bool = False):
        argv = [str(Path(sys.executable).parent / "dspark"), *args, "--env-file", str(self.env_file)]
        env = {**os.environ, **self.demo.launcher_env(self.demo.WORK)}
        done = subprocess.run(
            self.testbed.nsenter_argv("head") + argv,
            env=env,
            stdout=subprocess.PIPE if (quiet or capture) else None,
            stderr=subprocess.DEVNULL if quiet else None,
            text=True,
        )
        return done.stdout if capture else done.returncode

    def _write(self, values: dict[str, str]) -> bool:
        """The demo's own env file with `values` in it; whether anything changed (an unchanged file is left as it
        is, so that `status` shows no drift)."""
        lines = self.env_file.read_text().splitlines()
        if all(f"{name}={value}" in lines for name, value in values.items()):
            return False
        kept = [line for line in lines if not any(line.startswith(f"{name}=") for name in values)]
        self.env_file.write_text("\n".join(kept + [f"{k}={v}" for k, v in values.items()]) + "\n")
        return True

    def serve_with(self, values: dict[str, str]) -> None:
        """Restart-level settings (the bench's prompts need a longer context than the demo's 256 tokens)."""
        self._write(values)
        self.dspark("stop")  # then a fresh start: one server life with these values, whatever ran before
        if self.dspark("start") != 0:
            raise SystemExit(f"time_bound_testbed: start with {values} failed")

    def set_live(self, values: dict[str, str]) -> None:
        """The live lines replaced, then `dspark reload`."""
        self._write(values)
        if self.dspark("reload") != 0:
            raise SystemExit(f"time_bound_testbed: reload of {values} failed")

    @property
    def server_log(self) -> Path:
        """The server log: the demo's state folder is on this machine's file system, as the head node sees it."""
        return self.demo.WORK / "state" / "logs" / "vllm-serve.log"


#: The tiny model's whole context (its max_position_embeddings), one step's budget of it.
SERVING = {"MAX_MODEL_LEN": "1024", "MAX_NUM_BATCHED_TOKENS": "1024"}


def run_point(demo: Demo, mode: int, target_ms: float, seconds: float, seed: int, runs: int) -> dict:
    demo.set_live(
        {
            contract.ENV_GATE_MODE: str(mode),
            contract.ENV_TARGET_STEP_MS: f"{target_ms:g}",
            contract.ENV_DIAG: "1",
        }
    )
    before = demo.server_log.stat().st_size
    codes, benches = [], []
    started = time.monotonic()
    for run in range(runs):
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "bench.json"
            argv = ["bench", "--seconds", f"{seconds:g}", "--seed", str(seed + run), "--out", str(out)]
            codes.append(demo.dspark(*argv, quiet=True))
            benches.append(json.loads(out.read_text()) if out.exists() else {})
    wall = time.monotonic() - started
    with demo.server_log.open("rb") as log:
        log.seek(before)
        lines = diag_lines(log.read().decode(errors="replace"))
    times = step_times(lines)
    p99 = times["mixed"]["p99_ms"]
    return {
        "gate_mode": mode,
        "target_ms": target_ms if mode == 4 else None,
        "bench_exits": codes,
        "wall_s": round(wall, 1),
        "diag_lines": len(lines),
        **times,
        "mixed_p99_over_target": round(p99 / target_ms, 3) if (p99 is not None and mode == 4) else None,
        "classes_per_run": [
            {
                name: {key: c.get(key) for key in ("requests", "ok", "errors", "cut", "ttft_mean_s", "itl_p99_s")}
                for name, c in ((bench.get("result") or {}).get("classes") or {}).items()
            }
            for bench in benches
        ],
    }


def _targets(text: str) -> list[float]:
    """`--targets`: each within DSPARK_TARGET_STEP_MS's declared range (argparse turns the error into exit 2)."""
    setting = contract.LIVE[contract.ENV_TARGET_STEP_MS]
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        values = []
    if not values or not all(setting.minimum <= v <= setting.maximum for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r}: comma-separated milliseconds, each {setting.minimum:g} to {setting.maximum:g}"
        )
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--targets", type=_targets, default="20,30,40", help="mode 4's target step times, ms, comma-separated"
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="at most this long each bench run")
    parser.add_argument("--runs", type=int, default=3, help="bench runs per point")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (default: stdout only)")
    args = parser.parse_args(argv)
    targets = args.targets
    demo = Demo()
    demo.ensure_up()
    try:
        demo.serve_with(SERVING)
        points = [run_point(demo, 3, contract.DEFAULT_TARGET_STEP_MS, args.seconds, args.seed, args.runs)]
        points += [run_point(demo, 4, target, args.seconds, args.seed, args.runs) for target in targets]
        demo.set_live({contract.ENV_GATE_MODE: str(contract.DEFAULT_GATE_MODE), contract.ENV_DIAG: "0"})
    finally:
        if demo.started:
            demo.demo.down()
    result = {
        "schema": SCHEMA,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "loadavg_end": os.getloadavg()},
        "serving": SERVING,
        "runs_per_point": args.runs,
        "points": points,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
