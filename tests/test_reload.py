"""`dspark reload` without a server process (issue 24): the refusal of non-live changes, the agent's
control-file operation, and the values the launcher waits for (the scheduler's own parsers)."""

from __future__ import annotations

import os
import stat

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.agent.handlers import control as control_op
from dspark_launch.cluster.spec import cluster_spec
from dspark_launch.cluster.state import Deployment, ServerRecord, ensure_state_dir, load_state, save_state
from dspark_launch.config.settings import resolve
from dspark_launch.errors import EXIT_BAD_CONFIG
from dspark_launch.hotfix import contract
from dspark_launch.report import SilentReporter
from dspark_launch.serve.reload import InForce, ReloadRefused, reload

EXAMPLE = "dspark_launch/config/env.dspark.example"


def settings_in(tmp_path, **changed: str):
    env = tmp_path / "dspark.env"
    lines = [
        f"DSPARK_STATE_DIR={tmp_path / 'state'}",
        "DSPARK_HEAD_IP=127.0.0.1",
        "DSPARK_WORKER_HOSTS=127.0.0.2",
        "DSPARK_FABRIC_IFNAME=lo",
    ] + [f"{k}={v}" for k, v in changed.items()]
    env.write_text("\n".join(lines) + "\n")
    env.chmod(0o600)
    return resolve(env_file=str(env), environ={})


def recorded_server(tmp_path) -> tuple[Deployment, ServerRecord]:
    settings = settings_in(tmp_path)
    state_dir = ensure_state_dir(tmp_path / "state")
    server = ServerRecord(
        marker="dspark-test-server",
        log=str(state_dir / "logs" / "vllm-serve.log"),
        url="http://127.0.0.1:1",
        served_name="tiny",
        model="m",
        started_at=0.0,
        settings=settings.public_values(),
        digest="",
        cap=1,
        control_file=str(state_dir / "scheduler-control"),
    )
    deployment = Deployment(
        ray_address="127.0.0.1:6379", config_digest="", started_at=0.0, launcher_version="0", nodes=[], server=server
    )
    save_state(state_dir, deployment)
    return deployment, server


def test_a_non_live_change_is_refused_naming_the_setting_and_its_source(tmp_path):
    _, server = recorded_server(tmp_path)
    settings = settings_in(tmp_path, DSPARK_MAX_INFLIGHT_PREFILLS="2", MAX_NUM_SEQS="4")
    with pytest.raises(ReloadRefused) as refused:
        reload(settings, cluster_spec(settings), SilentReporter())
    message = str(refused.value)
    assert refused.value.exit_code == EXIT_BAD_CONFIG
    assert f"MAX_NUM_SEQS 6 -> 4 ({tmp_path / 'dspark.env'}:6)" in message
    assert "DSPARK_MAX_INFLIGHT_PREFILLS 1 -> 2" in message and "were not applied" in message
    assert not os.path.lexists(server.control_file)
    assert load_state(tmp_path / "state").server.live == {}


def test_nothing_changed_writes_nothing(tmp_path):
    _, server = recorded_server(tmp_path)
    settings = settings_in(tmp_path)
    result = reload(settings, cluster_spec(settings), SilentReporter())
    assert result.changes.live == () and result.lines == ["reload: no live setting changed; nothing to do"]
    assert not os.path.lexists(server.control_file)


