"""Per-step cost of the hotfix's control-file check (patch v5, issue 24) in the real vLLM `schedule()`.

Reuses `bench.scheduler.overhead`: stock, the hotfix without a control file variable, and the hotfix
with one (an existing control file), stepped interleaved at 256 running / 1,024 waiting (and 6 / 16);
then the check itself timed directly: the per-step path (the monotonic clock not yet due) and the
once-a-second path (one `stat` of an unchanged file).

    python bench/live_control_overhead.py [--reps-large N]   # writes bench/results/live_control_overhead.json
"""

from __future__ import annotations

import gc
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.scheduler import overhead  # noqa: E402
from bench.scheduler.policies import Policy, hotfix  # noqa: E402
from dspark_launch.hotfix import contract  # noqa: E402
from tools import scheduler_harness as h  # noqa: E402


def _check_us(sched, due: bool, calls: int = 20000) -> float:
    module = sys.modules[h.PATCHED_MODULE_NAME]
    check = module._dspark_hotfix_live_check
    gc.disable()
    try:
        started = time.perf_counter_ns()
        for _ in range(calls):
            if due:
                sched._dspark_live_next = 0.0
            check(sched)
        elapsed = time.perf_counter_ns() - started
    finally:
        gc.enable()
    return elapsed / calls / 1000.0


def main(argv: list[str]) -> int:
    reps_large = int(argv[argv.index("--reps-large") + 1]) if "--reps-large" in argv else 300
    work = Path(tempfile.mkdtemp(prefix="dspark-live-overhead-"))
    model_dir = h.prepare_environment(work)
    control = work / "scheduler-control"
    control.write_text(contract.control_text({contract.ENV_CAP: "1"}))
    control.chmod(0o600)
    plain = hotfix(contract.DEFAULT_CAP, contract.DEFAULT_GATE_MODE)
    with_file = Policy(
        plain.name + "+control",
        "hotfix",
        cap=plain.cap,
        mode=plain.mode,
        env=((contract.ENV_CONTROL, str(control)),),
        description="the hotfix with a control file",
    )
    without = Policy(
        plain.name,
        "hotfix",
        cap=plain.cap,
        mode=plain.mode,
        env=((contract.ENV_CONTROL, None),),
        description="the hotfix, no control file variable",
    )
    pols = [Policy("stock+thr", "stock", description="baseline"), without, with_file]
    scenarios = [
        overhead.scenario(model_dir, pols, running=6, waiting=16, reps=2000),
        overhead.scenario(model_dir, pols, running=256, waiting=1024, reps=reps_large),
    ]
    sched = h.build_scheduler(with_file.spec(long_prefill_token_threshold=1024), model_dir)
    check = {
        "per_step_us": round(_check_us(sched, due=False), 3),
        "with_stat_us": round(_check_us(sched, due=True, calls=5000), 3),
        "stat_period_s": contract.LIVE_CHECK_PERIOD_S,
    }
    result = {
        "host": platform.node(),
        "cpus": __import__("os").cpu_count(),
        "python": platform.python_version(),
        "patch_version": contract.PATCH_VERSION,
        "method": overhead.measure.__doc__.strip().splitlines()[0],
        "scenarios": scenarios,
        "control_check": check,
    }
    out = REPO / "bench" / "results" / "live_control_overhead.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
