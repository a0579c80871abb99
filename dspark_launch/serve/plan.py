"""The `vllm serve` command and its environment, built once from the settings."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.config.settings import Settings
from dspark_launch.hotfix.contract import ENV_CAP, ENV_DIAG, ENV_GATE_MODE

ENTRY_MODULE = "dspark_launch.serve.entry"
SECRET_ENV = ("VLLM_API_KEY", "DSPARK_API_KEYS", "RAY_AUTH_TOKEN")


@dataclass(frozen=True)
class ServePlan:
    serve_args: tuple[str, ...]  # what follows `vllm serve`: the model first
    env: tuple[tuple[str, str], ...]  # public environment of the server
    secret_env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    host: str = "127.0.0.1"
    port: int = 8888
    served_name: str = ""
    model: str = ""
    tensor_parallel_size: int = 1
    cap: int = 1
    python: str = sys.executable  # the head's interpreter (DSPARK_HEAD_PYTHON)
    client_key: str = field(default="", repr=False)  # what the launcher's own requests send (first key)
    start_timeout_s: int = 1800
    health_timeout_s: int = 5
    settings: tuple[tuple[str, str], ...] = ()  # public values, recorded for drift
    settings_digest: str = ""

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", ENTRY_MODULE, "--model", *self.serve_args]

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def full_env(self) -> dict[str, str]:
        return {**dict(self.env), **dict(self.secret_env)}


def serve_plan(settings: Settings, spec: ClusterSpec, ray_env: dict[str, str]) -> ServePlan:
    """Built once per command; `ray_env`: RAY_AUTH_MODE (+ token) for the Ray driver in vLLM."""
    tp = spec.gpus_per_node * len(spec.nodes)
    model = settings["DSPARK_MODEL"]
    args = [model, "--served-model-name", settings["DSPARK_SERVED_MODEL_NAME"],
            "--host", settings["VLLM_HOST"], "--port", settings["VLLM_PORT"],
            "--distributed-executor-backend", "ray", "--tensor-parallel-size", str(tp),
            "--max-num-seqs", settings["MAX_NUM_SEQS"],
            "--max-num-batched-tokens", settings["MAX_NUM_BATCHED_TOKENS"],
            "--long-prefill-token-threshold", settings["LONG_PREFILL_TOKEN_THRESHOLD"],
            "--max-model-len", settings["MAX_MODEL_LEN"],
            "--gpu-memory-utilization", settings["GPU_MEMORY_UTILIZATION"],
            "--enable-chunked-prefill",
            "--enable-prefix-caching" if settings.flag("ENABLE_PREFIX_CACHING") else "--no-enable-prefix-caching"]
    if settings["DSPARK_MODEL_REVISION"]:
        args += ["--revision", settings["DSPARK_MODEL_REVISION"]]
    args += settings.words("VLLM_EXTRA_ARGS")
    env = dict(spec.node_env)
    env.update(spec.forwarded)
    env.update({
        ENV_CAP: settings[ENV_CAP],
        ENV_GATE_MODE: settings[ENV_GATE_MODE],
        ENV_DIAG: settings[ENV_DIAG],
        "RAY_ADDRESS": spec.ray_address,
        "VLLM_HOST_IP": spec.head.ip,
        "HF_HUB_OFFLINE": settings["HF_HUB_OFFLINE"],
        "RAY_USAGE_STATS_ENABLED": "0",
        "VLLM_NO_USAGE_STATS": "1",
    })
    secret = {k: v for k, v in ray_env.items() if k in SECRET_ENV}
    env.update({k: v for k, v in ray_env.items() if k not in SECRET_ENV})
    if settings["VLLM_API_KEY"]:
        secret["VLLM_API_KEY"] = settings["VLLM_API_KEY"]
    if settings["DSPARK_API_KEYS"]:
        secret["DSPARK_API_KEYS"] = settings["DSPARK_API_KEYS"]
    return ServePlan(tuple(args), tuple(sorted(env.items())), tuple(sorted(secret.items())),
                     settings["VLLM_HOST"], settings.int("VLLM_PORT"), settings["DSPARK_SERVED_MODEL_NAME"], model, tp,
                     settings.int(ENV_CAP), spec.head.transport.python, api_key(settings),
                     settings.int("START_TIMEOUT_S"), settings.int("HEALTH_TIMEOUT_S"),
                     tuple(settings.public_values().items()), settings.digest())


def api_key(settings: Settings) -> str:
    """A key clients can use (the first one), or "" when the API is open."""
    return settings["VLLM_API_KEY"] or (settings["DSPARK_API_KEYS"].split() or [""])[0]


def local_model_dir(model: str) -> Path | None:
    path = Path(model).expanduser()
    return path if path.is_dir() else None
