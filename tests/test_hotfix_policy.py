"""The vLLM version policy and DSPARK_HOTFIX, over fake node agents (the one
`NodeAgent.call(request)` seam; the same code as on the testbed, only the nodes' answers given).

`dspark plan` runs the hotfix's own check on every node's scheduler (read-only, `hotfix_check`), so a node whose
scheduler start's apply would refuse is a plan refusal (exit 1) naming the node, its vLLM version and what to do;
an untested release is a note in plan, start and status; `DSPARK_HOTFIX=off` serves vLLM's own scheduler on
purpose (start reverts a patch of ours an earlier start left, and says so). The testbed half, at the end: a
worker whose real scheduler.py carries a foreign patch makes the real `dspark plan` exit 1 naming it.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.cluster import lifecycle
from dspark_launch.cluster.spec import Node, cluster_spec
from dspark_launch.cluster.state import load_state, save_state
from dspark_launch.config.settings import resolve
from dspark_launch.errors import ClusterFailure, ConfigError
from dspark_launch.hotfix.contract import PATCH_VERSION
from dspark_launch.node.vllm_offer import VllmOffer
from dspark_launch.node.vllm_releases import PIP_PIN, RECOMMENDED, TESTED, is_tested, policy_line, untested_note
from dspark_launch.report import SilentReporter
from tests.support.fake_nodes import ROW, healthy_answer
from tests.support.paths import DATA, REPO

HEAD_IP, WORKER_IP = "10.9.0.1", "10.9.0.2"
GIB = 1 << 30
CAN_APPLY = p.HotfixResult("check", 0, "not-applied", "can apply: all anchors found", "0.32.0", PATCH_VERSION)
UNSUPPORTED = p.HotfixResult(
    "check",
    4,
    "unsupported",
    "cannot check on vLLM 0.35.0: vLLM 0.35.0 is outside the supported range 0.25 .. 0.34.x; file left unchanged",
    "0.35.0",
    7,
)
NOTHING_TO_REVERT = p.HotfixResult("revert", 0, "not-applied", "nothing to revert: not patched", "0.32.0", 7)
STOCK = p.HotfixResult("status", 1, "not-applied", "not applied, can apply", "0.32.0", 7)


class Warnings(SilentReporter):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warn(self, message: str) -> None:
        self.lines.append(message)


class FakeNode:
    """A healthy node (tests/support/fake_nodes.py) unless `answers` overrides a request type for it."""

    def __init__(self, node: Node, answers: dict[type, object], sent: list):
        self.node, self.answers, self.sent = node, answers, sent
        self.pid = 1000 if node.is_head else 2000

    def call(self, request, step: str = "", timeout: float | None = None):
        self.sent.append((self.node.name, type(request).__name__))
        given = self.answers.get(type(request))
        given = given(self.node) if callable(given) else given
        if given is not None:
            return given
        answer = healthy_answer(self.node, request)
        if answer is not None:
            return answer
        if isinstance(request, p.MemoryQuery):
            return p.MemoryAnswer(128 * GIB, 120 * GIB, False)
        if isinstance(request, p.HotfixCheck):
            return p.HotfixCheckAnswer(self.node.name, CAN_APPLY)
        if isinstance(request, p.HotfixRevert):
            return p.HotfixRevertAnswer(self.node.name, NOTHING_TO_REVERT, STOCK)
        if isinstance(request, p.Run):
            self.pid += 1
            return p.RunAnswer(0, p.Session(self.pid, 1), (p.Process(self.pid, 1, self.pid, cmd="raylet"),))
        if isinstance(request, p.AliveQuery):
            return p.AliveAnswer(tuple(True for _ in request.processes))
        if isinstance(request, p.Stop):
            return p.StopAnswer(tuple(proc.pid for proc in request.processes), ())
        if isinstance(request, p.Tail):
            return p.TailAnswer(())
        raise AssertionError(f"{self.node.name}: unexpected {type(request).__name__}")

    def describe_vllm(self, config_path: str = "") -> VllmOffer:
        return VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text())


def on(name: str, answer):
    """An answer for the node `name` only (the others answer as healthy nodes)."""
    return lambda node: answer if node.name == name else None


@pytest.fixture
def nodes(monkeypatch, tmp_path: Path):
    """(settings for the extra env lines, the requests sent); `answers` set per test."""
    sent: list = []
    answers: dict[type, object] = {}
    monkeypatch.setattr(Node, "agent", lambda node, reporter=None: FakeNode(node, answers, sent))

    def settings(**extra: str):
        state = tmp_path / "state"
        state.mkdir(mode=0o700, exist_ok=True)
        cache = tmp_path / "hub"
        cache.mkdir(exist_ok=True)
        lines = {
            "DSPARK_HEAD_IP": HEAD_IP,
            "DSPARK_WORKER_HOSTS": f"root@{WORKER_IP}",
            "DSPARK_FABRIC_IFNAME": "fab0",
            "DSPARK_STATE_DIR": str(state),
            "DSPARK_ALLOW_TCP_FABRIC": "1",
            "DSPARK_MODEL_CACHE": str(cache),
            **extra,
        }
        env_file = tmp_path / "dspark.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        return resolve(env_file=str(env_file), environ={})

    return settings, answers, sent


def _plan(settings):
    from dspark_launch.serve.preview import build_plan

    return build_plan(settings, SilentReporter())


# ---- dspark plan: the hotfix's check on every node ----


def test_plan_checks_every_nodes_scheduler_and_names_the_policy(nodes):
    settings, _, sent = nodes
    plan = _plan(settings())
    assert ("head", "HotfixCheck") in sent and ("worker1", "HotfixCheck") in sent
    assert not any(r.startswith("hotfix:") for r in plan.refusals)
    assert plan.vllm_policy == policy_line() and PIP_PIN in plan.vllm_policy
    assert plan.hotfix[0].startswith("scheduler hotfix: required (DSPARK_HOTFIX, default)")
    assert plan.hotfix[1:] == (
        f"head ({HEAD_IP}): not-applied: start can apply patch v{PATCH_VERSION} (vLLM 0.32.0)",
        f"worker1 ({WORKER_IP}): not-applied: start can apply patch v{PATCH_VERSION} (vLLM 0.32.0)",
    )


def test_plan_refuses_a_node_whose_scheduler_the_hotfix_refuses(nodes):
    """Plan's verdict is start's: one refusal line naming the node, its vLLM version and what to do; the node's
    untested release a note beside it; `dspark plan` exits 1."""
    settings, answers, _ = nodes
    answers[p.HotfixCheck] = on("worker1", p.HotfixCheckAnswer("worker1", UNSUPPORTED))
    answers[p.VersionQuery] = on("worker1", dataclasses.replace(ROW, hostname="worker1", vllm="0.35.0"))
    plan = _plan(settings())
    refused = [r for r in plan.refusals if r.startswith("hotfix:")]
    assert refused == [
        f"hotfix: worker1 ({WORKER_IP}): vLLM 0.35.0: {UNSUPPORTED.message}; start refuses this "
        f"(exit 1): install a release the hotfix supports on every node (pip install {PIP_PIN}; "
        f"tested: {', '.join(TESTED)}), or set DSPARK_HOTFIX=off to serve vLLM 0.35.0 without the "
        "hotfix"
    ]
    assert plan.start_would_refuse and refused[0] in plan.warnings
    worker = plan.nodes[1]
    assert worker.refusals == tuple(refused) and worker.warnings == (untested_note(f"worker1 ({WORKER_IP})", "0.35.0"),)
    assert not plan.nodes[0].refusals and plan.hotfix[2] == f"worker1 ({WORKER_IP}): refused (unsupported)"


def test_plan_exits_1_with_the_refusal_line(nodes, tmp_path):
    from typer.testing import CliRunner

    from dspark_launch.cli.main import app

    settings, answers, _ = nodes
    settings()
    answers[p.HotfixCheck] = on("worker1", p.HotfixCheckAnswer("worker1", UNSUPPORTED))
    shown = CliRunner().invoke(app, ["plan", "--env-file", str(tmp_path / "dspark.env")])
    assert shown.exit_code == 1, shown.output
    assert f"  - hotfix: worker1 ({WORKER_IP}): vLLM 0.35.0: cannot check on vLLM 0.35.0" in shown.output
    assert policy_line() in shown.output and "scheduler hotfix: required" in shown.output
    assert f"  check: worker1 ({WORKER_IP}): refused (unsupported)" in shown.output


def test_foreign_patch_refusal_says_reinstall(nodes):
    settings, answers, _ = nodes
    foreign = p.HotfixResult(
        "check",
        4,
        "foreign",
        "cannot check on vLLM 0.32.0: the file already references "
        "DSPARK_MAX_INFLIGHT_PREFILLS without this patch's marker (another patch?); file left "
        "unchanged",
        "0.32.0",
        7,
    )
    answers[p.HotfixCheck] = on("head", p.HotfixCheckAnswer("head", foreign))
    refused = [r for r in _plan(settings()).refusals if r.startswith("hotfix:")]
    assert len(refused) == 1 and refused[0].startswith(f"hotfix: head ({HEAD_IP}): vLLM 0.32.0: cannot check")
    assert refused[0].endswith(
        "reinstall vLLM 0.32.0 on that node (pip install --force-reinstall --no-deps) so its scheduler.py is vLLM's own"
    )


def test_plan_with_the_hotfix_off_serves_what_the_check_refuses_and_says_so(nodes):
    from dspark_launch.cluster.hotfix_rollout import OFF_LINE

    settings, answers, _ = nodes
    ours = p.HotfixResult("check", 0, "applied", "already applied", "0.32.0", 7, applied_patch_version=6)
    answers[p.HotfixCheck] = lambda node: p.HotfixCheckAnswer(
        node.name, UNSUPPORTED if node.name == "worker1" else ours
    )
    plan = _plan(settings(DSPARK_HOTFIX="off"))
    assert not any(r.startswith("hotfix:") for r in plan.refusals) and OFF_LINE in plan.warnings
    assert plan.hotfix[0].startswith("scheduler hotfix: OFF (DSPARK_HOTFIX=off from ")
    assert plan.hotfix[1] == (
        f"head ({HEAD_IP}): start reverts the hotfix an earlier start left (patch v6) and "
        "serves vLLM 0.32.0's own scheduler"
    )
    assert plan.hotfix[2] == f"worker1 ({WORKER_IP}): vLLM 0.35.0's own scheduler, served as installed"
    damaged = p.HotfixResult(
        "check",
        4,
        "damaged",
        "patch marker present but the stored original is missing",
        "0.32.0",
        7,
        applied_patch_version=6,
    )
    answers[p.HotfixCheck] = on("worker1", p.HotfixCheckAnswer("worker1", damaged))
    refused = [r for r in _plan(settings(DSPARK_HOTFIX="off")).refusals if r.startswith("hotfix:")]
    assert len(refused) == 1 and "DSPARK_HOTFIX=off, but its scheduler keeps this hotfix's code" in refused[0]


# ---- start: DSPARK_HOTFIX=off, the advice, the untested note ----


def test_start_with_the_hotfix_off_reverts_instead_of_applying_and_says_so(nodes):
    from dspark_launch.cli.cluster_cmd import hotfix_line
    from dspark_launch.cluster.hotfix_rollout import OFF_LINE
    from dspark_launch.serve.status import hotfix_mode, record_notes

    settings, answers, sent = nodes
    reverted = p.HotfixResult(
        "revert", 0, "not-applied", "reverted to the original", "0.35.0", 7, applied_patch_version=6, changed=True
    )
    answers[p.HotfixRevert] = on("worker1", p.HotfixRevertAnswer("worker1", reverted, STOCK))
    answers[p.VersionQuery] = lambda node: dataclasses.replace(ROW, hostname=node.name, vllm="0.35.0")
    spec = cluster_spec(settings(DSPARK_HOTFIX="off"))
    warned = Warnings()
    state = lifecycle.cluster_up_locked(spec, warned, None).state
    assert ("head", "HotfixRevert") in sent and not any(kind == "HotfixApply" for _, kind in sent)
    assert OFF_LINE in warned.lines
    assert (
        f"worker1 ({WORKER_IP}): reverted the hotfix an earlier start left (patch v6): vLLM's own scheduler "
        "again" in warned.lines
    )
    assert untested_note(f"head ({HEAD_IP}), worker1 ({WORKER_IP})", "0.35.0") in warned.lines
    assert hotfix_line("worker1", state.hotfix["worker1"]) == (
        "hotfix worker1: OFF (DSPARK_HOTFIX=off): vLLM "
        "0.32.0's own scheduler (reverted the patch an "
        "earlier start left)"
    )
    save_state(spec.state_dir, state)
    record = load_state(spec.state_dir)
    assert hotfix_mode(record) == "off"
    notes = record_notes(record, "off")
    assert notes[0].startswith("the scheduler hotfix is OFF on every node (DSPARK_HOTFIX=off at start)")
    assert notes[1] == untested_note("head, worker1", "0.35.0")
    view = lifecycle.cluster_status(spec, record)
    assert [n.hotfix for n in view.nodes] == ["off", "off"]


def test_start_with_the_hotfix_off_refuses_a_scheduler_that_keeps_our_code(nodes):
    settings, answers, _ = nodes
    failed = p.HotfixResult(
        "revert",
        4,
        "damaged",
        "cannot revert: the stored original is missing or damaged",
        "0.32.0",
        7,
        applied_patch_version=6,
    )
    damaged = p.HotfixResult("status", 4, "damaged", "cannot apply here", "0.32.0", 7, applied_patch_version=6)
    answers[p.HotfixRevert] = on("worker1", p.HotfixRevertAnswer("worker1", failed, damaged))
    with pytest.raises(ClusterFailure) as caught:
        lifecycle.cluster_up_locked(cluster_spec(settings(DSPARK_HOTFIX="off")), SilentReporter(), None)
    line = str(caught.value)
    assert f"worker1 ({WORKER_IP})" in line and "DSPARK_HOTFIX=off, but its scheduler keeps this hotfix's code" in line
    assert "reinstall vLLM 0.32.0" in line


def test_start_refusal_says_what_to_do(nodes):
    settings, answers, _ = nodes
    refused = p.HotfixResult("apply", 4, "unsupported", UNSUPPORTED.message.replace("check", "apply"), "0.35.0", 7)
    answers[p.HotfixApply] = lambda node: p.HotfixApplyAnswer(node.name, refused, refused)
    with pytest.raises(ClusterFailure) as caught:
        lifecycle.cluster_up_locked(cluster_spec(settings()), SilentReporter(), None)
    assert f"head ({HEAD_IP}): hotfix: cannot apply on vLLM 0.35.0" in str(caught.value)
    assert f"pip install {PIP_PIN}" in str(caught.value) and "DSPARK_HOTFIX=off" in str(caught.value)


def test_a_tested_release_has_no_note():
    assert is_tested(RECOMMENDED) and is_tested(f"{RECOMMENDED}+cu130") and untested_note("head", RECOMMENDED) is None
    assert not is_tested("0.35.0") and "not a tested release" in untested_note("head", "0.35.0")


def test_reload_refuses_a_server_started_with_the_hotfix_off(tmp_path):
    import os

    from dspark_launch.cluster.state import Deployment, ServerRecord, ensure_state_dir
    from dspark_launch.errors import DsparkError
    from dspark_launch.serve.reload import reload

    def settings_in(**changed: str):
        env = tmp_path / "dspark.env"
        lines = {
            "DSPARK_STATE_DIR": str(tmp_path / "state"),
            "DSPARK_HEAD_IP": "127.0.0.1",
            "DSPARK_WORKER_HOSTS": "127.0.0.2",
            "DSPARK_FABRIC_IFNAME": "lo",
            "DSPARK_HOTFIX": "off",
            **changed,
        }
        env.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        env.chmod(0o600)
        return resolve(env_file=str(env), environ={})

    state_dir = ensure_state_dir(tmp_path / "state")
    server = ServerRecord(
        marker="dspark-test-server",
        log=str(state_dir / "logs" / "vllm-serve.log"),
        url="http://127.0.0.1:1",
        served_name="tiny",
        model="m",
        started_at=0.0,
        settings=settings_in().public_values(),
        digest="",
        cap=1,
        control_file=str(state_dir / "scheduler-control"),
    )
    save_state(
        state_dir,
        Deployment(
            ray_address="127.0.0.1:6379",
            config_digest="",
            started_at=0.0,
            launcher_version="0",
            nodes=[],
            server=server,
        ),
    )
    settings = settings_in(DSPARK_MAX_INFLIGHT_PREFILLS="2")
    with pytest.raises(DsparkError) as refused:
        reload(settings, cluster_spec(settings), SilentReporter())
    assert "started with DSPARK_HOTFIX=off" in str(refused.value) and "nothing was changed" in str(refused.value)
    assert not os.path.lexists(server.control_file)


# ---- the setting ----


def test_a_bad_hotfix_value_is_one_line_naming_variable_value_place_and_choices(nodes, tmp_path):
    settings, _, _ = nodes
    with pytest.raises(ConfigError) as caught:
        settings(DSPARK_HOTFIX="maybe")
    line = str(caught.value)
    assert "\n" not in line and caught.value.exit_code == 2
    assert f"DSPARK_HOTFIX=maybe from {tmp_path / 'dspark.env'}:" in line and "required, off" in line
    assert settings().dspark_hotfix == "required"  # fail closed unless written


def test_the_readme_names_the_pin_and_the_tested_releases():
    text = (REPO / "README.md").read_text()
    assert PIP_PIN in text and all(version in text for version in TESTED)


# ---- the agent's end, in process and over a real agent process ----


def test_hotfix_check_is_answered_by_a_real_agent_and_writes_nothing():
    from dspark_launch.agent.client import NodeAgent
    from dspark_launch.agent.transport import LocalTransport
    from dspark_launch.hotfix import patch_tool as hotfix

    target = hotfix.find_target()
    before = target.read_bytes()
    answer = NodeAgent("here", LocalTransport(sys.executable)).call(p.HotfixCheck())
    assert answer.check.action == "check" and answer.check.vllm_version == hotfix.status(target).vllm_version
    assert target.read_bytes() == before


def test_no_vllm_is_the_tools_missing_answer(monkeypatch):
    from dspark_launch.agent.handlers.hotfix import hotfix_check, hotfix_revert
    from dspark_launch.hotfix import patch_tool as hotfix

    def nowhere():
        raise FileNotFoundError("vllm is not importable from this interpreter")

    monkeypatch.setattr(hotfix, "find_target", nowhere)
    checked = hotfix_check(p.HotfixCheck(), lambda _: None).check
    assert (checked.code, checked.state, checked.message) == (
        4,
        "missing",
        "vllm is not importable from this interpreter",
    )
    assert hotfix_revert(p.HotfixRevert(), lambda _: None).status.state == "missing"


# ---- on the testbed: a real worker whose scheduler.py carries a foreign patch ----


@pytest.mark.testbed
def test_plan_exits_1_naming_a_worker_whose_scheduler_the_hotfix_refuses(testbed_clean, tmp_path):
    from tests.support.on_testbed import SCHEDULER_REL, run, scheduler_sha, write_env

    tb = testbed_clean
    path = str(Path(sys.executable).parent.parent / SCHEDULER_REL)
    tb.exec(
        "worker1", ["sh", "-c", f"echo '# DSPARK_MAX_INFLIGHT_PREFILLS: set by another patch' >> {path}"], check=True
    )
    before = {node: scheduler_sha(tb, node) for node in ("head", "worker1")}
    proc = run(tb, tmp_path, write_env(tb, tmp_path), "plan", timeout=400)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    refused = [line for line in proc.stdout.splitlines() if line.startswith("  - hotfix:")]
    assert len(refused) == 1, proc.stdout[-4000:]
    assert refused[0].startswith(
        "  - hotfix: worker1 (10.213.0.2): vLLM 0.32.0: cannot check on vLLM 0.32.0: the "
        "file already references DSPARK_MAX_INFLIGHT_PREFILLS"
    ), refused
    assert "reinstall vLLM 0.32.0 on that node" in refused[0]
    assert "  check: head (10.213.0.1): not-applied: start can apply patch v" in proc.stdout
    assert {node: scheduler_sha(tb, node) for node in before} == before  # read-only: nothing patched
