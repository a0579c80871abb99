"""The supervisor's memory watch and guard without a server: when admission closes and opens again (the floor, the
pressure, the hysteresis), what it writes to the scheduler's control file (the values in force, admission closed, an
operator's own reload kept), that it releases what it closed, and what `status` shows. Put in force on the real
scheduler: tests/test_hotfix_admission.py; on two real nodes: tests/test_platform_testbed.py."""

from __future__ import annotations

import pytest

from dspark_launch.cluster.state import ServerRecord
from dspark_launch.config.settings import resolve
from dspark_launch.hotfix import contract
from dspark_launch.serve import memory_guard as mg

GIB = 1 << 30


def node(available_gib: float, some: float | None = 0.0) -> mg.NodeMemory:
    return mg.NodeMemory(120 * GIB, int(available_gib * GIB), some, 0.0 if some is not None else None)


def test_admission_closes_below_the_floor_or_at_the_pressure_and_opens_with_a_hysteresis():
    floor, pct = 4096, 10.0
    assert mg.judge({"head": node(10), "worker1": node(9)}, False, floor, pct) == (False, "")
    closed, why = mg.judge({"head": node(10), "worker1": node(3)}, False, floor, pct)
    assert closed and why == "worker1: MemAvailable 3072 MiB below DSPARK_MEMORY_FLOOR_MIB 4096"
    closed, why = mg.judge({"head": node(10, some=12.5)}, False, floor, pct)
    assert closed and why == "head: memory pressure 12.5% (PSI some avg10) at or above DSPARK_MEMORY_PRESSURE_PCT 10"
    # Closed: back above the floor is not enough, 1.5 x it is; the pressure must fall below half.
    assert mg.judge({"worker1": node(5)}, True, floor, pct)[0]
    assert mg.judge({"worker1": node(7, some=6.0)}, True, floor, pct)[0]
    assert mg.judge({"worker1": node(7, some=4.0), "head": node(10, some=None)}, True, floor, pct) == (
        False,
        "every node above 6144 MiB available and below 5% pressure",
    )


def server(**live: str) -> ServerRecord:
    return ServerRecord(
        marker="run-1",
        log="/nonexistent/vllm-serve.log",
        url="http://127.0.0.1:8888",
        served_name="tiny",
        model="m",
        started_at=0.0,
        digest="d",
        cap=1,
        settings={"DSPARK_MAX_INFLIGHT_PREFILLS": "1", contract.ENV_ADMISSION: "0", "MAX_NUM_SEQS": "6"},
        live=dict(live),
        control_file="/nonexistent/control",
    )


def test_the_control_file_is_the_values_in_force_with_admission_closed():
    assert mg.control_values(server(DSPARK_MAX_INFLIGHT_PREFILLS="2"), True) == {
        "DSPARK_MAX_INFLIGHT_PREFILLS": "2",
        contract.ENV_ADMISSION: "1",
    }
    assert mg.control_values(server(), False) == {"DSPARK_MAX_INFLIGHT_PREFILLS": "1", contract.ENV_ADMISSION: "0"}
    # An operator who closed admission by reload keeps it closed when the guard opens.
    assert mg.control_values(server(DSPARK_ADMISSION_CLOSED="1"), False)[contract.ENV_ADMISSION] == "1"


@pytest.fixture
def guard(monkeypatch, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = tmp_path / "dspark.env"
    env.write_text(f"DSPARK_STATE_DIR={state}\nDSPARK_MEMORY_GUARD=pause\nDSPARK_MEMORY_FLOOR_MIB=4096\n")
    settings = resolve(env_file=str(env), environ={})
    spec = type("Spec", (), {"state_dir": state})()
    samples: list[dict] = []
    written: list[bool] = []
    told: list[str] = []
    noted: list[str] = []
    monkeypatch.setattr(mg, "sample", lambda spec: samples.pop(0))
    monkeypatch.setattr(mg, "put_in_force", lambda spec, srv, closed: written.append(closed) or "in force")
    clock = [1000.0]
    made = mg.Guard(settings, spec, told.append, lambda srv, line: noted.append(line), lambda: clock[0])
    return made, samples, written, told, noted, clock, state


def test_the_guard_switches_once_per_crossing_logs_each_change_and_releases_at_the_end(guard):
    made, samples, written, told, noted, clock, state = guard
    samples += [
        {"head": node(10)},
        {"head": node(3)},
        {"head": node(3.5)},
        {"head": node(5.5)},
        {"head": node(7)},
        {"head": node(2)},
    ]
    for _ in range(5):
        made.look(server())
        made.look(server())  # within MEMORY_CHECK_S: not sampled again
        clock[0] += mg.MEMORY_CHECK_S
    assert written == [True, False]
    assert told == [
        "memory guard: admission closed: head: MemAvailable 3072 MiB below DSPARK_MEMORY_FLOOR_MIB 4096: in force",
        "memory guard: admission open again: every node above 6144 MiB available and below 5% pressure: in force",
    ]
    assert noted == told
    made.look(server())
    assert made.state.closed and mg.held_values(state, "run-1") == {contract.ENV_ADMISSION: "1"}
    watch = mg.load(state)
    assert watch.guard.closed and watch.nodes["head"].available_bytes == 2 * GIB
    made.release(server())
    assert written[-1] is False and told[-1] == "memory guard: admission open again: supervision ended: in force"
    assert mg.held_values(state, "run-1") == {}


def test_off_only_samples():
    assert mg.GuardState().mode == "off"


def test_status_shows_the_sample_and_the_guard():
    from dspark_launch.cli.status_view import status_renderables
    from dspark_launch.serve.status import ServerView, ServiceStatus

    watch = mg.MemoryWatch(
        "m",
        100.0,
        {"head": node(3, some=1.5)},
        mg.GuardState("pause", True, 90.0, "head: MemAvailable 3072 MiB below ..."),
    )
    view = ServiceStatus(
        state="up",
        ray_address="a:1",
        config_digest="d",
        started_at=1.0,
        checked_at=2.0,
        problems=(),
        nodes=(),
        server=ServerView(state="up", pid=7),
        memory=watch,
    )
    text = "\n".join(
        getattr(r, "plain", str(r)) for r in status_renderables(view, ".env.dspark", rich=False, now=103.0)
    )
    assert "memory (the supervisor's, 3 s ago): head 3.0 of 120.0 GiB available, pressure some 1.5% full 0.0%" in text
    assert "  memory guard (DSPARK_MEMORY_GUARD=pause): admission closed since " in text
    assert view.to_data()["memory"]["guard"]["closed"] is True
