"""DSPARK_ADMISSION_CLOSED on a patched copy of the installed vLLM's scheduler: streams decoding, admission closed
through the control file before a wave of prompts arrives, opened again later; what the scheduler did. `main()` runs
the same under another vLLM in a child process (tests/support/newest_vllm.py)."""

from __future__ import annotations

import logging
import os
import pathlib
import sys

from dspark_launch.hotfix import contract
from tests.support import sched_configs as sc
from tools import scheduler_harness as h

STEP_S = 0.25  # modelled seconds per schedule() call: the control file is looked at every 4 steps
CLOSE_AT, WAVE_AT, OPEN_AT = 2, 8, 40


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _write(path: pathlib.Path, **values: str) -> None:
    """As `dspark reload` and the memory guard do: a new 0600 file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(contract.control_text(values))
    tmp.chmod(0o600)
    os.replace(tmp, path)


def run(config: str, async_scheduling: bool, model_dir, workdir: pathlib.Path) -> dict:
    """Streams from step 0, admission closed at CLOSE_AT, a wave at WAVE_AT, opened at OPEN_AT: the steps that
    admitted a wave prompt while closed, the streams that went a step without a token then, when the first wave
    prompt was admitted, and the scheduler's own `(live)` changes."""
    h.patched_scheduler_classes()
    module = sys.modules[h.PATCHED_MODULE_NAME]
    control = workdir / f"control-{config}-{async_scheduling}"
    clock, lines = _Clock(), _Lines()
    saved, level = module._dspark_hotfix_time, module.logger.level
    module._dspark_hotfix_time = clock
    module.logger.addHandler(lines)
    module.logger.setLevel(logging.INFO)
    try:

        def step(sched, index: int) -> None:
            clock.now += STEP_S
            if index == CLOSE_AT:
                _write(control, DSPARK_ADMISSION_CLOSED="1")
            if index == OPEN_AT:
                _write(control, DSPARK_ADMISSION_CLOSED="0")

        base = sc.spec(
            config, cap=1, async_scheduling=async_scheduling, extra_env=((contract.ENV_CONTROL, str(control)),)
        )
        workload = h.wave_workload(
            n_streams=sc.stream_count(base, 4),
            stream_prompt=sc.tokens(base, 48),
            stream_tokens=sc.outputs(base, 160),
            n_wave=4,
            wave_prompt=sc.tokens(base, 600),
            wave_tokens=8,
            wave_step=WAVE_AT,
        )
        result = h.run_workload(base, workload, model_dir, before_schedule=step)
    finally:
        module._dspark_hotfix_time = saved
        module.logger.removeHandler(lines)
        module.logger.setLevel(level)
    waves = {r.req_id for r in workload if r.req_id.startswith("wave-")}
    held = [s for s in result.steps if WAVE_AT <= s.step < OPEN_AT]
    done: set[str] = set().union(*(s.finished for s in result.steps if s.step < WAVE_AT))
    starved = []
    for record in held:
        starved += sorted(set(h.stream_ids(workload)) - done - record.scheduled.keys())
        done |= record.finished
    changes = [line.changes for line in contract.parse_live_lines("\n".join(lines.messages))]
    return {
        "unfinished": sorted(result.unfinished),
        "held_steps": len(held),
        "admitted_while_closed": [s.step for s in held if waves & s.scheduled.keys()],
        "starved": starved,
        "admitted_at": min(s.step for s in result.steps if waves & s.scheduled.keys()),
        "changes": changes,
        "vllm": _version(),
    }


def _version() -> str:
    import vllm

    return vllm.__version__


def main() -> None:
    """`python -c 'from tests.support.admission import main; main()' JOB`: JOB is JSON {"workdir", "cases":
    [{"config", "async_scheduling"}, ...]}; one JSON line per case."""
    import json

    job = json.loads(sys.argv[1])
    workdir = pathlib.Path(job["workdir"])
    model_dir = h.prepare_environment(workdir)
    for case in job["cases"]:
        print(json.dumps(run(case["config"], case["async_scheduling"], model_dir, workdir)), flush=True)
