"""The pytest fixtures the test modules share (registered by tests/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.launcher_env import clean_environ as _clean_environ
from tests.support.launcher_env import scratch, vllm_dirs_restored
from tests.support.steps import step_recorder
from tests.support.testbed.fixture import testbed, testbed_clean  # noqa: F401  (the two-node testbed)
from tests.support.tiny_model import build_tiny_model


@pytest.fixture(autouse=True)
def _remove_short_scratch(tmp_path):
    """Tests that serve put vLLM's sockets in a short folder outside tmp_path; remove it after each test."""
    yield
    shutil.rmtree(scratch(tmp_path), ignore_errors=True)


@pytest.fixture
def step(request):
    """`step("name")` marks where a stage of a long scenario begins; a failure names it."""
    return step_recorder(request.node)


@pytest.fixture
def clean_environ():
    """An environment dict without any of our settings, for resolve(environ=...)."""
    return _clean_environ()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """vLLM dirs under a temp folder (unless the run already set them), and one
    stock scheduler built up front (the first construction inspects the model
    in a subprocess, ~7 s)."""
    from tools import scheduler_harness as harness

    base = tmp_path_factory.mktemp("issue27")
    with vllm_dirs_restored():
        path = harness.prepare_environment(base)
        harness.build_scheduler(harness.SchedulerSpec(), path)
        yield path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny random Llama (tests/support/tiny_model.py), built once per test module."""
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def hub_online(monkeypatch):
    """The hub client allowed online, for tests that talk to the loopback hub (tests/support/hub_server.py)."""
    from tests.support.hub_server import online_hub

    online_hub(monkeypatch)


@pytest.fixture
def hub(tmp_path):
    """The tiny model served by a hub-compatible server on loopback."""
    from tests.support.hub_server import tiny_hub

    with tiny_hub(tmp_path / "src") as server:
        yield server
