"""Scheduler hotfixes for the installed vLLM (issue 27: cap concurrent partial prefills).

`contract` holds the facts every side agrees on; `injected` the code that goes
into vLLM's scheduler.py; `layout` where it goes; `patch_tool` the tool
(status/check/apply/revert); `tools/hotfix_bundle.py` builds the standalone script in patches/.
"""

from dspark_launch.hotfix.contract import CAP_MAX, ENV_CAP, ENV_DIAG, ENV_GATE_MODE, PATCH_VERSION
from dspark_launch.hotfix.patch_tool import Result, apply, check, find_target, main, revert, status, vllm_version

__all__ = [
    "CAP_MAX",
    "ENV_CAP",
    "ENV_DIAG",
    "ENV_GATE_MODE",
    "PATCH_VERSION",
    "Result",
    "apply",
    "check",
    "find_target",
    "main",
    "revert",
    "status",
    "vllm_version",
]
