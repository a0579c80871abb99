"""Where the API key lives on the head (docs/security.md, "The API key"): `serve_entry` moves the keys from its
environment into Python's `sys.argv` (not the process's command line), and multiprocessing hands that `sys.argv`
to the EngineCore it starts, spawned or forked from the warm server's fork server; the fork server itself, started
before the keys reached `sys.argv`, never holds them."""

from __future__ import annotations

import os
import subprocess
import sys

KEY = "sk-dspark-key-path-0123456789"

SCRIPT = r"""
import os, sys, tempfile
from multiprocessing import forkserver, get_context
from pathlib import Path
from dspark_launch.node import serve_entry as entry

key = os.environ.pop("VLLM_API_KEY")  # serve_entry.main: the keys out of the environment first,
forkserver.ensure_running()  # then a warm server's fork server, while it waits for go (serve_entry.warm_up),
sys.argv = [sys.argv[0], "--model", "m", "--api-key", key]  # then the keys into sys.argv for vLLM's parser
reports = Path(tempfile.mkdtemp())
code = ("import os, sys; from pathlib import Path; "
        "Path(%r).write_text(repr(('--api-key' in sys.argv and %r in sys.argv, "
        "%r.encode() in Path('/proc/self/cmdline').read_bytes(), "
        "%r.encode() in Path('/proc/self/environ').read_bytes(), os.getppid())))")
for name, context in (("forked", entry.EngineCoreContext()), ("spawned", get_context("spawn"))):
    child = context.Process(target=exec, args=(code % (str(reports / name), key, key, key),))
    child.start(); child.join(120)
    in_argv, in_cmdline, in_environ, parent = eval((reports / name).read_text())
    fork_server = b""
    if name == "forked":
        assert parent != os.getpid()  # a child of the fork server, not of this process
        fork_server = Path(f"/proc/{parent}/cmdline").read_bytes() + Path(f"/proc/{parent}/environ").read_bytes()
    print(name, in_argv, in_cmdline, in_environ, key.encode() in fork_server)
print("own", key.encode() in Path("/proc/self/cmdline").read_bytes())
"""


def test_the_engine_core_holds_the_key_in_sys_argv_and_the_fork_server_never_does():
    env = {**os.environ, "VLLM_API_KEY": KEY}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    # in the child's sys.argv, not on its command line nor in its environment; never in the fork server
    assert lines == ["forked True False False False", "spawned True False False False", "own False"], proc.stdout
