"""Fast day-to-day commands, the parts that need no server: an idle drain ends when the server's log
says its engine had nothing in flight (its own teardown is cut short), a drain with work in flight still waits
for the server's own end; the launcher's drain report and its reading of the engine count.

The stand-in server does what vLLM 0.32 does on SIGTERM with --shutdown-timeout (v1/engine/core.py
`_handle_shutdown`, `run_engine_core`): the start line, the busy line only when requests are in flight, the
done line once they finished, then SIGTERM back to the default and a long resource teardown.
"""

from __future__ import annotations

import secrets
import sys
import textwrap
import time
from pathlib import Path

from dspark_launch.agent import protocol as p
from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.transport import LocalTransport
from dspark_launch.node import procfs
from dspark_launch.serve.drain import BUSY_LOG, DRAINED_LOG, RequestCounts, drain_end, report

SERVER = (
    textwrap.dedent("""
    import os, signal, sys, time
    in_flight, witness = int(sys.argv[1]), sys.argv[2]
    def engine(message):  # vLLM's logger prefix for the EngineCore (node/engine_log.py reads it)
        print(f"(EngineCore pid={os.getpid()}) INFO 12-02 01:14:25 [core.py:1666] {message}", flush=True)
    def drain(signum, frame):
        engine("[shutdown] EngineCore: start mode=drain timeout=300s")
        if in_flight:
            engine(f"{BUSY} count={in_flight} timeout=300s")
            time.sleep(1.5)  # the requests in flight decode to their end
            open(witness + ".finished", "w").close()
        engine(f"{DONE}; starting resource teardown")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(2 if in_flight else 600)  # vLLM's teardown: Ray executor, compiled graph, Ray's driver
        open(witness + ".torn-down", "w").close()
        sys.exit(0)
    signal.signal(signal.SIGTERM, drain)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
""")
    .replace("{BUSY}", BUSY_LOG)
    .replace("{DONE}", DRAINED_LOG)
)

OLD_LIFE = f"(EngineCore pid=7) INFO 12-02 01:00:00 [core.py:1666] {DRAINED_LOG}; old run\n"


def serve(tmp_path: Path, in_flight: int, old_lines: str = "") -> tuple[NodeAgent, str, p.SpawnAnswer, Path, Path]:
    agent = NodeAgent("here", LocalTransport(sys.executable))
    marker = f"dspark-{secrets.token_hex(4)}-here"
    log, witness = tmp_path / "server.log", tmp_path / "witness"
    log.write_text(old_lines)
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    answer = agent.call(
        p.Spawn((sys.executable, str(script), str(in_flight), str(witness)), {}, marker, str(log)), "spawn"
    )
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "ready" in log.read_text()
    return agent, marker, answer, log, witness


def drained_stop(agent, marker, answer, log) -> p.StopAnswer:
    end = p.DrainEnd(str(log), DRAINED_LOG, BUSY_LOG)
    return agent.call(p.Stop(marker, (answer.process,), (answer.session,), grace_s=5, drain_s=900, drain_end=end))


def test_an_idle_drain_ends_at_the_engines_done_line_and_cuts_its_teardown_short(tmp_path):
    agent, marker, answer, log, witness = serve(tmp_path, in_flight=0)
    stopped = drained_stop(agent, marker, answer, log)
    assert stopped.drain == "idle" and answer.process.pid in stopped.stopped and stopped.left == ()
    assert procfs.start_time(answer.process.pid) is None
    assert not Path(f"{witness}.torn-down").exists()  # not held for the teardown, nor for the 900 s drain limit


def test_a_drain_with_requests_in_flight_waits_for_the_servers_own_end(tmp_path):
    # A done line from an earlier life of the log never counts: only what the stop made the server write.
    agent, marker, answer, log, witness = serve(tmp_path, in_flight=2, old_lines=OLD_LIFE)
    stopped = drained_stop(agent, marker, answer, log)
    assert stopped.drain == "complete" and stopped.left == ()
    assert Path(f"{witness}.finished").exists() and Path(f"{witness}.torn-down").exists()


