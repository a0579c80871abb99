"""The `vllm serve` command and its environment, built once from the settings."""

from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dspark_launch.agent.port_holder import bind_address
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.config.profile_resolve import Decision, KvCacheChoice, ResolvedProfile
from dspark_launch.config.secret_digest import secret_digests
from dspark_launch.config.settings import Settings
from dspark_launch.errors import ConfigError
from dspark_launch.hotfix.contract import ENV_CONTROL, LIVE_SETTINGS
from dspark_launch.node.fabric import FabricEnv

ENTRY_MODULE = "dspark_launch.node.serve_entry"
VLLM_CONFIG_DIR = "vllm-config"  # in the state folder: VLLM_CONFIG_ROOT of vllm serve (its non-carry-over list)
CONTROL_FILE = "scheduler-control"  # in the state folder: the scheduler's live values (`dspark reload`)
SECRET_ENV = ("VLLM_API_KEY", "DSPARK_API_KEYS", "RAY_AUTH_TOKEN")
ACCESS_LOG_OFF = "--disable-uvicorn-access-log"  # vLLM 0.32 to 0.34 (vllm/entrypoints/.../cli_args.py FrontendArgs)


@dataclass(frozen=True, kw_only=True)
class ServeSpec:
    """What `vllm serve` on the head runs with: its argv, environment and the values the launcher records and
    waits by. Not `dspark plan`'s report (serve/plan_report.py `Plan`), which shows one of these among the rest."""

    serve_args: tuple[str, ...]  # what follows `vllm serve`: the model first
    env: tuple[tuple[str, str], ...]  # public environment of the server
    secret_env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    host: str = "127.0.0.1"  # `--host`: a literal address (VLLM_HOST=localhost resolved as vLLM would bind it)
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
    profile: str = ""
    decisions: tuple[Decision, ...] = ()  # the profile's resolution, each with its reason
    chat: bool = False  # readiness (and smoke) use a chat completion
    kv_cache_dtype: str = "auto"  # the layout the KV cache is stored in (kv_cache.layout): what memory sizes
    kv_cache: KvCacheChoice = KvCacheChoice("auto", "auto", False)
    max_model_len: int = 0
    gpu_memory_utilization: float = 0.9
    revision: str = ""
    config_root: str = ""  # VLLM_CONFIG_ROOT: the head writes the non-carry-over list there
    drain_timeout_s: int = 0  # the --shutdown-timeout passed (0: none, stop aborts in-flight requests)
    control_file: str = ""  # the scheduler's control file (ENV_CONTROL), written by `dspark reload`
    secret_digests: tuple[tuple[str, str], ...] = ()  # salted, recorded so a rotated key is drift
    vllm_version: str = ""  # the head's installed vLLM (the memory pre-flight applies its release's rule)

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", ENTRY_MODULE, "--model", *self.serve_args]

    @property
    def base_url(self) -> str:
        """Where the launcher's own requests go: the literal address vLLM binds (`host`), loopback of its family
        for a wildcard; never a name, so the port check and the connection are about one address."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def full_env(self) -> dict[str, str]:
        return {**dict(self.env), **dict(self.secret_env)}


def live_environment(settings: Settings) -> dict[str, str]:
    """The live settings as the patched scheduler reads them from its environment at start (each knob is
    named after its setting: `DSPARK_PREFILL_AGING` is `settings.dspark_prefill_aging`)."""
    values = {s.name: getattr(settings, s.name.lower()) for s in LIVE_SETTINGS}
    return {name: str(int(v)) if isinstance(v, bool) else str(v) for name, v in values.items()}


def build_serve_spec(
    settings: Settings,
    spec: ClusterSpec,
    ray_env: dict[str, str],
    resolved: ResolvedProfile,
    head_fabric: FabricEnv | None,
    model_env: tuple[tuple[str, str], ...] = (),
) -> ServeSpec:
    """Built once per command from the profile resolved against the head's vLLM, plus the launcher's own
    flags; `ray_env`: RAY_AUTH_MODE (+ token) for the Ray driver in vLLM; `head_fabric`: the head's own;
    `model_env`: what serving the verified copy of the weights needs (the hub offline), over everything else."""
    tp = spec.gpus_per_node * len(spec.nodes)
    model, *rest = resolved.serve_args
    # VLLM_HOST=localhost resolved here, once, as vLLM's own bind would (its first IPv4 address), and vLLM given
    # that address: the URL the launcher records, checks and connects to is the very address the server binds.
    host = api_address(settings)
    # uvicorn's access log off: its lines carry no vLLM prefix and the client address in them is whatever a
    # client on 127.0.0.1 sends as X-Forwarded-For (uvicorn trusts 127.0.0.1 by default), so any local user
    # could write a line of their choosing into the log the launcher reads (node/engine_log.py).
    args = [
        model,
        "--host",
        host,
        "--port",
        str(settings.vllm_port),
        "--distributed-executor-backend",
        "ray",
        "--tensor-parallel-size",
        str(tp),
        ACCESS_LOG_OFF,
        *rest,
    ]
    config_root = spec.state_dir / VLLM_CONFIG_DIR
    env = dict(spec.forwarded)  # first: the launcher's own values below always win over a forwarded name
    env.update(spec.node_env)
    env.update(head_fabric.env if head_fabric else ())
    env.update(resolved.env)
    env["VLLM_CONFIG_ROOT"] = str(config_root)
    env.update(
        {
            **live_environment(settings),
            ENV_CONTROL: str(spec.state_dir / CONTROL_FILE),
            "RAY_ADDRESS": spec.ray_address,
            "VLLM_HOST_IP": spec.head.ip,
            "HF_HUB_OFFLINE": str(int(settings.hf_hub_offline)),
            "RAY_USAGE_STATS_ENABLED": "0",
            "VLLM_NO_USAGE_STATS": "1",
        }
    )
    secret = {k: v for k, v in ray_env.items() if k in SECRET_ENV}
    env.update({k: v for k, v in ray_env.items() if k not in SECRET_ENV})
    env.update(model_env)
    if settings.vllm_api_key:
        secret["VLLM_API_KEY"] = settings.vllm_api_key
    if settings.dspark_api_keys:
        secret["DSPARK_API_KEYS"] = settings.dspark_api_keys
    return ServeSpec(
        serve_args=tuple(args),
        env=tuple(sorted(env.items())),
        secret_env=tuple(sorted(secret.items())),
        host=host,
        port=settings.vllm_port,
        served_name=resolved.served_name,
        model=model,
        tensor_parallel_size=tp,
        cap=settings.dspark_max_inflight_prefills,
        python=spec.head.transport.python,
        client_key=api_key(settings),
        start_timeout_s=settings.start_timeout_s,
        health_timeout_s=settings.health_timeout_s,
        settings=tuple(settings.public_values().items()),
        settings_digest=settings.digest(),
        profile=resolved.profile,
        decisions=resolved.decisions,
        chat=resolved.chat,
        kv_cache_dtype=resolved.kv_cache.layout,
        kv_cache=resolved.kv_cache,
        max_model_len=resolved.max_model_len,
        gpu_memory_utilization=resolved.gpu_memory_utilization,
        revision=resolved.revision,
        config_root=str(config_root),
        drain_timeout_s=resolved.drain_timeout_s,
        control_file=str(spec.state_dir / CONTROL_FILE),
        secret_digests=tuple(sorted(secret_digests(settings).items())),
        vllm_version=resolved.vllm_version,
    )


def api_address(settings: Settings) -> str:
    """VLLM_HOST as the literal address vLLM binds (agent/port_holder.bind_address); `localhost` must resolve
    to loopback (the settings let it go without a key as loopback)."""
    try:
        host = bind_address(settings.vllm_host)
    except OSError as exc:
        raise ConfigError(
            f"VLLM_HOST={settings.vllm_host}: does not resolve on this machine ({exc}); set an address (127.0.0.1)"
        ) from None
    if settings.vllm_host == "localhost" and not ipaddress.ip_address(host).is_loopback:
        raise ConfigError(f"VLLM_HOST=localhost resolves to {host} here, not to loopback; set VLLM_HOST=127.0.0.1")
    return host


def api_key(settings: Settings) -> str:
    """A key clients can use (the first one), or "" when the API is open."""
    return settings.vllm_api_key or (settings.dspark_api_keys.split() or [""])[0]


def local_model_dir(model: str) -> Path | None:
    path = Path(model).expanduser()
    return path if path.is_dir() else None
