"""The disk check `make test` runs before pytest (tests/support/disk_room.py).

Sizes are set against the filesystem's total, not its free space: other pytest workers write (the container test
image, gigabytes) while these run.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from tests.support import disk_room
from tests.support.disk_room import GIB, Need, shortfalls


def test_a_filesystem_with_too_little_room_is_one_problem_naming_the_numbers(tmp_path):
    need = shutil.disk_usage(tmp_path).total + GIB
    problems, lines = shortfalls([Need("the run's own files in TMPDIR", tmp_path, need)])
    assert lines == [] and len(problems) == 1
    assert re.match(rf"\d+\.\d GiB free on the filesystem of {re.escape(str(tmp_path))}; ", problems[0])
    assert f"needs about {need / GIB:.1f} GiB there" in problems[0]
    assert "for the run's own files in TMPDIR" in problems[0]


def test_needs_on_one_filesystem_add_up_and_a_folder_not_made_yet_is_measured_at_its_parent(tmp_path):
    half = shutil.disk_usage(tmp_path).total // 2 + GIB  # the two together more than the whole disk
    store = tmp_path / "store" / "not-yet"
    problems, lines = shortfalls([Need("a", tmp_path, half), Need("b", store, half)])
    assert lines == [] and len(problems) == 1 and f"{tmp_path} and {store}" in problems[0]
    problems, lines = shortfalls([Need("a", tmp_path, GIB // 4), Need("b", store, GIB // 4)])
    assert problems == [] and len(lines) == 1 and "needs about 0.5 GiB" in lines[0]


def test_the_image_counts_until_the_store_holds_it(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_room, "image_present", lambda venv, repo: False)
    sizes = [n.size for n in disk_room.needs(Path(sys.prefix), tmp_path)]
    assert sizes == [disk_room.RUN_BYTES, disk_room.IMAGE_BUILD_BYTES]
    monkeypatch.setattr(disk_room, "image_present", lambda venv, repo: True)
    assert [n.size for n in disk_room.needs(Path(sys.prefix), tmp_path)] == [disk_room.RUN_BYTES]
