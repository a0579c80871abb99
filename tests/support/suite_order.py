"""Suite-wide hooks (registered by tests/conftest.py): the loopback stack tests first, and time per module.

- `loopback` tests (one real vLLM + Ray stack on 127.0.0.1, no testbed) run before everything else:
  if the stack itself is broken, the run says so in its first two minutes, not after the testbed lives.
- At the end, the seconds each module took (setup, call and teardown of its tests summed), slowest
  first, so the next slow module is visible in every `make test` (beside pytest's `--durations`).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

LOOPBACK = "loopback"
_module_seconds: dict[str, float] = defaultdict(float)


def loopback_first(items: list) -> None:
    """Stable reorder in place: the items marked `loopback` first, the rest in their collected order."""
    items.sort(key=lambda item: item.get_closest_marker(LOOPBACK) is None)


def record(report) -> None:
    _module_seconds[report.nodeid.split("::", 1)[0]] += report.duration


def module_table(seconds: dict[str, float], limit: int = 0) -> list[str]:
    rows = sorted(seconds.items(), key=lambda kv: -kv[1])
    rows = rows[:limit] if limit else rows
    total = sum(seconds.values())
    return [f"{secs:8.1f} s  {100 * secs / total if total else 0:5.1f} %  {module}" for module, secs in rows] + [
        f"{total:8.1f} s  total over {len(seconds)} modules"]


def terminal_summary(terminalreporter) -> None:
    if not _module_seconds:
        return
    terminalreporter.write_sep("=", "seconds per test module (setup + call + teardown)")
    for line in module_table(_module_seconds):
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(items):
    loopback_first(items)


def pytest_runtest_logreport(report):
    record(report)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    terminal_summary(terminalreporter)
