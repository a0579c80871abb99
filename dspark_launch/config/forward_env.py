"""`DSPARK_FORWARD_ENV`: names never passed to every node's Ray and to vllm serve.

Forwarded values reach every Ray daemon and worker on every node. A secret there
leaves the API server's process tree; a loader, plugin, interpreter or code-cache variable
runs code chosen by the operator's shell in every process of the cluster; a name the
launcher sets would replace its per-node value. A deny-list by families, not an allowlist:
tuning variables (NCCL_*, UCX_*, OMP_*, MALLOC_*, VLLM_* knobs) are many and recipe-specific.
The cluster layer applies the forwarded values first, so the launcher's own always win.
"""

from __future__ import annotations

import re

from dspark_launch.config.checks import Refused, looks_secret

# (pattern, why): the first match refuses a name. Patterns are whole-name regexes.
REFUSED_NAMES: tuple[tuple[str, str], ...] = (
    (r"VLLM_API_KEY|DSPARK_API_KEYS|RAY_AUTH_TOKEN", "a secret the launcher hands only to the process that needs it"),
    (r"(AWS|AZURE|GOOGLE|GCLOUD|CLOUDSDK|GCP|OCI)_.*", "cloud credentials or their pointers"),
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
    # Issue 30, point 5: families, so that a name vLLM or Ray adds later is refused the day it appears.
    (r"RAY_(DEBUG|PDB).*", "Ray's debugger (RAY_DEBUG, RAY_DEBUG_POST_MORTEM, ...): a debugger port on the node that "
     "asks no one for a token"),
    (r"VLLM_.*DEV_MODE|VLLM_.*INSECURE.*|VLLM_ALLOW_RUNTIME_LORA_UPDATING|VLLM_USE_MODELSCOPE",
     "opens vLLM to its API clients or to other code: development endpoints such as /collective_rpc "
     "(VLLM_SERVER_DEV_MODE), pickled payloads, adapters loaded at run time, weights from ModelScope"),
    (r"(?!VLLM_RPC_BASE_PATH$)VLLM_.*(_DIR|_PATH|_FILE|_ROOT)|NCCL_.*_FILE|.*PROFILER_DIR",
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


def refusal(name: str, *, profile_names_allowed: bool = False) -> str | None:
    """Why `name` may not be forwarded (or, with profile_names_allowed, set through DSPARK_PROFILE_ENV), or None."""
    if looks_secret(name):
        return "it looks like a secret (key, token, password, credential)"
    if not profile_names_allowed and name in profile_env_names():
        return PROFILE_ENV_WHY
    upper = name.upper()
    for pattern, why in _COMPILED:
        if pattern.fullmatch(upper):
            return why
    return None


def check_forward_names(names: list[str], *, profile_names_allowed: bool = False) -> None:
    for name in names:
        why = refusal(name, profile_names_allowed=profile_names_allowed)
        if why:
            raise Refused(f"names {name}: {why}; allowed: names of harmless variables (e.g. NCCL_DEBUG TORCH_NCCL_ASYNC_ERROR_HANDLING)")
