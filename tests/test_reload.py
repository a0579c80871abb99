"""`dspark reload` without a server process (issue 24): the refusal of non-live changes, the agent's
control-file operation, and the values the launcher waits for (the scheduler's own parsers)."""

from __future__ import annotations

import os
import stat

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.report import SilentReporter
from dspark_launch.cluster.spec import cluster_spec
from dspark_launch.cluster.state import ServerRecord, ensure_state_dir, load_state, save_state, Deployment
from dspark_launch.config.settings import resolve
from dspark_launch.errors import EXIT_BAD_CONFIG
from dspark_launch.hotfix import contract
from dspark_launch.agent.handlers import control as control_op
from dspark_launch.serve.reload import InForce, ReloadRefused, reload

EXAMPLE = "dspark_launch/config/env.dspark.example"


def settings_in(tmp_path, **changed: str):
    env = tmp_path / "dspark.env"
    lines = [f"DSPARK_STATE_DIR={tmp_path / 'state'}", "DSPARK_HEAD_IP=127.0.0.1", "DSPARK_WORKER_HOSTS=127.0.0.2",
             "DSPARK_FABRIC_IFNAME=lo"] + [f"{k}={v}" for k, v in changed.items()]
    env.write_text("\n".join(lines) + "\n")
    env.chmod(0o600)
    return resolve(env_file=str(env), environ={})


def recorded_server(tmp_path) -> tuple[Deployment, ServerRecord]:
    settings = settings_in(tmp_path)
    state_dir = ensure_state_dir(tmp_path / "state")
    server = ServerRecord(marker="dspark-test-server", log=str(state_dir / "logs" / "vllm-serve.log"),
                          url="http://127.0.0.1:1", served_name="tiny", model="m", started_at=0.0,
                          settings=settings.public_values(), digest="", cap=1,
                          control_file=str(state_dir / "scheduler-control"))
    deployment = Deployment("127.0.0.1:6379", "", 0.0, "0", [], server=server)
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


def test_the_values_waited_for_are_the_schedulers_parse_of_the_settings():
    assert InForce.of({contract.ENV_CAP: "2", contract.ENV_GATE_MODE: "1", contract.ENV_AGING: "4",
                       contract.ENV_DIAG: "1"}) == InForce(2, 1, 4.0, True)
    assert InForce.of({contract.ENV_CAP: "9", contract.ENV_GATE_MODE: "", contract.ENV_AGING: "x",
                       contract.ENV_DIAG: "0"}) == InForce(contract.CAP_MAX, contract.DEFAULT_GATE_MODE,
                                                           contract.DEFAULT_AGING, False)
    line = contract.parse_live_lines(
        "INFO dspark-issue27 hotfix v5: cap 1 -> 2 (live); in force: cap=2, gate mode 1, step bound 640 "
        "prefill tokens, aging 0.333333, diagnostics on\n")[0]
    assert line.changes == "cap 1 -> 2" and InForce(2, 1, 1 / 3, True).shown_by(line)
    assert not InForce(2, 1, 0.5, True).shown_by(line)
    assert not InForce(2, 2, 1 / 3, True).shown_by(line)


def test_a_reloaded_value_is_not_drift_and_restart_sees_it_as_running(tmp_path):
    from dspark_launch.serve.restart_kind import restart_kind
    from dspark_launch.serve.status import drift

    _, server = recorded_server(tmp_path)
    now = settings_in(tmp_path, DSPARK_MAX_INFLIGHT_PREFILLS="2").public_values()
    assert [d.name for d in drift(server.running_settings, now)] == ["DSPARK_MAX_INFLIGHT_PREFILLS"]
    server.live = {"DSPARK_MAX_INFLIGHT_PREFILLS": "2"}
    assert drift(server.running_settings, now) == ()
    assert restart_kind(server.running_settings, now, True).why == "no setting changed"
