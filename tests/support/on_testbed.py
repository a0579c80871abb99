"""`dspark` run inside the testbed's head node: env files for the testbed, the launcher's
environment, the deployment record it writes, the processes it leaves."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.support.launcher_env import cluster_values, launcher_env, scratch, serving_values, write_env_file
from tests.support.processes import cmdline, start_time

VENV_BIN = Path(sys.executable).parent
SCHEDULER_REL = "lib/python3.11/site-packages/vllm/v1/core/sched/scheduler.py"
API_KEY = "sk-dspark-test-7f3a9c2e41"


def write_env(tb, tmp_path: Path, **extra: str) -> Path:
    values = {**cluster_values(tb, tmp_path / "state"), "CLUSTER_JOIN_TIMEOUT_S": "60", **extra}
    return write_env_file(tmp_path / "dspark.env", values)


def serving_env(tb, tmp_path: Path, model: Path, **extra: str) -> Path:
    values = {
        **serving_values(model),
        "DSPARK_ISSUE43_SCHED_DIAG": "1",
        "START_TIMEOUT_S": "400",
        "VLLM_API_KEY": API_KEY,
    }
    return write_env(tb, tmp_path, **{**values, **extra})


def scheduler_sha(tb, node: str) -> str:
    """sha256 of the vLLM scheduler.py a node's Python (this venv's path) imports."""
    out = tb.exec(node, ["sha256sum", str(VENV_BIN.parent / SCHEDULER_REL)], check=True)
    return out.stdout.split()[0]


def set_knob(env_file: Path, name: str, value: str) -> None:
    lines = [l for l in env_file.read_text().splitlines() if not l.startswith(f"{name}=")]
    env_file.write_text("\n".join(lines + [f"{name}={value}"]) + "\n")


def dspark(tb, env_file: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`dspark ARGS --env-file ENV` in the head node, without the test plugin's environment."""
    return tb.exec("head", [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)], timeout=timeout)


def run(
    tb, tmp_path: Path, env_file: Path, *args: str, timeout: float = 600, launcher: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`dspark ARGS --env-file ENV` in the head node, with the test plugin's environment (or `launcher`)."""
    return tb.exec(
        "head",
        [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)],
        env=launcher or launcher_env(scratch(tmp_path)),
        timeout=timeout,
    )


def popen(
    tb, tmp_path: Path, env_file: Path, *args: str, merge: bool = False, launcher: dict[str, str] | None = None
) -> subprocess.Popen:
    return tb.popen(
        "head",
        [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)],
        env=launcher or launcher_env(scratch(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        text=True,
    )


def launcher_without_vllm(tmp_path: Path) -> dict[str, str]:
    """The launcher's environment with vLLM, Ray and torch unimportable (a PYTHONPATH folder shadows each): whatever
    touches them runs in a node's agent, whose interpreter has them; the launcher needs neither."""
    blocked = tmp_path / "blocked"
    for name in ("vllm", "ray", "torch"):
        (blocked / name).mkdir(parents=True, exist_ok=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not for the launcher')\n")
    return {**launcher_env(scratch(tmp_path)), "PYTHONPATH": str(blocked)}


def state(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "state" / "state.json").read_text())


def read_until_served(proc) -> list[str]:
    """Lines of a `start --foreground` (stdout with stderr merged) up to the last hotfix line; asserts it served."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("hotfix worker1:"):
            break
    assert any(l.startswith("serving ") for l in seen), "".join(seen)[-4000:]
    return seen


def interrupt_after(
    proc: subprocess.Popen, marker: str, delay: float, sig: int, timeout: float
) -> tuple[list[str], str]:
    """Send `sig` to a running `dspark` `delay` s after `marker` appears on its stderr.

    Returns (stderr lines up to the marker, the rest of stderr); the process has ended."""
    seen: list[str] = []
    err = ""
    try:
        for line in proc.stderr:
            seen.append(line)
            if marker in line:
                time.sleep(delay)
                proc.send_signal(sig)
                break
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return seen, err


def our_pids(tb, node: str) -> set[int]:
    return tb.pids_in(node, include_infra=False)


def ours_left(tb, unrelated: set[int]) -> set[int]:
    return (tb.pids_in("head", include_infra=False) | tb.pids_in("worker1", include_infra=False)) - unrelated


def spawn_lookalike(tb, node: str, title: str, *argv: str) -> tuple[int, int]:
    """An unrelated process shown as `title` (argv[0]) in its own session, running `argv`: (pid, start time)."""
    proc = tb.popen(
        node,
        ["bash", "-c", 'exec -a "$0" "$@"', title, *argv],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not cmdline(proc.pid).startswith(title):
        time.sleep(0.05)
    assert cmdline(proc.pid).startswith(title), cmdline(proc.pid)
    return proc.pid, start_time(proc.pid)


def processes_named(tb, node: str, needle: str) -> list[int]:
    """Pids on `node` (testbed infrastructure left out) whose command line contains `needle`."""
    return [pid for pid in tb.pids_in(node, include_infra=False) if needle in cmdline(pid)]


def status(tb, tmp_path: Path, env_file: Path, launcher: dict[str, str] | None = None) -> tuple[int, dict]:
    """`dspark status --json` on the head: (exit code, the JSON)."""
    proc = run(tb, tmp_path, env_file, "status", "--json", launcher=launcher)
    return proc.returncode, json.loads(proc.stdout)
