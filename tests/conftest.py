"""Registers the shared fixtures (tests/support/fixtures.py) and names the failing step of a
scenario test (tests/support/steps.py)."""

import pytest

from tests.support.fixtures import (_remove_short_scratch, clean_environ, hub, hub_online, model_dir,  # noqa: F401
                                    step, testbed, testbed_clean, tiny_model)
from tests.support.steps import name_the_step


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Exception as error:
        name_the_step(item, error)
        raise
