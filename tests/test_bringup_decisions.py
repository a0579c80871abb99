"""The bring-up's decisions as table tests over a fake node agent (the one `NodeAgent.call(request)` seam).

Each row gives one node one answer that must stop `cluster up`: what the operator reads (the error
line), how it exits (ClusterFailure: 1, ConfigError: 2) and what was started (pre-flight refusals:
nothing, no `Run` sent to any node; refusals while Ray starts: every `Run` stopped again). The same
code runs as on the testbed; only the node's answers are given. The agent's own half of each answer
(what its handlers report on a real host) is checked below the table, in process. The end-to-end
refusal that proves nothing started over real SSH is tests/test_cluster.py::
test_worker_unreachable_fails_before_anything_starts; the rollbacks on real nodes are its hotfix tests.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.agent.handlers.fabric import interface_query
from dspark_launch.agent.handlers.processes import probe
from dspark_launch.cluster import lifecycle
from dspark_launch.cluster.spec import Node, cluster_spec
from dspark_launch.config.settings import resolve
from dspark_launch.errors import ClusterFailure, ConfigError
from dspark_launch.node.fabric import FabricEnv
from dspark_launch.report import SilentReporter
from tests.support.fake_nodes import ROW, VERIFIED, healthy_answer

HEAD_IP, WORKER_IP = "10.9.0.1", "10.9.0.2"


class FakeNode:
    """One node's agent: a healthy answer to every request the bring-up sends, unless the row overrides it."""

    def __init__(self, node: Node, overrides: dict[type, object], sent: list):
        self.node, self.overrides, self.sent = node, overrides, sent
        self.pid = 1000 if node.is_head else 2000

    def healthy(self, request):
        answer = healthy_answer(self.node, request)
        if answer is not None:
            return answer
        if isinstance(request, p.Run):
            self.pid += 1
            return p.RunAnswer(0, p.Session(self.pid, 1), (p.Process(self.pid, 1, self.pid, cmd="raylet"),))
        if isinstance(request, p.Stop):
            return p.StopAnswer(tuple(proc.pid for proc in request.processes), ())
        if isinstance(request, p.Tail):
            return p.TailAnswer(())
        raise AssertionError(f"{self.node.name}: the bring-up sent an unexpected {type(request).__name__}")

    def call(self, request, step: str = "", timeout: float | None = None):
        self.sent.append((self.node.name, request))
        answer = self.overrides.get(type(request))
        answer = answer(self.node) if callable(answer) else answer
        return self.healthy(request) if answer is None else answer


def on(node_name: str, answer):
    """An override that applies to `node_name` only (the other nodes answer healthily)."""
    return lambda node: answer if node.name == node_name else None


def missing_vllm(node):
    return p.ProbeAnswer(
        node.name,
        "/venv/bin/python",
        "3.11.7",
        {"dspark_launch": p.ModuleInfo(True), "ray": p.ModuleInfo(True), "vllm": p.ModuleInfo(False)},
    )


def no_roce(node):
    return p.FabricAnswer(
        FabricEnv(
            node.name,
            (),
            (),
            "",
            False,
            (),
            (f"{node.name}: no RDMA device behind fab0",),
            missing="no RDMA device behind fab0",
        )
    )


NOTHING_STARTED, ROLLED_BACK = "nothing started", "rolled back"

