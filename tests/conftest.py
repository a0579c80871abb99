"""Shared fixtures. Helpers for the config tests live here; heavier ones in their own modules."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed.fixture import testbed, testbed_clean  # noqa: F401  (the two-node testbed)

REPO = Path(__file__).resolve().parent.parent
REGISTRY_SH = REPO / "dspark-numeric-knobs.sh"


def run_dspark(args, env=None, cwd=None, timeout=60):
    """Run the real CLI in a subprocess, with a clean DSPARK_/knob-free environment plus `env`."""
    base = {k: v for k, v in os.environ.items() if not _is_ours(k)}
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "dspark_launch", *args], capture_output=True, text=True,
                          env=base, cwd=cwd or REPO, timeout=timeout)


def _is_ours(name: str) -> bool:
    from dspark_launch.config.registry import load_registry
    from dspark_launch.config.settings import known_names

    return name in known_names(load_registry()) or name.startswith("DSPARK")


@pytest.fixture(autouse=True)
def _remove_short_scratch(tmp_path):
    """Tests that serve put vLLM's sockets in a short folder outside tmp_path; remove it after each test."""
    yield
    from tests.launcher_env import scratch

    shutil.rmtree(scratch(tmp_path), ignore_errors=True)


@pytest.fixture
def clean_environ():
    """An environment dict without any of our settings, for resolve(environ=...)."""
    return {k: v for k, v in os.environ.items() if not _is_ours(k)}


@contextlib.contextmanager
def vllm_dirs_restored():
    """VLLM_CACHE_ROOT and VLLM_RPC_BASE_PATH as they were before the block, whatever it set."""
    saved = {k: os.environ.get(k) for k in ("VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH")}
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """vLLM dirs under a temp folder (unless the run already set them), and one
    stock scheduler built up front (the first construction inspects the model
    in a subprocess, ~7 s)."""
    from dspark_launch.bench import harness

    base = tmp_path_factory.mktemp("issue27")
    with vllm_dirs_restored():
        path = harness.prepare_environment(base)
        harness.build_scheduler(harness.SchedulerSpec(), path)
        yield path
