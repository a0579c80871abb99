"""The hotfix's first-chunk overrides in a patched scheduler's text, for the padding-guard tests."""

from __future__ import annotations


def first_chunk_overrides(patched: str) -> list[str]:
    """The hotfix's two conditions that set a waiting request's first chunk (mode 3's size, modes 1-3's limit)."""
    return [
        line
        for line in patched.splitlines()
        if "_dspark_limit" in line
        and line.strip().startswith("if ")
        and "num_new_tokens" not in line
        and "< 0" not in line
    ]
