"""Scheduler hotfixes for the installed vLLM (issue 27: cap concurrent partial prefills)."""

from dspark_launch.hotfix.issue27_patch import (
    DIAG_ENV_VAR,
    ENV_VAR,
    MAX_INFLIGHT_CAP,
    PATCH_VERSION,
    Result,
    apply,
    check,
    find_target,
    main,
    parse_cap,
    revert,
    status,
    vllm_version,
)

__all__ = [
    "DIAG_ENV_VAR",
    "ENV_VAR",
    "MAX_INFLIGHT_CAP",
    "PATCH_VERSION",
    "Result",
    "apply",
    "check",
    "find_target",
    "main",
    "parse_cap",
    "revert",
    "status",
    "vllm_version",
]
