"""`DSPARK_FORWARD_ENV`: the names the launcher passes from its environment to every node's Ray and to vllm serve.

Forwarded values reach every Ray daemon and worker on every node, running as root there. An allow-list: a name
is forwarded only when it belongs to one of the families below (ALLOWED), each reviewed with the reason every
name in it is safe; anything else is refused with one line (exit 2, nothing started). A deny-list kept missing
names (RAY_JOB_CONFIG_JSON_ENV_VAR put PYTHONPATH into Ray's workers; TMPDIR moves the fork server's socket
folder; CA bundles, OpenTelemetry endpoints and headers, FORWARDED_ALLOW_IPS all passed).

REFUSED_NAMES stays, checked first: it names why a well-known name is refused (a secret, a loader, a path, a
name the launcher sets, ...), so the error says more than "not reviewed", and it keeps an allowed family from
ever taking in a name of a refused kind. The cluster layer applies the forwarded values first, so the
launcher's own always win. How a new name is judged: docs/security.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dspark_launch.config.checks import Refused, looks_secret


@dataclass(frozen=True)
class Family:
    """Names reviewed together: exact `names`, and/or a narrow whole-name `pattern`; `why` each is safe."""

    title: str
    why: str
    names: tuple[str, ...] = ()
    pattern: str = ""

    def holds(self, name: str) -> bool:
        return name in self.names or bool(self.pattern and re.fullmatch(self.pattern, name, re.ASCII))

    @property
    def shown(self) -> str:
        """The family's members as the docs and errors list them."""
        return ", ".join((*self.names, *([self.pattern.replace("[A-Z0-9_]+", "*")] if self.pattern else [])))


