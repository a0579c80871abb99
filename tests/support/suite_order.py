"""Suite-wide hooks (registered by tests/conftest.py): the order modules run in, and time per module.

- `make test` runs the modules on three pytest-xdist workers, a module at a time each (`--dist loadfile`,
  in the order below: `--no-loadscope-reorder`), each worker with its own testbed. The order:
  `loopback` modules first (one real vLLM + Ray stack on 127.0.0.1, no testbed: if the stack itself is
  broken, the run says so in its first minutes), then the modules that serve, then the other testbed
  modules, then the rest, which fill the gaps at the end while the last long module finishes.
- At the end, the seconds each module took (setup, call and teardown of its tests summed), slowest
  first, so the next slow module is visible in every `make test` (beside pytest's `--durations`).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

LOOPBACK = "loopback"
#: Markers by rank: a module runs after every module that holds a test of a lower rank.
RANKS = (LOOPBACK, "serving", "testbed")
_module_seconds: dict[str, float] = defaultdict(float)


def rank(markers: set[str]) -> int:
    """0 for a loopback test, 1 serving, 2 testbed, 3 any other."""
    return next((i for i, name in enumerate(RANKS) if name in markers), len(RANKS))


def heavy_first(items: list) -> None:
    """Stable reorder in place, by module: each module at the rank of its heaviest test, its tests kept
    together and in their collected order (the workers take a module at a time, in this order)."""
    module_rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        item_rank = rank({mark.name for mark in item.iter_markers()})
        module_rank[module] = min(module_rank.get(module, item_rank), item_rank)
    first_seen = {module: i for i, module in enumerate(module_rank)}
    items.sort(key=lambda item: (module_rank[m := item.nodeid.split("::", 1)[0]], first_seen[m]))


def record(report) -> None:
    _module_seconds[report.nodeid.split("::", 1)[0]] += report.duration


def module_table(seconds: dict[str, float], limit: int = 0) -> list[str]:
    rows = sorted(seconds.items(), key=lambda kv: -kv[1])
    rows = rows[:limit] if limit else rows
    total = sum(seconds.values())
    return [f"{secs:8.1f} s  {100 * secs / total if total else 0:5.1f} %  {module}" for module, secs in rows] + [
        f"{total:8.1f} s  total over {len(seconds)} modules"
    ]


def terminal_summary(terminalreporter) -> None:
    if not _module_seconds:
        return
    terminalreporter.write_sep("=", "seconds per test module (setup + call + teardown)")
    for line in module_table(_module_seconds):
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(items):
    heavy_first(items)


def pytest_runtest_logreport(report):
    record(report)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    terminal_summary(terminalreporter)
