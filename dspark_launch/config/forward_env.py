"""`DSPARK_FORWARD_ENV`: names never passed to every node's Ray and to vllm serve.

Forwarded values reach every Ray daemon and worker on every node. A secret there
leaves the API server's process tree; a loader or interpreter variable runs code
of the operator's shell in every process of the cluster.
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
    (r"RAY_RUNTIME_ENV_HOOK|RAY_ADDRESS|RAY_AUTH_MODE|VLLM_HOST_IP",
     "a variable the launcher sets itself, or that imports code into Ray"),
    (r"SSH_AUTH_SOCK|SSH_AGENT_PID|KRB5CCNAME|DOCKER_CONFIG|KUBECONFIG|NETRC|PGPASSFILE|GIT_ASKPASS|SSH_ASKPASS",
     "an agent, credential file or credential helper"),
)
_COMPILED = tuple((re.compile(pattern, re.ASCII), why) for pattern, why in REFUSED_NAMES)


def refusal(name: str) -> str | None:
    """Why `name` may not be forwarded, or None."""
    if looks_secret(name):
        return "it looks like a secret (key, token, password, credential)"
    upper = name.upper()
    for pattern, why in _COMPILED:
        if pattern.fullmatch(upper):
            return why
    return None


def check_forward_names(names: list[str]) -> None:
    for name in names:
        why = refusal(name)
        if why:
            raise Refused(f"names {name}: {why}; allowed: names of harmless variables (e.g. NCCL_DEBUG HF_HOME)")
