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

    base = tmp_path_factory.mktemp("scheduler")
    with vllm_dirs_restored():
        path = harness.prepare_environment(base)
        harness.build_scheduler(harness.SchedulerSpec(), path)
        yield path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny random Llama (tests/support/tiny_model.py), built once per session (~4 s): tests read it,
    or copy it (shutil.copytree) before they change anything in it."""
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def installed_vllm_offer():
    """What the installed vLLM offers (node/vllm_offer.py), probed once per session in a subprocess
    (one cold `import vllm`, 10-20 s here): the real parser, shared by every module that reads it."""
    from dspark_launch.node.vllm_offer import probe_installed_vllm

    return probe_installed_vllm()


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


@pytest.fixture(scope="module")
def installed_scheduler() -> Path:
    """The installed vLLM's scheduler.py (read, never written)."""
    from dspark_launch.hotfix import patch_tool

    found = patch_tool.find_target()
    assert found.is_file()
    return found


@pytest.fixture
def scheduler_copy(tmp_path, installed_scheduler) -> Path:
    """A copy of the installed scheduler.py inside a vllm/ tree with its _version.py."""
    pkg = tmp_path / "site" / "vllm"
    dest = pkg / "v1" / "core" / "sched" / "scheduler.py"
    dest.parent.mkdir(parents=True)
    shutil.copyfile(installed_scheduler, dest)
    shutil.copyfile(installed_scheduler.parents[3] / "_version.py", pkg / "_version.py")
    return dest
