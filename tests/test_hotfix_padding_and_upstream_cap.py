"""The patch file steps aside where vLLM enforces a
partial-prefill cap of its own, and it never touches a request vLLM padded
for speculative decoding (the v5 crash), on the installed 0.32 text."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dspark_launch.hotfix import layout
from dspark_launch.hotfix import patch_tool as patch
from dspark_launch.hotfix.contract import EXIT_UNSUPPORTED
from tests.support.patched_overrides import first_chunk_overrides
from tools import hotfix_bundle as bundle


@pytest.fixture
def target(scheduler_copy):
    return scheduler_copy


UPSTREAM_LINES = (
    # vLLM PR #49075's shape: schedule() reads the configured partial-prefill cap.
    "        self._max_partial = self.scheduler_config.max_num_partial_prefills\n",
    # The option discussed in vLLM issue #57413.
    "        self._max_partial = self.scheduler_config.max_concurrent_prefills\n",
)


@pytest.mark.parametrize("line", UPSTREAM_LINES, ids=["max_num_partial_prefills", "max_concurrent_prefills"])
def test_the_patch_steps_aside_where_vllm_caps_partial_prefills_itself(target, line):
    anchor = "        self.scheduler_config = vllm_config.scheduler_config\n"
    text = target.read_text()
    target.write_text(text.replace(anchor, anchor + line, 1))
    before = target.read_bytes()
    for action in (patch.check, patch.apply):
        result = action(target)
        assert result.code == EXIT_UNSUPPORTED and "steps aside" in result.message, result
        assert "\n" not in result.message
        assert target.read_bytes() == before
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(bundle.SCRIPT), "apply", "--target", str(target)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == EXIT_UNSUPPORTED and "steps aside" in proc.stdout + proc.stderr
    assert target.read_bytes() == before


def test_the_installed_vllm_does_not_cap_partial_prefills_itself(target):
    assert patch.apply(target).code == 0


def test_no_chunk_override_reaches_a_padded_request():
    """Every site that sets a waiting request's first chunk is guarded by
    `not pad_spec_decode` on layouts that pad (0.25+)."""
    text = patch.find_target().read_text()
    assert layout.pads(text)
    patched = layout.render_patched(text.encode()).decode()
    overrides = first_chunk_overrides(patched)
    assert len(overrides) == 2 and all("not pad_spec_decode" in line for line in overrides), overrides
    assert "min(token_budget, input_budget - draft_slots)" in patched


def test_a_padding_the_hotfix_does_not_know_is_refused_and_the_file_left_alone(target):
    """The padding flag set without its reset before it (a form the guard cannot read) refuses check and apply,
    one line, exit 4, the file as it was: the hotfix never sizes a chunk vLLM padded."""
    text = target.read_text()
    variant = text.replace("pad_spec_decode = False\n", "pad_spec_decode = bool(0)\n")
    assert variant != text
    target.write_text(variant)
    for action in (patch.check, patch.apply):
        result = action(target)
        assert result.code == EXIT_UNSUPPORTED and "\n" not in result.message, result
        assert "pad_spec_decode" in result.message, result
        assert target.read_text() == variant


def test_the_first_waiting_requests_come_from_the_heap_in_its_order_without_a_copy():
    import heapq
    import random

    from dspark_launch.hotfix import injected

    values = [random.Random(7).randrange(10_000) for _ in range(1024)]
    heap = list(values)
    heapq.heapify(heap)
    before = list(heap)
    queue = type("PriorityQueue", (), {"_heap": heap})()
    assert injected._dspark_hotfix_first_waiting(queue, 8) == sorted(values)[:8]
    assert queue._heap is heap and heap == before  # walked, not popped or copied
    assert injected._dspark_hotfix_first_waiting([5, 3, 9], 2) == [5, 3]  # FCFS: the queue's own order


def test_aging_is_bounded_in_steps_whatever_k():
    from types import SimpleNamespace

    from dspark_launch.hotfix import contract, injected

    sched = SimpleNamespace(_dspark_aging=contract.AGING_MAX)
    prompt = SimpleNamespace(_dspark_seen=0, _dspark_solo=1024)  # a 1M-token prompt at threshold 1024
    assert not injected._dspark_hotfix_aged(sched, prompt, contract.AGING_MAX_WAIT_STEPS)
    assert injected._dspark_hotfix_aged(sched, prompt, contract.AGING_MAX_WAIT_STEPS + 1)
    short = SimpleNamespace(_dspark_seen=0, _dspark_solo=1)
    assert injected._dspark_hotfix_aged(SimpleNamespace(_dspark_aging=2.0), short, 3)


def test_a_failing_close_of_the_control_file_stays_out_of_schedule(tmp_path, monkeypatch):
    from dspark_launch.hotfix import contract, injected

    control = tmp_path / "control"
    control.write_text(contract.control_text({contract.ENV_CAP: "2"}))
    control.chmod(0o600)
    import os
    import types

    closed = []

    def failing_close(fd):
        os.close(fd)
        closed.append(fd)
        raise OSError(5, "Input/output error")

    # The helpers' own `os` seen through a module whose close fails (the real os untouched).
    proxy = types.ModuleType("os_with_a_failing_close")
    proxy.__dict__.update({name: getattr(os, name) for name in dir(os) if not name.startswith("__")})
    proxy.close = failing_close
    monkeypatch.setattr(injected, "_dspark_hotfix_os", proxy)
    assert injected._dspark_hotfix_live_read(str(control)) == ({contract.ENV_CAP: "2"}, None)
    assert closed
