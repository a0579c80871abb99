"""Registers the shared fixtures (tests/support/fixtures.py), names the failing step of a
scenario test (tests/support/steps.py), runs the loopback stack tests first and prints the time
per module at the end (tests/support/suite_order.py)."""

import pytest

from tests.support.fixtures import (  # noqa: F401
    _remove_short_scratch,
    clean_environ,
    hub,
    hub_online,
    installed_scheduler,
    installed_vllm_offer,
    model_dir,
    scheduler_copy,
    step,
    testbed,
    testbed_clean,
    tiny_model,
)
from tests.support.steps import name_the_step
from tests.support.suite_order import pytest_collection_modifyitems, pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Exception as error:
        name_the_step(item, error)
        raise
