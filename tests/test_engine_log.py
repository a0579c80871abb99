"""The reload confirmation and the drain line are the EngineCore's own: matched by vLLM's
logger prefix and position, so a client whose prompt lands in the server log (request logging) cannot
forge them."""

from __future__ import annotations

from dspark_launch.hotfix import contract
from dspark_launch.node.engine_log import EngineMessage, engine_lines
from dspark_launch.serve.drain import DRAINED_LOG

LIVE = contract.live_line(
    6, "cap 1 -> 2", {**{s.key: s.default for s in contract.LIVE_SETTINGS}, "cap": 2, "gate_mode": 1}, 640
)
ENGINE = "(EngineCore pid=599) INFO 12-02 01:14:25"
API = "(APIServer pid=512) INFO 12-02 01:14:26 [logger.py:49] Received request chatcmpl-1: prompt: 'x"


def test_only_the_engines_own_lines_from_the_named_file_count():
    log = "\n".join(
        [
            f"{API} {LIVE}'",  # a prompt holding the line, mid-line
            f"{API}",  # a prompt with a newline: vLLM continues it with the API server's prefix
            f"(APIServer pid=512) INFO 12-02 01:14:26 [logger.py:49] {LIVE}",
            LIVE,  # at the start of a line, without any prefix
            f"{ENGINE} [core.py:1667] {LIVE}",  # the engine, but another source file
            f"{ENGINE} [v1/core/sched/scheduler.py:3600] {LIVE}",
            f"(EngineCore_DP0 pid=600) WARNING 12-02 01:14:27 [scheduler.py:3601] {LIVE.replace('v6', 'v7')}",
        ]
    )
    said = engine_lines(log, "scheduler.py")
    assert said == [EngineMessage(0, LIVE), EngineMessage(0, LIVE.replace("v6", "v7"))]
    assert [contract.parse_live_lines(line.message)[0].patch_version for line in said] == [6, 7]
    # Matched anywhere (as before), the forged ones counted too.
    assert len(contract.parse_live_lines(log)) == 6


def test_a_forged_drain_line_does_not_end_a_drain(tmp_path):
    """The head's agent ends an idle drain at the EngineCore's done line; a prompt holding that line does not."""
    from dspark_launch.agent import protocol as p
    from dspark_launch.agent.handlers.processes import _DrainLog
    from dspark_launch.serve.drain import BUSY_LOG

    log = tmp_path / "vllm-serve.log"
    log.write_text("before the stop\n")
    reader = _DrainLog(p.DrainEnd(str(log), DRAINED_LOG, BUSY_LOG))
    with log.open("a") as out:
        out.write(f"{API} {DRAINED_LOG}; starting resource teardown'\n{DRAINED_LOG}\n")
    reader.read()
    assert not reader.done  # forged: at the start of a line, and inside the API server's prompt line
    with log.open("a") as out:
        out.write(f"{ENGINE} [core.py:1666] {DRAINED_LOG}; starting resource teardown\n")
    reader.read()
    assert reader.done and not reader.busy


def test_each_data_parallel_engine_is_told_by_its_rank(tmp_path):
    """With `--data-parallel-size 2` a drain ends on a done line from each rank, not on two from one."""
    from dspark_launch.agent import protocol as p
    from dspark_launch.agent.handlers.processes import _DrainLog
    from dspark_launch.serve.drain import BUSY_LOG

    assert engine_lines(f"(EngineCore_DP3 pid=7) INFO 12-02 01:14:25 [scheduler.py:1] {LIVE}", "scheduler.py") == [
        EngineMessage(3, LIVE)
    ]
    log = tmp_path / "vllm-serve.log"
    log.write_text("")
    reader = _DrainLog(p.DrainEnd(str(log), DRAINED_LOG, BUSY_LOG, 2))
    done = f" INFO 12-02 01:14:25 [core.py:1666] {DRAINED_LOG}; starting resource teardown\n"
    with log.open("a") as out:
        out.write(f"(EngineCore_DP0 pid=600){done}(EngineCore_DP0 pid=600){done}")
    reader.read()
    assert not reader.done
    with log.open("a") as out:
        out.write(f"(EngineCore_DP1 pid=601){done}")
    reader.read()
    assert reader.done and not reader.busy
