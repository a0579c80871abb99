"""The `step` helper of the long scenario tests: a failure names the step it happened in."""

from __future__ import annotations

import types

import pytest

from tests.support.steps import name_the_step, step_recorder


def item_in(step_name: str | None):
    item = types.SimpleNamespace(stash=pytest.Stash())
    if step_name is not None:
        step_recorder(item)(step_name)
    return item


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_an_assertion_names_the_last_step_begun():
    item = item_in("start")
    step_recorder(item)("restart")
    error = raised(AssertionError("assert 1 == 2"))
    name_the_step(item, error)
    assert str(error) == "step 'restart': assert 1 == 2"
    bare = raised(AssertionError())
    name_the_step(item, bare)
    assert str(bare) == "step 'restart'"


def test_another_exception_keeps_its_message_and_gets_a_note():
    error = raised(KeyError("server"))
    name_the_step(item_in("status"), error)
    assert error.args == ("server",) and error.__notes__ == ["in step 'status'"]


def test_without_a_step_or_for_pytests_own_outcomes_nothing_changes():
    error = raised(AssertionError("assert 1 == 2"))
    name_the_step(item_in(None), error)
    assert error.args == ("assert 1 == 2",)
    with pytest.raises(pytest.skip.Exception) as skipped:
        pytest.skip("no testbed")
    name_the_step(item_in("start"), skipped.value)
    assert skipped.value.msg == "no testbed" and not getattr(skipped.value, "__notes__", None)
