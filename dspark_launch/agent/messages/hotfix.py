"""Each node's version row and the scheduler hotfix (handlers/hotfix.py)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.agent.protocol import Request
from dspark_launch.node.values import VersionRow as VersionRow


@dataclass(frozen=True)
class HotfixResult:
    """The part of the hotfix tool's result the launcher reads (hotfix.Result has more)."""

    action: str
    code: int
    state: str
    message: str
    vllm_version: str = ""
    patch_version: int | None = None
    applied_patch_version: int | None = None  # the patch version a marker in the file names (ours left there)
    changed: bool = False  # the action wrote the file


@dataclass(frozen=True)
class HotfixApplyAnswer:
    hostname: str
    apply: HotfixResult
    status: HotfixResult

    @property
    def failed(self) -> HotfixResult | None:
        return self.apply if self.apply.code != 0 else (self.status if self.status.code != 0 else None)


@dataclass(frozen=True)
class HotfixCheckAnswer:
    hostname: str
    check: HotfixResult  # code 0 (state not-applied, applied or outdated): start's apply would go ahead


@dataclass(frozen=True)
class HotfixRevertAnswer:
    hostname: str
    revert: HotfixResult  # code 0: reverted, or nothing of ours to revert
    status: HotfixResult  # the file afterwards


@dataclass(frozen=True)
class VersionQuery(Request["VersionRow"]):
    """This node's row of the version matrix (files and metadata only: nothing imported)."""


@dataclass(frozen=True)
class HotfixApply(Request["HotfixApplyAnswer"]):
    """Apply the scheduler hotfix to the vLLM this node's interpreter (Ray's) imports, then verify it."""


@dataclass(frozen=True)
class HotfixCheck(Request["HotfixCheckAnswer"]):
    """Read-only: the hotfix tool's `check` on the scheduler this node's interpreter (Ray's) imports, the verdict
    start's apply would reach (`dspark plan`)."""


@dataclass(frozen=True)
class HotfixRevert(Request["HotfixRevertAnswer"]):
    """DSPARK_HOTFIX=off: our patch, where an earlier start left it, reverted from the original its marker keeps
    (nothing else written), then the file's status: the node serves vLLM's own scheduler."""
