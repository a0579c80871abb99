"""`status`'s choice of where the nodes' Ray registrations come from, over fake node agents (the one
`NodeAgent.call(request)` seam; the same code as on the testbed, only the nodes' answers given).

A start keeps each node's Ray registration (node id, IP, GPUs) in the record; `status` answers registered IP
and GPUs from it, without asking Ray (the head's agent imports Ray: seconds), while every node's recorded Ray
daemons are still the same live processes. A record without registrations (an older launcher's), a node whose
daemons changed, or `--deep` asks Ray's node table as before. The testbed half is tests/test_cluster.py
(`status --json` on two real nodes) and bench/fast_ops.py (the time).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.cluster import lifecycle
from dspark_launch.cluster.spec import Node, cluster_spec
from dspark_launch.cluster.state import STATE_FILE, load_state, save_state
from dspark_launch.config.settings import resolve
from dspark_launch.report import SilentReporter
from tests.support.fake_nodes import healthy_answer

HEAD_IP, WORKER_IP = "10.9.0.1", "10.9.0.2"
RAY_GPUS = 7.0  # what the fake Ray node table answers: never the recorded 1.0


class FakeNode:
    """A healthy answer to what a bring-up and a status send; `changed` nodes' recorded daemons are gone."""

    def __init__(self, node: Node, sent: list, changed: set[str]):
        self.node, self.sent, self.changed = node, sent, changed

    def call(self, request, step: str = "", timeout: float | None = None):
        self.sent.append((self.node.name, type(request).__name__))
        node = self.node
        answer = healthy_answer(node, request)
        if answer is not None:
            return answer
        if isinstance(request, p.Run):
            pid = 1000 if node.is_head else 2000
            return p.RunAnswer(
                0,
                p.Session(pid, 1),
                (p.Process(pid, 1, pid, cmd="raylet"), p.Process(pid + 1, 1, pid, cmd="gcs_server")),
            )
        if isinstance(request, p.AliveQuery):
            return p.AliveAnswer(tuple(node.name not in self.changed for _ in request.processes))
        if isinstance(request, p.RayNodesQuery):
            return p.RayNodesAnswer(
                (p.RayNode("id-head", HEAD_IP, True, RAY_GPUS), p.RayNode("id-worker1", WORKER_IP, True, RAY_GPUS))
            )
        if isinstance(request, p.Hello):
            return p.HelloAnswer(p.PROTOCOL_VERSION, "0.1", node.name, "/venv/bin/python")
        raise AssertionError(f"{node.name}: unexpected {type(request).__name__}")


@pytest.fixture
def cluster(monkeypatch, tmp_path: Path):
    """A spec, and a record saved by a whole (fake) bring-up; `changed` names nodes whose daemons are gone."""
    sent: list = []
    changed: set[str] = set()
    monkeypatch.setattr(Node, "agent", lambda node, reporter=None: FakeNode(node, sent, changed))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    lines = {
        "DSPARK_HEAD_IP": HEAD_IP,
        "DSPARK_WORKER_HOSTS": f"root@{WORKER_IP}",
        "DSPARK_FABRIC_IFNAME": "fab0",
        "DSPARK_STATE_DIR": str(state),
        "DSPARK_ALLOW_TCP_FABRIC": "1",
    }
    env_file = tmp_path / "dspark.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    spec = cluster_spec(resolve(env_file=str(env_file), environ={}))
    save_state(spec.state_dir, lifecycle.cluster_up_locked(spec, SilentReporter(), None).state)
    sent.clear()
    return spec, sent, changed


def _status(spec, deep: bool = False):
    return lifecycle.cluster_status(spec, load_state(spec.state_dir), deep)


def test_a_start_records_each_nodes_ray_registration(cluster):
    spec, _, _ = cluster
    record = json.loads((spec.state_dir / STATE_FILE).read_text())
    assert [(n["name"], n["ray"]) for n in record["nodes"]] == [
        ("head", {"node_id": "id-head", "ip": HEAD_IP, "gpus": 1.0}),
        ("worker1", {"node_id": "id-worker1", "ip": WORKER_IP, "gpus": 1.0}),
    ]


def test_status_answers_from_the_record_without_asking_ray_while_the_daemons_live(cluster):
    spec, sent, _ = cluster
    view = _status(spec)
    assert view.ray_source == "record" and view.state == "up"
    assert [(n.registered_ip, n.gpus) for n in view.nodes] == [(HEAD_IP, 1.0), (WORKER_IP, 1.0)]
    assert ("head", "RayNodesQuery") not in sent
    assert sorted(sent) == [("head", "AliveQuery"), ("worker1", "AliveQuery")]


def test_changed_daemons_on_a_node_fall_back_to_rays_node_table(cluster):
    spec, sent, changed = cluster
    changed.add("worker1")  # its raylet restarted or is gone: the recorded registration proves nothing
    view = _status(spec)
    assert view.ray_source == "ray" and ("head", "RayNodesQuery") in sent
    assert view.state == "degraded"
    assert view.nodes[0].gpus == RAY_GPUS  # the head's facts now come from Ray, not the record


def test_a_record_without_registrations_asks_ray(cluster):
    spec, sent, _ = cluster
    path = spec.state_dir / STATE_FILE
    record = json.loads(path.read_text())
    for node in record["nodes"]:
        del node["ray"]  # as an older launcher wrote it
    path.write_text(json.dumps(record))
    view = _status(spec)
    assert view.ray_source == "ray" and ("head", "RayNodesQuery") in sent
    assert [(n.registered_ip, n.gpus) for n in view.nodes] == [(HEAD_IP, RAY_GPUS), (WORKER_IP, RAY_GPUS)]


def test_deep_asks_ray_even_when_the_record_answers(cluster):
    spec, sent, _ = cluster
    view = _status(spec, deep=True)
    assert view.ray_source == "ray" and ("head", "RayNodesQuery") in sent
    assert view.nodes[1].gpus == RAY_GPUS


def test_no_record_no_ray_source(cluster):
    spec, sent, _ = cluster
    (spec.state_dir / STATE_FILE).unlink()
    view = lifecycle.cluster_status(spec, None)
    assert view.ray_source is None and ("head", "RayNodesQuery") not in sent
