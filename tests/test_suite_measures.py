"""The tools that prove the suite's coverage kept: the before/after line comparison and the deliberate
breaks, against the tree they measure."""

from __future__ import annotations

from tools.deliberate_breaks import BREAKS, ROOT
from tools.suite_coverage import line_changes

OLD = ["def f():", "    a = 1", "    b = 2", "    return a + b"]


def test_an_unchanged_line_run_before_and_not_after_is_lost_and_the_reverse_gained():
    before = {"serve/x.py": (OLD, {2, 3, 4}, {2, 3, 4})}
    after = {"serve/x.py": (["# a new comment", *OLD], {3, 4, 5}, {3, 5})}
    changes = line_changes(before, after)
    assert changes.compared == 3 and changes.lost == {"serve/x.py": ["4: b = 2"]} and changes.gained == 0
    changes = line_changes(after, before)
    assert changes.compared == 2 and changes.lost == {} and changes.gained == 1


def test_an_edited_line_is_not_compared_and_a_moved_module_is_matched_by_its_name():
    edited = ["def f():", "    a = 10", "    b = 2", "    return a + b"]
    before = {"agent/x.py": (OLD, {2, 3, 4}, {2, 3, 4}), "agent/gone.py": (OLD, {2}, {2})}
    after = {"node/x.py": (edited, {2, 3, 4}, {3, 4}), "node/other.py": (["x = 1"], {1}, {1})}
    changes = line_changes(before, after)
    assert changes.moved == {"agent/x.py": "node/x.py"}
    assert changes.compared == 2 and changes.lost == {}  # line 2 changed: not counted as lost
    # A same-named module less than half alike is not a move.
    unlike = {"node/x.py": (["import os", "print(os.sep)", "x = 3", "y = 4", "z = 5"], {1, 2}, {1, 2})}
    assert line_changes(before, unlike).moved == {}


def test_every_deliberate_break_edits_text_found_once_and_names_tests_that_exist():
    for brk in BREAKS:
        assert (ROOT / brk.path).read_text().count(brk.old) == 1, brk.name
        for test in brk.tests + brk.before_tests:
            path, _, name = test.partition("::")
            assert (ROOT / path).is_file(), (brk.name, test)
            assert not name or f"def {name}(" in (ROOT / path).read_text(), (brk.name, test)