# The allow-list. Names are exact (case included); a pattern only where a family is a set of switches of one
# component. A name here that also matches REFUSED_NAMES is refused (a test keeps the two apart).
ALLOWED: tuple[Family, ...] = (
    Family(
        "NCCL's log level",
        "NCCL's output into the node's log (its own file, NCCL_DEBUG_FILE, is refused)",
        ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"),
    ),
    Family(
        "NCCL's algorithms, protocols and sizes",
        "words or numbers; no path, address, library or interface (NCCL_IB_*, NCCL_NET and *_SOCKET_IFNAME "
        "are the launcher's)",
        (
            "NCCL_ALGO",
            "NCCL_PROTO",
            "NCCL_MIN_NCHANNELS",
            "NCCL_MAX_NCHANNELS",
            "NCCL_MIN_CTAS",
            "NCCL_MAX_CTAS",
            "NCCL_NTHREADS",
            "NCCL_BUFFSIZE",
            "NCCL_P2P_LEVEL",
            "NCCL_P2P_DISABLE",
            "NCCL_SHM_DISABLE",
            "NCCL_NVLS_ENABLE",
            "NCCL_LAUNCH_MODE",
            "NCCL_NET_GDR_LEVEL",
            "NCCL_NET_GDR_READ",
            "NCCL_SOCKET_NTHREADS",
            "NCCL_NSOCKS_PERTHREAD",
            "NCCL_DMABUF_ENABLE",
        ),
    ),
    Family(
        "torch's NCCL process group",
        "watchdog switches and time limits (its dumps, TORCH_NCCL_DUMP_ON_TIMEOUT and TORCH_NCCL_DEBUG_INFO_*, "
        "are refused)",
        (
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "TORCH_NCCL_BLOCKING_WAIT",
            "TORCH_NCCL_ENABLE_MONITORING",
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
            "TORCH_NCCL_AVOID_RECORD_STREAMS",
        ),
    ),
    Family(
        "CPU threads and the memory allocator",
        "numbers or fixed words",
        (
            "OMP_NUM_THREADS",
            "OMP_PROC_BIND",
            "OMP_PLACES",
            "MKL_NUM_THREADS",
            "OPENBLAS_NUM_THREADS",
            "MALLOC_ARENA_MAX",
            "MALLOC_TRIM_THRESHOLD_",
            "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_TOP_PAD_",
        ),
    ),
    Family(
        "GPU visibility and CUDA's launch queue",
        "numbers or fixed words",
        (
            "CUDA_VISIBLE_DEVICES",
            "CUDA_DEVICE_ORDER",
            "CUDA_DEVICE_MAX_CONNECTIONS",
            "CUDA_LAUNCH_BLOCKING",
            "CUDA_MODULE_LOADING",
        ),
    ),
    Family("the time zone", "a `:FILE` value is read as zone data only", ("TZ",)),
    Family(
        "vLLM's CPU backend",
        "sizes and CPU lists (the test platform)",
        ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"),
    ),
    Family(
        "vLLM's IPC socket folder",
        "where vLLM makes its ZMQ IPC sockets, under random names (default: the temporary folder); use a "
        "folder only the serving user can write",
        ("VLLM_RPC_BASE_PATH",),
    ),
    Family(
        "vLLM's kernel, buffer and time-limit switches",
        "on/off, backend, size or time limit; no path, address, code or client feature (a profile's switches: "
        "DSPARK_PROFILE_ENV)",
        (
            "VLLM_USE_V2_MODEL_RUNNER",
            "VLLM_USE_AOT_COMPILE",
            "VLLM_MEMORY_PROFILE_INCLUDE_ATTN",
            "VLLM_USE_DEEP_GEMM_E8M0",
            "VLLM_MOE_USE_DEEP_GEMM",
            "VLLM_USE_NCCL_SYMM_MEM",
            "VLLM_ALLREDUCE_USE_SYMM_MEM",
            "VLLM_ALLREDUCE_USE_FLASHINFER",
            "VLLM_USE_FUSED_MOE_GROUPED_TOPK",
            "VLLM_MLA_DISABLE",
            "VLLM_DISABLE_PYNCCL",
            "VLLM_DISABLE_SHARED_EXPERTS_STREAM",
            "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER",
            "VLLM_B12X_MOE_FP4_FORCE_A16",
            "VLLM_MARLIN_USE_ATOMIC_ADD",
            "VLLM_ENABLE_CUDAGRAPH_GC",
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
            "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE",
            "VLLM_MQ_MAX_CHUNK_BYTES_MB",
            "VLLM_ENGINE_READY_TIMEOUT_S",
            "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
            "VLLM_LOG_STATS_INTERVAL",
        ),
    ),
    Family(
        "the b12x image's kernel switches",
        "on/off switches of its patched kernels (its cache, B12X_CUTE_COMPILE_CACHE_DIR, is refused)",
        ("B12X_MLA_SM120_UNIFIED", "B12X_MOE_FORCE_A8"),
        r"VLLM_USE_B12X_[A-Z0-9_]+",
    ),
    Family(
        "the launcher's test hooks",
        "read only by the test platform and the testbed's fake sysfs",
        (),
        r"DSPARK_TEST_[A-Z0-9_]+",
    ),
)

NOT_REVIEWED = "not a name the launcher reviewed for forwarding"