def test_the_control_file_is_replaced_privately_and_removed(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    path = folder / "scheduler-control"
    path.write_text("old\n")
    inode = path.stat().st_ino
    text = contract.control_text({contract.ENV_CAP: "2"})
    answer = control_op.scheduler_control(p.SchedulerControl(str(path), text), lambda _: None)
    assert answer.existed and path.read_text() == "DSPARK_MAX_INFLIGHT_PREFILLS=2\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.geteuid()
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    control_op.scheduler_control(p.SchedulerControl(str(path), remove=True), lambda _: None)
    assert not os.path.lexists(path)
    assert not control_op.scheduler_control(p.SchedulerControl(str(path), remove=True), lambda _: None).existed


@pytest.mark.parametrize("case", ["group-writable folder", "relative path", "too large"])
def test_the_control_file_is_never_written_where_others_could_set_it(tmp_path, case):
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    path, text = str(folder / "scheduler-control"), "DSPARK_MAX_INFLIGHT_PREFILLS=2\n"
    if case == "group-writable folder":
        folder.chmod(0o770)
    elif case == "relative path":
        path = "scheduler-control"
    else:
        text = "#" * (contract.CONTROL_MAX_BYTES + 1)
    with pytest.raises(p.OperationFailed) as failed:
        control_op.scheduler_control(p.SchedulerControl(path, text), lambda _: None)
    assert "nothing was written" in failed.value.failure.detail
    assert list(folder.iterdir()) == []


def in_force(cap, gate_mode, aging, diagnostics) -> InForce:
    """These four, the other live settings at their defaults (the scheduler's parse of an unset value)."""
    return InForce(
        {**InForce.of({}).values, "cap": cap, "gate_mode": gate_mode, "aging": aging, "diagnostics": diagnostics}
    )


def test_the_values_waited_for_are_the_schedulers_parse_of_the_settings():
    assert InForce.of(
        {contract.ENV_CAP: "2", contract.ENV_GATE_MODE: "1", contract.ENV_AGING: "4", contract.ENV_DIAG: "1"}
    ) == in_force(2, 1, 4.0, True)
    assert InForce.of(
        {contract.ENV_CAP: "9", contract.ENV_GATE_MODE: "", contract.ENV_AGING: "x", contract.ENV_DIAG: "0"}
    ) == in_force(contract.CAP_MAX, contract.DEFAULT_GATE_MODE, contract.DEFAULT_AGING, False)
    line = contract.parse_live_lines(  # the line as the scheduler logs it (aging shown with %g: 0.333333)
        "INFO " + contract.live_line(7, "cap 1 -> 2", in_force(2, 1, 1 / 3, True).values, 640) + "\n"
    )[0]
    assert line.changes == "cap 1 -> 2" and in_force(2, 1, 1 / 3, True).shown_by(line)
    assert not in_force(2, 1, 0.5, True).shown_by(line)
    assert not in_force(2, 2, 1 / 3, True).shown_by(line)


def test_a_reloaded_value_is_not_drift_and_restart_sees_it_as_running(tmp_path):
    from dspark_launch.serve.restart_kind import restart_kind
    from dspark_launch.serve.status import drift

    _, server = recorded_server(tmp_path)
    now = settings_in(tmp_path, DSPARK_MAX_INFLIGHT_PREFILLS="2").public_values()
    assert [d.name for d in drift(server.running_settings, now)] == ["DSPARK_MAX_INFLIGHT_PREFILLS"]
    server.live = {"DSPARK_MAX_INFLIGHT_PREFILLS": "2"}
    assert drift(server.running_settings, now) == ()
    assert restart_kind(server.running_settings, now, True).why == "no setting changed"


# --------------------------------------------------------------------------- data parallel: every engine


def _engine_line(rank: int, message: str, level: str = "INFO") -> str:
    """As vLLM 0.32 logs it from a data-parallel EngineCore (process name `EngineCore_DP<rank>`,
    vllm/v1/engine/utils.py), from the patched scheduler."""
    return f"(EngineCore_DP{rank} pid={600 + rank}) {level} 12-02 13:20:0{rank} [v1/core/sched/scheduler.py:3600] {message}"


WANTED = InForce.of({contract.ENV_CAP: "2"})


def _live(cap: int) -> str:
    return contract.live_line(contract.PATCH_VERSION, f"cap 1 -> {cap}", {**WANTED.values, "cap": cap}, 640)


class _IdleEngines:
    """The API of a data-parallel server whose engines are idle: a request routed to rank R (vLLM's
    `X-data-parallel-rank` header) makes that engine's scheduler run, and so log its `(live)` line."""

    def __init__(self, log, cap: int, refuse_rank: int | None = None):
        import http.server
        import threading

        self.ranks: list[str | None] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                rank = self.headers.get("X-data-parallel-rank")
                outer.ranks.append(rank)
                if rank is not None:
                    said = (
                        contract.LIVE_WARNING_FORMAT
                        % (contract.PATCH_VERSION, "/s/control", "bad", "cap 1, gate mode 1")
                        if int(rank) == refuse_rank
                        else _live(cap)
                    )
                    with open(log, "a") as out:
                        out.write(
                            _engine_line(int(rank), said, "WARNING" if int(rank) == refuse_rank else "INFO") + "\n"
                        )
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"choices": [{"text": "x"}]}')

            def log_message(self, *args):
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def close(self):
        self.http.shutdown()
        self.http.server_close()


