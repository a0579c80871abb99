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
    Family("NCCL's log level",
           "how much NCCL prints to the process's own output, which goes to the node's log (a file of its own, "
           "NCCL_DEBUG_FILE, is refused)",
           ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS")),
    Family("NCCL's algorithms, protocols and sizes",
           "a word or number NCCL reads to pick an algorithm, protocol, channel count or buffer size: no path, "
           "address, library or interface (the fabric's NCCL_IB_*, NCCL_NET and *_SOCKET_IFNAME are the launcher's)",
           ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS",
            "NCCL_NTHREADS", "NCCL_BUFFSIZE", "NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
            "NCCL_NVLS_ENABLE", "NCCL_LAUNCH_MODE", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_SOCKET_NTHREADS",
            "NCCL_NSOCKS_PERTHREAD", "NCCL_DMABUF_ENABLE")),
    Family("torch's NCCL process group",
           "switches and time limits of torch's NCCL watchdog (its dumps and trace files, TORCH_NCCL_DUMP_ON_TIMEOUT "
           "and TORCH_NCCL_DEBUG_INFO_*, are refused)",
           ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_ENABLE_MONITORING",
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_AVOID_RECORD_STREAMS")),
    Family("CPU threads and the memory allocator",
           "thread counts, CPU placement and glibc malloc sizes, read as numbers or fixed words",
           ("OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_TOP_PAD_")),
    Family("GPU visibility and CUDA's launch queue",
           "which GPUs a process sees, in what order, and how CUDA queues and loads its kernels: numbers and fixed "
           "words",
           ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_LAUNCH_BLOCKING",
            "CUDA_MODULE_LOADING")),
    Family("the time zone", "the zone of the logs' timestamps (a `:FILE` value is read as zone data, nothing else)",
           ("TZ",)),
    Family("vLLM's CPU backend",
           "the KV cache size and thread binding of vLLM's CPU backend (the test platform): numbers and CPU lists",
           ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")),
    Family("vLLM's IPC socket folder",
           "where vLLM's server makes its ZMQ IPC sockets, each under a random name (default: the temporary "
           "folder); point it at a folder only the serving user can write",
           ("VLLM_RPC_BASE_PATH",)),
    Family("vLLM's kernel, buffer and time-limit switches",
           "an on/off switch, backend name, size or time limit of a kernel or buffer vLLM ships: no path, "
           "address, code or feature for API clients (the switches a profile sets go through DSPARK_PROFILE_ENV)",
           ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_AOT_COMPILE", "VLLM_MEMORY_PROFILE_INCLUDE_ATTN",
            "VLLM_USE_DEEP_GEMM_E8M0", "VLLM_MOE_USE_DEEP_GEMM", "VLLM_USE_NCCL_SYMM_MEM",
            "VLLM_ALLREDUCE_USE_SYMM_MEM", "VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_USE_FUSED_MOE_GROUPED_TOPK",
            "VLLM_MLA_DISABLE", "VLLM_DISABLE_PYNCCL", "VLLM_DISABLE_SHARED_EXPERTS_STREAM",
            "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "VLLM_B12X_MOE_FP4_FORCE_A16", "VLLM_MARLIN_USE_ATOMIC_ADD",
            "VLLM_ENABLE_CUDAGRAPH_GC", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
            "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE", "VLLM_MQ_MAX_CHUNK_BYTES_MB", "VLLM_ENGINE_READY_TIMEOUT_S",
            "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "VLLM_LOG_STATS_INTERVAL")),
    Family("the b12x image's kernel switches",
           "on/off switches of the b12x image's patched kernels (docs/deepseek-v4-flash.md; its cache folder "
           "B12X_CUTE_COMPILE_CACHE_DIR is refused)",
           ("B12X_MLA_SM120_UNIFIED", "B12X_MOE_FORCE_A8"), r"VLLM_USE_B12X_[A-Z0-9_]+"),
    Family("the launcher's test hooks",
           "read only by the test platform (tests/vllm_ray_cpu_plugin) and the testbed's fake sysfs, which a "
           "product install does not use",
           (), r"DSPARK_TEST_[A-Z0-9_]+"),
)

NOT_REVIEWED = "not a name the launcher reviewed for forwarding"

# (pattern, why): the first match refuses a name, allowed family or not. Whole-name regexes, matched in upper case.
REFUSED_NAMES: tuple[tuple[str, str], ...] = (
    (r"VLLM_API_KEY|DSPARK_API_KEYS|RAY_AUTH_TOKEN", "a secret the launcher hands only to the process that needs it"),
    (r"(AWS|AZURE|GOOGLE|GCLOUD|CLOUDSDK|GCP|OCI|S3)_.*", "cloud credentials, endpoints or their pointers"),
    (r"(LD|DYLD)_.*|GLIBC_TUNABLES|GCONV_PATH", "a dynamic-loader variable: it loads code into every process"),
    (r"PYTHON.*", "a Python interpreter variable (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, ...): it runs or imports code"),
    (r"PATH|ENV|BASH_ENV|BASH_FUNC_.*|SHELLOPTS|BASHOPTS|PS4|IFS|CDPATH|PROMPT_COMMAND",
     "a shell variable that picks the programs or runs code"),
    (r"PERL5?LIB|PERL5OPT|RUBYOPT|RUBYLIB|NODE_OPTIONS|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS",
     "an interpreter variable that loads code"),
    (r"RAY_RUNTIME_ENV_HOOK|RAY_ADDRESS|RAY_AUTH_MODE|VLLM_HOST_IP|HOME|USER|LOGNAME",
     "a variable the launcher sets itself, or that imports code into Ray"),
    # Every other name the launcher sets on a node (ray_cluster.node_env, the serve spec, the fabric,
    # the model pre-flight, the profiles): its per-node value is the launcher's (a test keeps this in step).
    (r"NCCL_IB_.*|NCCL_NET|NCCL_(SOCKET|GLOO|TP)_IFNAME|(GLOO|TP)_SOCKET_IFNAME|NCCL_CROSS_NIC|NCCL_CUMEM_ENABLE"
     r"|NCCL_IGNORE_CPU_AFFINITY|RAY_MEMORY_MONITOR_REFRESH_MS|RAY_CGRAPH_GET_TIMEOUT|RAY_USAGE_STATS_ENABLED"
     r"|RAY_ENABLE_METRICS_COLLECTION|HF_HUB_OFFLINE|HF_HUB_CACHE|VLLM_CONFIG_ROOT|VLLM_NO_USAGE_STATS"
     r"|DSPARK_(?!TEST_).*",
     "a variable the launcher sets itself on every node (set it through its setting)"),
    # Also every JIT cache a node container points at its host folder (cluster/container_engine.JIT_CACHE_VARS).
    (r".*PLUGIN.*|NCCL_CONF_FILE|CUDA_INJECTION64_PATH|CUDA_HOME|CUDA_PATH|TRITON_.*|TORCHINDUCTOR_.*"
     r"|TORCH_EXTENSIONS_DIR|.*CACHE(_DIR|_PATH|_ROOT|_HOME)?|HF_HOME|XDG_.*|FLASHINFER_WORKSPACE_BASE",
     "a library or plugin it loads, or a cache of compiled or downloaded code it runs "
     "(NCCL_NET_PLUGIN, TRITON_CACHE_DIR, HF_MODULES_CACHE, VLLM_CACHE_ROOT, ...)"),
    (r"TMPDIR|TMP|TEMP|TEMPDIR|RAY_TMPDIR|RAY_TEMPDIR",
     "the temporary folder: Python's multiprocessing makes the fork server's socket folder there, Ray and torch "
     "their files; a folder another user can write lets them take those names"),
    (r"RAY_(DEBUG|PDB).*", "Ray's debugger (RAY_DEBUG, RAY_DEBUG_POST_MORTEM, ...): a debugger port on the node that "
     "asks no one for a token"),
    (r"RAY_.*",
     "Ray's own configuration (RAY_<setting> overrides, RAY_JOB_CONFIG_JSON_ENV_VAR's runtime environment, the "
     "plasma and spilling folders, ...): it can give every Ray worker another Python path or folder; the launcher "
     "sets what Ray needs"),
    (r"VLLM_.*DEV_MODE|VLLM_.*INSECURE.*|VLLM_ALLOW_RUNTIME_LORA_UPDATING|VLLM_USE_MODELSCOPE"
     r"|VLLM_RAY_EXTRA_ENV_VAR.*|VLLM_MEDIA_URL_ALLOW_REDIRECTS|VLLM_ENABLE_RESPONSES_API_STORE",
     "opens vLLM to its API clients or to other code: development endpoints such as /collective_rpc "
     "(VLLM_SERVER_DEV_MODE), pickled payloads, adapters loaded at run time, weights from ModelScope, more of the "
     "environment copied into Ray's workers, redirects followed for clients, responses kept without bound"),
    (r"VLLM_LOGGING_.*|VLLM_CONFIGURE_LOGGING|VLLM_PROCESS_NAME_PREFIX|NO_COLOR|FORCE_COLOR"
     r"|VLLM_ENABLE_V1_MULTIPROCESSING|VLLM_WORKER_MULTIPROC_METHOD|VLLM_USE_RUST_FRONTEND",
     "changes the server log the launcher reads by vLLM's EngineCore prefix (its prefix, format, level, colours, "
     "process names), or how the EngineCore is started (node/engine_log.py)"),
    (r"FORWARDED_ALLOW_IPS|UVICORN_.*|WEB_CONCURRENCY",
     "uvicorn's settings: FORWARDED_ALLOW_IPS=* lets any client set the client address the server logs"),
    (r"SSL_.*|.*CA_BUNDLE|.*CA_CERTS?|GRPC_.*|CURL_.*|REQUESTS_.*|HTTPX_.*",
     "which certificates and TLS settings the processes' clients trust (CA bundles, gRPC and HTTP client "
     "settings): a substitute trust store lets another server pass as the hub or a peer"),
    (r"(HTTPS?|FTP|ALL|NO|WSS?)_PROXY", "a proxy that every process's HTTP client would send its requests through"),
    (r"OTEL_.*|.*OTLP.*|.*_ENDPOINT(_URL)?|.*_URL|.*_URI|.*_SERVER|.*_HOST|.*_HOSTNAME|.*_ADDR|.*_ADDRESS|.*_IP"
     r"|.*_IPS|.*_PORT|NCCL_COMM_ID|MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK",
     "an address, endpoint or header set the processes would send data to or listen on (OpenTelemetry exporters "
     "and their headers, side channels, usage reporting, torch.distributed's rendezvous, ...)"),
    (r"TORCH_.*(DEBUG|TRACE|DUMP|LOGS|_FILE|_DIR).*|TORCHDYNAMO_.*|TORCH_COMPILE_.*|KINETO_.*|PYTORCH_JIT_LOG.*",
     "torch's debug, trace and dump output, with the file names it writes them to (root writes there)"),
    (r"(?!VLLM_RPC_BASE_PATH$|DSPARK_TEST_).*(_DIR|_DIRECTORY|_PATH|_FILE|_FOLDER|_ROOT|_LOC)|NCCL_.*_FILE"
     r"|.*PROFILER_DIR",
     "a path where the serving processes (root) write, or from which they read code or configuration "
     "(VLLM_LOGGING_CONFIG_PATH, VLLM_NCCL_SO_PATH, VLLM_TORCH_PROFILER_DIR, VLLM_DEBUG_DUMP_PATH, NCCL_DEBUG_FILE, "
     "...; VLLM_RPC_BASE_PATH, the folder of vLLM's IPC sockets under random names, is allowed)"),
    (r"SSH_AUTH_SOCK|SSH_AGENT_PID|KRB5CCNAME|DOCKER_CONFIG|KUBECONFIG|NETRC|PGPASSFILE|GIT_ASKPASS|SSH_ASKPASS",
     "an agent, credential file or credential helper"),
)
_COMPILED = tuple((re.compile(pattern, re.ASCII), why) for pattern, why in REFUSED_NAMES)


PROFILE_ENV_WHY = "a variable a model profile sets (change it with DSPARK_PROFILE_ENV)"


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
            allowed = ("names of variables that are no secret, path, address or code hook" if profile_names_allowed
                       else f"the reviewed names, by family (every one in docs/configuration.md, \"Names "
                            f"DSPARK_FORWARD_ENV accepts\"): {allowed_summary()}")
            raise Refused(f"names {name}: {why}; allowed: {allowed}")
