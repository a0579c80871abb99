"""Named steps of a long scenario test: a failure says which step it happened in.

A test takes the `step` fixture and calls `step("restart")` where a new stage begins; nothing
is indented. When the test fails, the hook in tests/conftest.py puts the current step in front
of an assertion's message (`step 'restart': assert ...`) and adds it as a note to any other
exception, so the report and its one-line summary name the stage.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

CURRENT_STEP = pytest.StashKey[str]()


def step_recorder(item: pytest.Item) -> Callable[[str], None]:
    """What the `step` fixture gives a test: call it with the name of the stage that begins."""

    def begin(name: str) -> None:
        item.stash[CURRENT_STEP] = name

    return begin


def name_the_step(item: pytest.Item, error: BaseException) -> None:
    """Mark `error`, raised by `item`'s body, with the step it was in (if it named any)."""
    name = item.stash.get(CURRENT_STEP, None)
    if name is None or not isinstance(error, Exception):  # pytest's skip/fail/exit are not test failures
        return
    if isinstance(error, AssertionError):
        first = f"step {name!r}: {error.args[0]}" if error.args else f"step {name!r}"
        error.args = (first, *error.args[1:])
    else:
        error.add_note(f"in step {name!r}")
