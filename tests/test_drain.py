"""Drained stops, the parts that need no server: what /metrics says, what the stop reports,
and the entry shim keeping vLLM's SIGTERM handler when Ray starts in the same process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from dspark_launch.serve.drain import RequestCounts, counts_from_metrics, report

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 5.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 2.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 9.0
"""


def test_metrics_count_requests_in_the_engine_and_finished_ones_without_aborts():
    assert counts_from_metrics(METRICS) == RequestCounts(in_flight=4, finished=7)
    assert counts_from_metrics("") == RequestCounts(0, 0)


def test_report_counts_finished_and_cut():
    before = RequestCounts(4, 10)
    drained = report(before, RequestCounts(0, 12), 3.0, 60, "complete")
    assert (drained.finished, drained.cut) == (4, 0)  # the EngineCore ran out of work: all four finished
    timed_out = report(before, RequestCounts(2, 11), 60.0, 60, "timeout")
    assert (timed_out.in_flight, timed_out.finished, timed_out.cut) == (4, 1, 3)
    assert timed_out.line == "vllm serve drained in 60.0 s (limit 60 s): 1 request(s) finished, 3 cut"
    gone = report(None, None, 0.1, 60, "")
    assert not gone.answered and gone.line == "vllm serve did not answer /metrics; stopped in 0.1 s, nothing counted"


KEEP = """
import inspect, signal
import ray._private.utils as ray_utils
import ray._private.worker as ray_worker
from dspark_launch.node.serve_entry import keep_vllms_sigterm_handler
# ray.init installs its handler through this module attribute, before it connects:
assert "ray._private.utils.set_sigterm_handler(sigterm_handler)" in inspect.getsource(ray_worker.init)
{prepare}
def vllm_handler(signum, frame):
    pass
def rays_handler(signum, frame):
    pass
signal.signal(signal.SIGTERM, vllm_handler)
ray_utils.set_sigterm_handler(rays_handler)
kept = signal.getsignal(signal.SIGTERM) is vllm_handler
signal.signal(signal.SIGTERM, signal.SIG_DFL)
ray_utils.set_sigterm_handler(rays_handler)
print(kept, signal.getsignal(signal.SIGTERM) is rays_handler)
"""