# (pattern, why): the first match refuses a name, allowed family or not. Whole-name regexes, matched in upper case.
REFUSED_NAMES: tuple[tuple[str, str], ...] = (
    (r"VLLM_API_KEY|DSPARK_API_KEYS|RAY_AUTH_TOKEN", "a secret, handed only to the process that needs it"),
    (r"(AWS|AZURE|GOOGLE|GCLOUD|CLOUDSDK|GCP|OCI|S3)_.*", "cloud credentials, endpoints or their pointers"),
    (r"(LD|DYLD)_.*|GLIBC_TUNABLES|GCONV_PATH", "the dynamic loader: loads code into every process"),
    (r"PYTHON.*", "a Python variable (PYTHONPATH, PYTHONHOME, ...): runs or imports code"),
    (
        r"PATH|ENV|BASH_ENV|BASH_FUNC_.*|SHELLOPTS|BASHOPTS|PS4|IFS|CDPATH|PROMPT_COMMAND",
        "a shell variable: picks programs or runs code",
    ),
    (
        r"PERL5?LIB|PERL5OPT|RUBYOPT|RUBYLIB|NODE_OPTIONS|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS",
        "an interpreter variable: loads code",
    ),
    (
        r"RAY_RUNTIME_ENV_HOOK|RAY_ADDRESS|RAY_AUTH_MODE|VLLM_HOST_IP|HOME|USER|LOGNAME",
        "set by the launcher, or imports code into Ray",
    ),
    # Every other name the launcher sets on a node (ray_cluster.node_env, the serve spec, the fabric,
    # the model pre-flight, the profiles): its per-node value is the launcher's (a test keeps this in step).
    (
        r"NCCL_IB_.*|NCCL_NET|NCCL_(SOCKET|GLOO|TP)_IFNAME|(GLOO|TP)_SOCKET_IFNAME|NCCL_CROSS_NIC|NCCL_CUMEM_ENABLE"
        r"|NCCL_IGNORE_CPU_AFFINITY|RAY_MEMORY_MONITOR_REFRESH_MS|RAY_CGRAPH_GET_TIMEOUT|RAY_USAGE_STATS_ENABLED"
        r"|RAY_ENABLE_METRICS_COLLECTION|HF_HUB_OFFLINE|HF_HUB_CACHE|VLLM_CONFIG_ROOT|VLLM_NO_USAGE_STATS"
        r"|DSPARK_(?!TEST_).*",
        "set by the launcher on every node (use its setting)",
    ),
    # Also every JIT cache a node container points at its host folder (cluster/container_engine.JIT_CACHE_VARS).
    (
        r".*PLUGIN.*|NCCL_CONF_FILE|CUDA_INJECTION64_PATH|CUDA_HOME|CUDA_PATH|TRITON_.*|TORCHINDUCTOR_.*"
        r"|TORCH_EXTENSIONS_DIR|.*CACHE(_DIR|_PATH|_ROOT|_HOME)?|HF_HOME|XDG_.*|FLASHINFER_WORKSPACE_BASE",
        "a library, plugin or cache of code it loads or runs (NCCL_NET_PLUGIN, TRITON_CACHE_DIR, ...)",
    ),
    (
        r"TMPDIR|TMP|TEMP|TEMPDIR|RAY_TMPDIR|RAY_TEMPDIR",
        "the temporary folder (the fork server's socket folder, Ray's and torch's files): another writer could take "
        "those names",
    ),
    (r"RAY_(DEBUG|PDB).*", "Ray's debugger: a port on the node that asks no token"),
    (
        r"RAY_.*",
        "Ray's configuration (RAY_JOB_CONFIG_JSON_ENV_VAR, spill folders, ...): can give Ray's workers another "
        "Python path or folder",
    ),
    (
        r"VLLM_.*DEV_MODE|VLLM_.*INSECURE.*|VLLM_ALLOW_RUNTIME_LORA_UPDATING|VLLM_USE_MODELSCOPE"
        r"|VLLM_RAY_EXTRA_ENV_VAR.*|VLLM_MEDIA_URL_ALLOW_REDIRECTS|VLLM_ENABLE_RESPONSES_API_STORE",
        "opens vLLM to clients or other code: /collective_rpc, pickle, runtime adapters, ModelScope, more "
        "environment in Ray's workers, redirects, an unbounded response store",
    ),
    (
        r"VLLM_LOGGING_.*|VLLM_CONFIGURE_LOGGING|VLLM_PROCESS_NAME_PREFIX|NO_COLOR|FORCE_COLOR"
        r"|VLLM_ENABLE_V1_MULTIPROCESSING|VLLM_WORKER_MULTIPROC_METHOD|VLLM_USE_RUST_FRONTEND",
        "changes the log lines the launcher reads (prefix, format, level, colours, process names) or how the "
        "EngineCore starts",
    ),
    (
        r"FORWARDED_ALLOW_IPS|UVICORN_.*|WEB_CONCURRENCY",
        "uvicorn's settings: FORWARDED_ALLOW_IPS=* lets any client choose its logged address",
    ),
    (
        r"SSL_.*|.*CA_BUNDLE|.*CA_CERTS?|GRPC_.*|CURL_.*|REQUESTS_.*|HTTPX_.*",
        "what TLS clients trust: another trust store lets a server pass as the hub or a peer",
    ),
    (r"(HTTPS?|FTP|ALL|NO|WSS?)_PROXY", "a proxy every HTTP client would send through"),
    (
        r"OTEL_.*|.*OTLP.*|.*_ENDPOINT(_URL)?|.*_URL|.*_URI|.*_SERVER|.*_HOST|.*_HOSTNAME|.*_ADDR|.*_ADDRESS|.*_IP"
        r"|.*_IPS|.*_PORT|NCCL_COMM_ID|MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK",
        "an address, endpoint or header set to send data to or listen on (OpenTelemetry, usage reports, "
        "torch.distributed's rendezvous, ...)",
    ),
    (
        r"TORCH_.*(DEBUG|TRACE|DUMP|LOGS|_FILE|_DIR).*|TORCHDYNAMO_.*|TORCH_COMPILE_.*|KINETO_.*|PYTORCH_JIT_LOG.*",
        "torch's debug, trace and dump output, and files root writes",
    ),
    (
        r"(?!VLLM_RPC_BASE_PATH$|DSPARK_TEST_).*(_DIR|_DIRECTORY|_PATH|_FILE|_FOLDER|_ROOT|_LOC)|NCCL_.*_FILE"
        r"|.*PROFILER_DIR",
        "a path root writes to or reads code or configuration from (VLLM_NCCL_SO_PATH, NCCL_DEBUG_FILE, ...; "
        "VLLM_RPC_BASE_PATH is allowed)",
    ),
    (
        r"SSH_AUTH_SOCK|SSH_AGENT_PID|KRB5CCNAME|DOCKER_CONFIG|KUBECONFIG|NETRC|PGPASSFILE|GIT_ASKPASS|SSH_ASKPASS",
        "an agent, credential file or helper",
    ),
)
_COMPILED = tuple((re.compile(pattern, re.ASCII), why) for pattern, why in REFUSED_NAMES)