# (row id, settings beyond the base file, {request type: override}, exception, fragments of its line, outcome)
REFUSALS = [
    (
        "worker without vllm",
        {},
        {p.Probe: lambda n: missing_vllm(n) if n.name == "worker1" else None},
        ClusterFailure,
        [f"worker1 ({WORKER_IP}): python: /venv/bin/python cannot import vllm"],
        NOTHING_STARTED,
    ),
    (
        "misconfigured worker ip",
        {},
        {p.InterfaceQuery: on("worker1", p.InterfaceAnswer(True, ("10.9.0.7",), False))},
        ClusterFailure,
        [f"worker1 ({WORKER_IP}): fabric interface: fab0 carries 10.9.0.7, not VLLM_HOST_IP {WORKER_IP}"],
        NOTHING_STARTED,
    ),
    (
        "no fabric interface",
        {},
        {p.InterfaceQuery: on("head", p.InterfaceAnswer(False, (), False))},
        ClusterFailure,
        [f"head ({HEAD_IP}): fabric interface: no interface fab0"],
        NOTHING_STARTED,
    ),
    (
        "unwritable log folder",
        {},
        {p.PrepareLogDir: on("worker1", p.PrepareLogDirAnswer("/s/logs is not writable there"))},
        ClusterFailure,
        [f"worker1 ({WORKER_IP}): log folder: /s/logs is not writable there; nothing was started"],
        NOTHING_STARTED,
    ),
    (
        "ray port taken",
        {},
        {p.PortQuery: on("head", p.PortAnswer(False, "in use by pid 77"))},
        ClusterFailure,
        [f"head ({HEAD_IP}): ray port: {HEAD_IP}:6379 is taken (in use by pid 77)"],
        NOTHING_STARTED,
    ),
    (
        "dashboard packages missing",
        {"DSPARK_RAY_DASHBOARD": "local"},
        {
            p.Probe: lambda n: (
                dataclasses.replace(FakeNode(n, {}, []).healthy(p.Probe()), dashboard_missing=("aiohttp",))
                if n.is_head
                else None
            )
        },
        ClusterFailure,
        ["dashboard: DSPARK_RAY_DASHBOARD=local needs Ray's dashboard packages, missing aiohttp"],
        NOTHING_STARTED,
    ),
    (
        "no roce refused",
        {"DSPARK_ALLOW_TCP_FABRIC": "0"},
        {p.FabricQuery: no_roce},
        ConfigError,
        ["no RDMA device behind fab0", "nothing started", "DSPARK_ALLOW_TCP_FABRIC=1"],
        NOTHING_STARTED,
    ),
    (
        "version mismatch",
        {},
        {p.VersionQuery: on("worker1", dataclasses.replace(ROW, scheduler_sha256="b" * 64))},
        ClusterFailure,
        ["version matrix: nodes differ in scheduler_sha256"],
        ROLLED_BACK,
    ),
    (
        "hotfix refused on one node",
        {},
        {
            p.HotfixApply: on(
                "worker1",
                p.HotfixApplyAnswer("worker1", p.HotfixResult("apply", 3, "refused", "anchor not found"), VERIFIED),
            )
        },
        ClusterFailure,
        [f"worker1 ({WORKER_IP}): hotfix: anchor not found"],
        ROLLED_BACK,
    ),
]


def spec_for(tmp_path: Path, extra: dict[str, str]):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)  # the CLI makes it (private) before `cluster up`
    lines = {
        "DSPARK_HEAD_IP": HEAD_IP,
        "DSPARK_WORKER_HOSTS": f"root@{WORKER_IP}",
        "DSPARK_FABRIC_IFNAME": "fab0",
        "DSPARK_STATE_DIR": str(state),
        "DSPARK_ALLOW_TCP_FABRIC": "1",
        **extra,
    }
    env_file = tmp_path / "dspark.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    return cluster_spec(resolve(env_file=str(env_file), environ={}))


def bring_up(monkeypatch, tmp_path: Path, extra: dict[str, str], overrides: dict[type, object]):
    """`cluster up`'s locked part over fake agents; returns (result or exception, every request sent)."""
    sent: list = []
    monkeypatch.setattr(Node, "agent", lambda node, reporter=None: FakeNode(node, overrides, sent))
    spec = spec_for(tmp_path, extra)
    try:
        return lifecycle.cluster_up_locked(spec, SilentReporter(), None), sent
    except (ClusterFailure, ConfigError) as exc:
        return exc, sent


def test_the_fake_nodes_answer_a_whole_bring_up(monkeypatch, tmp_path):
    """The table's baseline: with every answer healthy the same code brings both nodes up (so each row's
    refusal is caused by its one answer)."""
    result, sent = bring_up(monkeypatch, tmp_path, {}, {})
    assert not isinstance(result, Exception), result
    assert [rec.name for rec in result.state.nodes] == ["head", "worker1"]
    assert sorted(name for name, req in sent if isinstance(req, p.Run)) == ["head", "worker1"]
    assert not [req for _, req in sent if isinstance(req, p.Stop)]