def test_a_drain_without_a_log_to_read_waits_for_the_processes_as_before(tmp_path):
    agent, marker, answer, log, witness = serve(tmp_path, in_flight=1)
    stopped = agent.call(p.Stop(marker, (answer.process,), (answer.session,), grace_s=5, drain_s=900))
    assert stopped.drain == "" and Path(f"{witness}.finished").exists() and Path(f"{witness}.torn-down").exists()


def test_the_report_says_idle_or_counts_what_finished():
    idle = report(RequestCounts(0, 3), RequestCounts(0, 3), 0.8, 60, "idle")
    assert idle.idle and (idle.finished, idle.cut) == (0, 0)
    assert idle.line == (
        "vllm serve was idle (nothing in flight): stopped in 0.8 s, no drain wait: 0 request(s) finished, 0 cut"
    )
    complete = report(RequestCounts(4, 10), RequestCounts(1, 12), 9.0, 60, "complete")
    assert (complete.finished, complete.cut) == (4, 0)
    cut = report(RequestCounts(4, 10), RequestCounts(2, 11), 60.0, 60, "timeout")
    assert (cut.finished, cut.cut) == (1, 3)


def test_one_done_line_per_engine_with_data_parallel():
    assert drain_end("/s/log", "--enforce-eager").engines == 1
    assert drain_end("/s/log", "--data-parallel-size 2 --enforce-eager").engines == 2
    assert drain_end("/s/log", "-dp=4").engines == 4
    assert drain_end("/s/log", "--data-parallel-size x").engines == 1


def test_the_drain_log_needs_every_engines_done_line_and_no_busy_one_before(tmp_path):
    from dspark_launch.agent.handlers.processes import _DrainLog

    log = tmp_path / "log"
    log.write_text(f"{DRAINED_LOG}; before the stop\n")
    two = _DrainLog(p.DrainEnd(str(log), DRAINED_LOG, BUSY_LOG, engines=2))
    dp = "INFO 12-02 01:14:25 [core.py:1666]"
    with log.open("a") as out:
        out.write(
            f"(EngineCore_DP0 pid=8) {dp} {DRAINED_LOG}; starting resource teardown\n"
            f"(EngineCore_DP1 pid=9) {dp} [shutdown] Eng"
        )
    two.read()
    assert not two.done and not two.busy  # one engine of two, and half a line
    with log.open("a") as out:
        out.write(
            f"ineCore: draining in-flight requests count=1\n(EngineCore_DP1 pid=9) {dp} {DRAINED_LOG}\n{BUSY_LOG}\n"
        )
    two.read()
    assert two.done and two.busy  # the second engine had work in flight when the stop came


def test_read_only_questions_to_this_machines_agent_are_answered_in_process(tmp_path, monkeypatch):
    """`status` asks the head's agent whether processes live: with the head's interpreter this one, no agent
    process starts (the answer is the handler's own); another interpreter (even one linking to the same base
    Python, as another venv's does) still gets its agent process."""
    import os

    def no_agent_process(self, request_line, timeout, on_line):
        raise AssertionError("an agent process was started")

    monkeypatch.setattr(LocalTransport, "exchange", no_agent_process)
    here = NodeAgent("head", LocalTransport(sys.executable))
    me = p.Process(os.getpid(), procfs.start_time(os.getpid()), boot_id=procfs.boot_id())
    assert here.call(p.AliveQuery((me, p.Process(os.getpid(), 1)))).alive == (True, False)
    log = tmp_path / "log"
    log.write_text("one\ntwo\n")
    assert here.call(p.ReadLog(str(log), 4)).text == "two\n"
    other_venv = tmp_path / "python"  # another venv's python: a link to the same base interpreter
    other_venv.symlink_to(sys.executable)
    elsewhere = NodeAgent("head", LocalTransport(str(other_venv)))
    try:
        elsewhere.call(p.AliveQuery((me,)))
    except AssertionError as exc:
        assert "agent process" in str(exc)
    else:
        raise AssertionError("another interpreter's agent was not asked")