def test_rays_sigterm_handler_leaves_vllms_in_place_only_through_the_entry_shim():
    def outcome(prepare: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-c", KEEP.format(prepare=prepare)], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    assert outcome("") == "False True"  # Ray's own sys.exit replaces vLLM's drain: why the shim exists
    assert outcome("keep_vllms_sigterm_handler()") == "True True"  # with none installed, Ray's goes in


ROUTED = """
import os, pickle, sys, tempfile
from pathlib import Path
from dspark_launch.node import serve_entry as entry
# The warm server's own steps before go (its fork server's import, vLLM's parser on its arguments, vLLM's server
# module), a go already said: none of it loads vLLM's scheduler module, the file the hotfix patches while a
# starting server waits (a `start` applies the hotfix beside it).
go = Path(tempfile.mkdtemp()) / "go"
go.write_text(entry.GO)
entry.warm_up(["--model", sys.argv[1], "--max-num-seqs", "4"], go, 5)
SCHEDULER = "vllm.v1.core.sched.scheduler"
assert SCHEDULER not in sys.modules and not go.exists()
entry.start_engine_core_through_this_module()
from vllm.v1.engine.core import EngineCoreProc
import inspect, vllm.v1.engine.utils as engine_utils
# vLLM reads the class attribute when it starts the EngineCore process:
assert "target=EngineCoreProc.run_engine_core" in inspect.getsource(engine_utils.CoreEngineProcManager.__init__)
target = EngineCoreProc.run_engine_core
# A spawned child finds it by module and name (pickled by reference), and then runs vLLM's own:
assert target is entry.run_engine_core and pickle.loads(pickle.dumps(target)) is entry.run_engine_core
assert entry._VLLM_RUN_ENGINE_CORE.__module__ == "vllm.v1.engine.core"
print("ok")

# A warm server: its fork server imports vLLM's engine core during the wait; after go, vLLM's module hands out
# the entry's context (vLLM takes the EngineCore's context from that module's name, when it starts it):
entry.start_engine_core_from_the_fork_server()
assert "context = get_mp_context()" in inspect.getsource(engine_utils.CoreEngineProcManager.__init__)
context = engine_utils.get_mp_context()
assert isinstance(context, entry.EngineCoreContext), context
os.environ["SET_AROUND_START"] = "yes"  # as vLLM sets variables around start()
report = Path(tempfile.mkdtemp()) / "child"
code = ("import os, sys; from pathlib import Path; "
        "Path(%r).write_text(repr((os.environ.get('SET_AROUND_START'), 'vllm.v1.engine.core' in sys.modules, "
        "%r in sys.modules, os.getppid())))" % (str(report), SCHEDULER))
child = context.Process(target=exec, args=(code,))
child.start(); child.join(60)
said, imported, scheduler_loaded, parent = eval(report.read_text())
assert not scheduler_loaded  # the EngineCore imports it itself, after go: the hotfixed file
os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
print(said, imported, parent != os.getpid(), engine_utils.get_mp_context().get_start_method())
"""


def test_the_engine_core_starts_through_the_entry_shim_and_a_warm_one_comes_from_the_fork_server(tiny_model):
    """The EngineCore runs the entry's run_engine_core. A warm server's fork server imports vLLM's engine core during
    the wait; the EngineCore vLLM would spawn after go is forked from it (already imported: not this process's
    child), with the variables of the moment vLLM starts it; an operator's VLLM_WORKER_MULTIPROC_METHOD=fork is
    kept as vLLM's. Nothing before go loads vLLM's scheduler module (the hotfix's file, patched while a start's
    server waits). (One interpreter for all of it: each imports vLLM.)"""
    from dspark_launch.node.serve_entry import ENGINE_CORE_IMPORTS

    for name in ENGINE_CORE_IMPORTS:
        assert importlib.util.find_spec(name) is not None, name  # the fork server skips a missing one silently
    env = {**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}  # as vLLM's CLI and its CPU platform set it
    proc = subprocess.run(
        [sys.executable, "-c", ROUTED, str(tiny_model)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "DSPARK-ARGCHECK ok" in lines and lines[-2:] == ["ok", "yes True True fork"], proc.stdout[-2000:]


NO_ABORT = """
import ray._private.ray_constants as ray_constants
from dspark_launch.node import serve_entry as entry
before = ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
entry._VLLM_RUN_ENGINE_CORE = lambda *args, **kwargs: (before, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER, kwargs)
print(entry.run_engine_core(dp_rank=0))
"""


def test_the_engine_core_runs_without_rays_failure_signal_handler():
    """Ray's core worker reads ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER when ray.init makes it; left on,
    Abseil's handler aborts the EngineCore 3 s after the drain's SIGTERM (entry.no_rays_failure_signal_handler)."""
    raylet = importlib.util.find_spec("ray._raylet").origin
    assert b"RAY_DISABLE_FAILURE_SIGNAL_HANDLER" in Path(raylet).read_bytes()  # the name the installed Ray reads
    env = {k: v for k, v in os.environ.items() if k != "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"}
    proc = subprocess.run([sys.executable, "-c", NO_ABORT], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Ray's default is the handler; vLLM's own run_engine_core is called with it off, and with its arguments.
    assert proc.stdout.strip().splitlines()[-1] == "(False, True, {'dp_rank': 0})"


def test_a_warm_server_serves_only_on_go_used_once_and_gives_up_without_one(tmp_path):
    """serve_entry's go wait: `go` starts it (the file removed: never a second start from it), anything else or
    nothing within the wait does not."""
    from dspark_launch.node.serve_entry import go_said

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            self.now += seconds

    go = tmp_path / "x.go"
    clock = Clock()
    assert not go_said(go, 2.0, clock, clock.sleep) and clock.now >= 2.0  # nobody said go: it gives up
    go.write_text("go\n")
    assert go_said(go, 2.0, clock, clock.sleep) and not go.exists()
    go.write_text("stop\n")
    assert not go_said(go, 2.0, clock, clock.sleep)
