"""Registers the shared fixtures; they live in tests/support/fixtures.py."""

from tests.support.fixtures import (_remove_short_scratch, clean_environ, model_dir, testbed,  # noqa: F401
                                    testbed_clean, tiny_model)