@pytest.mark.parametrize(
    "extra, overrides, error, fragments, outcome", [row[1:] for row in REFUSALS], ids=[row[0] for row in REFUSALS]
)
def test_a_refusing_answer_stops_the_bring_up(monkeypatch, tmp_path, extra, overrides, error, fragments, outcome):
    result, sent = bring_up(monkeypatch, tmp_path, extra, overrides)
    assert isinstance(result, error), result
    line = str(result)
    assert "\n" not in line and all(fragment in line for fragment in fragments), line
    runs = [(name, req) for name, req in sent if isinstance(req, p.Run)]
    if outcome == NOTHING_STARTED:
        assert runs == [], [name for name, _ in runs]
    else:  # every process a Run started is in a Stop sent to the same node
        stopped = {(name, proc.pid) for name, req in sent if isinstance(req, p.Stop) for proc in req.processes}
        assert runs and all(name in {n for n, _ in stopped} for name, _ in runs), (runs, stopped)
        assert len(stopped) == len(runs)


def test_a_version_mismatch_prints_the_matrix_with_the_differing_row_marked_and_exits_1(monkeypatch, tmp_path, capsys):
    """Through the CLI's own `cluster up` (cli/cluster_cmd.run_up): one error line, the matrix after it."""
    import typer

    from dspark_launch.cli.cluster_cmd import run_up

    sent: list = []
    drifted = {p.VersionQuery: on("worker1", dataclasses.replace(ROW, scheduler_sha256="b" * 64))}
    monkeypatch.setattr(Node, "agent", lambda node, reporter=None: FakeNode(node, drifted, sent))
    with pytest.raises(typer.Exit) as exited:
        run_up(spec_for(tmp_path, {}), SilentReporter())
    assert exited.value.exit_code == 1
    err = capsys.readouterr().err.splitlines()
    errors = [line for line in err if line.startswith("dspark: error:")]
    assert len(errors) == 1 and "version matrix: nodes differ in scheduler_sha256" in errors[0], err
    marked = [line for line in err if line.startswith("!")]
    assert len(marked) == 1 and marked[0].startswith("! scheduler_sha256"), err
    assert any(line.startswith("dspark: rolled back") for line in err), err
    assert not (tmp_path / "state" / "state.json").exists()


def test_no_roce_with_tcp_allowed_is_a_warning_and_the_bring_up_goes_on(monkeypatch, tmp_path):
    warned: list[str] = []

    class Reporter(SilentReporter):
        def warn(self, message):
            warned.append(message)

    sent: list = []
    monkeypatch.setattr(Node, "agent", lambda node, reporter=None: FakeNode(node, {p.FabricQuery: no_roce}, sent))
    result = lifecycle.cluster_up_locked(spec_for(tmp_path, {"DSPARK_ALLOW_TCP_FABRIC": "1"}), Reporter(), None)
    assert [rec.name for rec in result.state.nodes] == ["head", "worker1"]
    assert "head: no RDMA device behind fab0" in warned and "worker1: no RDMA device behind fab0" in warned


# ---------------------------------------------------------------- the agent's own half, on this host


def test_the_probe_reports_a_module_this_interpreter_cannot_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # hidden from this interpreter, as a venv without it
    answer = probe(p.Probe(), None)
    assert answer.modules["vllm"].found is False and answer.modules["dspark_launch"].found is True
    assert answer.python == sys.executable


def test_the_interface_query_lists_the_addresses_an_interface_carries():
    answer = interface_query(p.InterfaceQuery("lo", "10.9.9.9"), None)
    assert answer.exists and "127.0.0.1" in answer.addresses and answer.has_ip is False
    assert interface_query(p.InterfaceQuery("lo", "127.0.0.1"), None).has_ip is True
    assert interface_query(p.InterfaceQuery("no-such-if0", "127.0.0.1"), None) == p.InterfaceAnswer(False, (), False)