PROFILE_ENV_WHY = "a model profile's variable (change it with DSPARK_PROFILE_ENV)"


def profile_env_names() -> frozenset[str]:
    """Every variable a model profile sets on the nodes (profiles/catalog.py, import-free data)."""
    from dspark_launch.profiles.catalog import all_profiles

    return frozenset(var.name for profile in all_profiles() for var in profile.env)


def refused_kind(name: str) -> str | None:
    """Why a name of a refused kind (a secret, REFUSED_NAMES) may never be forwarded, or None."""
    if looks_secret(name):
        return "it looks like a secret (key, token, password, credential)"
    upper = name.upper()
    for pattern, why in _COMPILED:
        if pattern.fullmatch(upper):
            return why
    return None


def allowed_family(name: str) -> Family | None:
    """The reviewed family `name` belongs to (REFUSED_NAMES aside), or None."""
    return next((family for family in ALLOWED if family.holds(name)), None)


def refusal(name: str, *, profile_names_allowed: bool = False) -> str | None:
    """Why `name` may not be forwarded, or None when a reviewed family holds it. With profile_names_allowed
    (DSPARK_PROFILE_ENV, which the profile's own check limits to the names the profile sets) only names of a
    refused kind are refused here."""
    if not profile_names_allowed and name in profile_env_names():
        return PROFILE_ENV_WHY
    why = refused_kind(name)
    if why or profile_names_allowed:
        return why
    return None if allowed_family(name) else NOT_REVIEWED


def allowed_summary(per_family: int = 2) -> str:
    """What an error line offers as allowed: each family with its first names (docs/configuration.md lists all)."""

    def few(family: Family) -> str:
        members = family.shown.split(", ")
        return ", ".join(members[:per_family]) + (", ..." if len(members) > per_family else "")

    return "; ".join(f"{family.title} ({few(family)})" for family in ALLOWED)


def check_forward_names(names: list[str], *, profile_names_allowed: bool = False) -> None:
    for name in names:
        why = refusal(name, profile_names_allowed=profile_names_allowed)
        if why:
            allowed = (
                "names of variables that are no secret, path, address or code hook"
                if profile_names_allowed
                else f'the reviewed names, by family (every one in docs/configuration.md, "Names '
                f'DSPARK_FORWARD_ENV accepts"): {allowed_summary()}'
            )
            raise Refused(f"names {name}: {why}; allowed: {allowed}")