def _wait_on_two_engines(tmp_path, refuse_rank=None, timeout_s=10.0):
    """Rank 0 is busy (it takes the file at once and logs it); rank 1 is idle until a request reaches it."""
    import time

    from dspark_launch.serve.http import Keyed
    from dspark_launch.serve.logfollow import END, LogReader
    from dspark_launch.serve.reload import _wait_in_force

    settings = settings_in(tmp_path, VLLM_EXTRA_ARGS="--data-parallel-size 2", DSPARK_MAX_INFLIGHT_PREFILLS="2")
    _, server = recorded_server(tmp_path)
    log = tmp_path / "vllm-serve.log"
    log.write_text(_engine_line(1, _live(2)) + "\n")  # before the write: not counted (read from the end)
    api = _IdleEngines(log, 2, refuse_rank)
    server.url, server.log = api.url, str(log)
    reader = LogReader(cluster_spec(settings).head.agent(SilentReporter()), str(log))
    reader.offset = reader.agent.call(p.ReadLog(str(log), END)).offset
    with log.open("a") as out:
        out.write(_engine_line(0, _live(2)) + "\n")
        out.write(_engine_line(0, _live(2)) + "\n")  # rank 0 again: not rank 1's
    try:
        # the nudges' port check lets them go (the check itself: tests/test_keyed_requests.py)
        return _wait_in_force(
            reader,
            WANTED,
            2,
            server,
            settings,
            time.monotonic(),
            timeout_s,
            SilentReporter(),
            key=Keyed("", lambda ip, port: True),
        ), api
    finally:
        api.close()


def test_with_data_parallel_reload_waits_for_every_engine_and_wakes_each_idle_one_on_its_rank(tmp_path):
    (lines, woken), api = _wait_on_two_engines(tmp_path)
    assert [line.cap for line in lines] == [2, 2]
    assert woken == (1,) and api.ranks == ["1"]  # only the idle rank was woken, and on its own rank
    from dspark_launch.serve.reload import ReloadResult
    from dspark_launch.serve.restart_kind import reload_changes

    changes = reload_changes({contract.ENV_CAP: "1"}, {contract.ENV_CAP: "2"})
    said = ReloadResult(changes, 1.5, lines[0].changes, 2, woken).lines[0]
    assert "in force on all 2 engines (data-parallel ranks 0-1)" in said and "idle rank(s) 1 woken" in said


def test_with_data_parallel_an_engine_that_refuses_the_file_fails_the_reload_naming_its_rank(tmp_path):
    from dspark_launch.errors import DsparkError

    with pytest.raises(DsparkError, match="the scheduler of data-parallel rank 1 refused its control file"):
        _wait_on_two_engines(tmp_path, refuse_rank=1)


def test_the_engines_a_server_runs_are_read_as_vllm_parses_the_data_parallel_size():
    from dspark_launch.serve.engines import engine_count

    assert [
        engine_count(args)
        for args in (
            "",
            "--enforce-eager",
            "-dp 2",
            "-dp=3",
            "--data-parallel-size 4",
            "--data_parallel_size=2",
            "-dp 2 --data-parallel-size 5",
            "-dp x",
            "--max-model-len 4096 '-dp' 2",
        )
    ] == [1, 1, 2, 3, 4, 2, 5, 1, 2]
