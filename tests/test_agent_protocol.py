"""The agent protocol end to end on this machine (a real agent process over LocalTransport) and the
typed deployment record: unknown fields ignored, versions checked at first contact, corrupt state named."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dspark_launch import __version__
from dspark_launch.agent import protocol as p
from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.codec import DecodeError, from_data, to_data
from dspark_launch.agent.transport import LOGIN_ENV, LocalTransport
from dspark_launch.cluster.state import Deployment, NodeRecord, ProcessRecord, StateUnreadable, load_state, save_state
from dspark_launch.errors import ClusterFailure, VersionMismatch
from dspark_launch.node import procfs
from tests.support.processes import never_started

REPO = Path(__file__).resolve().parents[1]


class Recorder:
    def __init__(self):
        self.lines = []

    def phase(self, message):
        self.lines.append(("phase", message))

    def waiting(self, message, elapsed, timeout):
        self.lines.append(("waiting", message))

    def warn(self, message):
        self.lines.append(("warn", message))


def test_every_operation_has_a_handler_and_frozen_types():
    """One registry: each operation named after its request, its handler the function of that name in its
    handlers/ module, its answer `<request less Query>Answer` (or a node value returned as it is), its types frozen."""
    from dspark_launch.agent.node_end import handler

    assert len(p.OPERATIONS) == len(p._OPERATIONS)
    for name, operation in p.OPERATIONS.items():
        assert name == re.sub(r"(?<!^)(?=[A-Z])", "_", operation.request.__name__).lower()
        found = handler(name)
        assert callable(found) and found.__name__ == name, (name, found)
        answer = operation.answer
        assert (
            answer.__name__ == re.sub("Query$", "", operation.request.__name__) + "Answer"
            or answer.__module__ == "dspark_launch.node.values"
        ), (name, answer.__name__)
        assert operation.request.__dataclass_params__.frozen and operation.answer.__dataclass_params__.frozen
    assert p.OPERATIONS["read_log"].request is p.ReadLog and p.OPERATIONS["memory_query"].request is p.MemoryQuery
    assert p.operation_of(p.Stop(marker="m")) is p.OPERATIONS["stop"]


def test_each_message_is_declared_where_the_protocol_says_and_an_agent_defines_only_its_operations():
    """`protocol.Name` names every dataclass of messages/ (and nothing else), from the module DECLARED_IN says, and
    the type checker's imports in protocol.py say the same; a fresh interpreter that imports the protocol and
    decodes one operation's request has defined that subject's messages alone."""
    import ast
    import dataclasses
    import importlib
    import pkgutil

    from dspark_launch.agent import messages

    declared: dict[str, str] = {}
    for info in pkgutil.iter_modules(messages.__path__):
        module = importlib.import_module(f"{messages.__name__}.{info.name}")
        for name, value in vars(module).items():
            if (dataclasses.is_dataclass(value) and value.__module__ == module.__name__) or name.isupper():
                declared[name] = info.name
    for name, subject in p.DECLARED_IN.items():
        assert getattr(importlib.import_module(f"{messages.__name__}.{subject}"), name) is getattr(p, name), name
    assert {n: s for n, s in p.DECLARED_IN.items() if n in declared} == declared
    tree = ast.parse(Path(p.__file__).read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    checked = {a.name: i.module.rsplit(".", 1)[1] for i in block.body for a in i.names}  # type: ignore[union-attr]
    assert checked == p.DECLARED_IN
    probe = "import sys; from dspark_launch.agent import protocol as p; p.OPERATIONS['memory_query'].request; " + (
        "print(sorted(m for m in sys.modules if m.startswith('dspark_launch.agent.messages.')))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['dspark_launch.agent.messages.processes']", loaded


@pytest.mark.parametrize("agent_files", [(), ("__init__.py", "server.py")], ids=["no-agent-package", "agent-server-py"])
def test_a_node_with_a_launcher_from_before_the_agent_module_is_a_version_mismatch(tmp_path, agent_files):
    """A node whose dspark-launch has no dspark_launch.agent (before protocol 6), or whose agent's node end is still
    `agent/server.py` (before agent/node_end.py): one version line, not a traceback."""
    old = tmp_path / "old" / "dspark_launch"
    old.mkdir(parents=True)
    (old / "__init__.py").write_text("")
    for name in agent_files:
        (old / "agent").mkdir(exist_ok=True)
        (old / "agent" / name).write_text("" if name == "__init__.py" else "raise SystemExit('never run')\n")
    python = tmp_path / "python"
    # -S: no site-packages, so the interpreter finds only that old package (as on a node that has only it)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "old"} exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    with pytest.raises(VersionMismatch) as caught:
        NodeAgent("worker1", LocalTransport(str(python))).call(p.Hello())
    assert "older than" in str(caught.value) and str(python) in str(caught.value)


def test_the_launcher_imports_no_handler():
    """Handlers are the agent's, imported by its server one at a time: none in the launcher's process."""
    code = (
        "import sys, dspark_launch.cli.main, dspark_launch.serve.start, dspark_launch.serve.stop, dspark_launch.serve.restart, "
        "dspark_launch.serve.status, dspark_launch.serve.reload, dspark_launch.model.workflow; "
        "loaded = [m for m in sys.modules if m.startswith('dspark_launch.agent.handlers.')]; "
        "assert not loaded, loaded"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_probe_is_read_only_and_the_log_folder_is_its_own_operation(tmp_path):
    agent = NodeAgent("here", LocalTransport(sys.executable))
    agent.call(p.Probe(dashboard=True))
    logs = tmp_path / "logs"
    assert not logs.exists()
    assert agent.call(p.PrepareLogDir(str(logs))).error is None
    assert logs.is_dir() and logs.stat().st_mode & 0o077 == 0 and not list(logs.iterdir())


def test_decoding_ignores_unknown_fields_and_rebuilds_nested_types():
    data = {"stopped": [1, 2], "left": [], "added_by_a_newer_agent": {"x": 1}}
    assert from_data(p.StopAnswer, data) == p.StopAnswer((1, 2), ())
    report = {
        "hostname": "h",
        "future": 1,
        "apply": {"action": "apply", "code": 0, "state": "applied", "message": "", "sha256_after": "ab"},
        "status": {"action": "status", "code": 0, "state": "applied", "message": "ok", "patch_version": 2},
    }
    decoded = from_data(p.HotfixApplyAnswer, report)
    assert decoded.status.patch_version == 2 and decoded.failed is None
    with pytest.raises(DecodeError):
        from_data(p.StopAnswer, {"stopped": []})


def test_agent_answers_typed_over_a_real_process():
    agent = NodeAgent("here", LocalTransport(sys.executable))
    hello = agent.call(p.Hello())
    assert hello.protocol == p.PROTOCOL_VERSION and hello.launcher == __version__
    probe = agent.call(p.Probe())
    assert probe.modules["dspark_launch"].found and probe.python_version.count(".") == 2
    assert agent.call(
        p.AliveQuery((p.Process(os.getpid(), procfs.start_time(os.getpid()), boot_id=procfs.boot_id()),))
    ).alive == (True,)
    assert agent.call(p.AliveQuery((p.Process(os.getpid(), 1),))).alive == (
        False,
    )  # same pid, other start time: not ours


# What an operator's shell may hold that no node process (the head's Ray and vllm serve included) may see.
OPERATOR_SHELL = {
    "HF_TOKEN": "hf_operator_shell_secret",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "AWS_PROFILE": "prod",
    "GOOGLE_APPLICATION_CREDENTIALS": "/root/gcp.json",
    "AZURE_CLIENT_SECRET": "az",
    "VLLM_API_KEY": "sk-shell",
    "LD_PRELOAD": "/tmp/evil.so",
    "SSH_AUTH_SOCK": "/tmp/agent.sock",
    "RAY_ADDRESS": "10.0.0.9:6379",
    "KUBECONFIG": "/root/k",
}


def test_run_and_stop_use_only_the_declared_environment(tmp_path, monkeypatch):
    for name, value in OPERATOR_SHELL.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    agent = NodeAgent("here", LocalTransport(sys.executable))
    log = tmp_path / "env.log"
    marker = f"dspark-{secrets.token_hex(4)}-here"  # a stopped marker is never started again (see below)
    code = "import os,json,time; print(json.dumps(dict(os.environ)), flush=True); time.sleep(60)"
    answer = agent.call(p.Spawn((sys.executable, "-c", code), {"DECLARED": "1"}, marker, str(log)), "spawn")
    try:
        deadline = time.monotonic() + 20
        while not log.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        env = json.loads(log.read_text().splitlines()[0])
        assert env["DECLARED"] == "1" and env["DSPARK_OWNER"] == marker
        assert "HF_TOKEN" not in env and "PYTHONPATH" not in env
        # Exactly a login-like environment (transport.LOGIN_ENV) plus what the request declared.
        assert set(env) <= {*LOGIN_ENV, "DECLARED", "DSPARK_OWNER"}, sorted(set(env) - set(LOGIN_ENV))
    finally:
        stopped = agent.call(p.Stop(marker, (answer.process,), (answer.session,), grace_s=2))
    assert answer.process.pid in stopped.stopped and stopped.left == ()
    assert procfs.start_time(answer.process.pid) is None


def test_a_start_that_arrives_after_its_runs_stop_starts_nothing(tmp_path):
    """An interrupted launcher's rollback can stop a run while one of its starts is still on its way to the
    node: the stop leaves a mark, and the late start is refused with nothing started."""
    agent = NodeAgent("here", LocalTransport(sys.executable))
    marker = f"dspark-{secrets.token_hex(4)}-here"
    agent.call(p.Stop(marker))
    witness = tmp_path / "started"
    with pytest.raises(ClusterFailure, match="was stopped on this node; nothing started"):
        agent.call(p.Run((sys.executable, "-c", f"open({str(witness)!r}, 'w')"), {}, marker, "", 30), "ray start", 60)
    with pytest.raises(ClusterFailure, match="was stopped on this node; nothing started"):
        agent.call(
            p.Spawn((sys.executable, "-c", f"open({str(witness)!r}, 'w')"), {}, marker, str(tmp_path / "log")), "spawn"
        )
    assert never_started(marker, witness)


def test_progress_lines_reach_the_reporter_and_failures_are_typed(tmp_path):
    recorder = Recorder()
    agent = NodeAgent("here", LocalTransport(sys.executable), recorder)
    with pytest.raises(ClusterFailure) as failure:
        agent.call(p.Stop("not-ours"))
    assert failure.value.node == "here" and "refusing to match processes" in failure.value.detail


def _other_version_python(tmp_path: Path) -> str:
    """An interpreter whose dspark_launch says another version (a copy of the package on PYTHONPATH)."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "dspark_launch", site / "dspark_launch", ignore=shutil.ignore_patterns("__pycache__"))
    init = site / "dspark_launch" / "__init__.py"
    init.write_text(init.read_text().replace(f'"{__version__}"', '"0.0.0-other"'))
    wrapper = tmp_path / "python-other"
    # -S: no site-packages, so the editable install of this checkout cannot shadow the copy.
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_node_with_another_launcher_version_is_refused_at_first_contact(tmp_path):
    agent = NodeAgent("worker1 (10.0.0.2)", LocalTransport(_other_version_python(tmp_path)))
    with pytest.raises(VersionMismatch) as mismatch:
        agent.call(p.Probe())
    line = str(mismatch.value)
    assert "worker1 (10.0.0.2): version:" in line and "0.0.0-other" in line and __version__ in line


def test_the_deployment_record_holds_its_own_types_not_wire_types():
    """state.json's format changes only with cluster/state.py: no field of the record is an agent protocol type."""
    import dataclasses
    import typing

    seen, todo, wire = set(), [Deployment], []
    while todo:
        kind = todo.pop()
        if kind in seen:
            continue
        seen.add(kind)
        if getattr(kind, "__module__", "") in (p.__name__, "dspark_launch.node.values"):  # the protocol carries both
            wire.append(kind.__name__)
        if dataclasses.is_dataclass(kind):
            todo += list(typing.get_type_hints(kind).values())
        todo += [arg for arg in typing.get_args(kind) if arg is not type(None)]
    assert not wire and len(seen) > 10, wire


def test_state_from_another_launcher_version_loads_and_corrupt_state_is_named(tmp_path):
    record = Deployment(
        ray_address="10.0.0.1:6379",
        config_digest="d",
        started_at=1.0,
        launcher_version=__version__,
        nodes=[
            NodeRecord(
                name="head",
                ip="10.0.0.1",
                ssh_host=None,
                marker="dspark-x-head",
                processes=[ProcessRecord(1, 2, 1, "b", "raylet")],
            )
        ],
    )
    save_state(tmp_path, record)
    data = json.loads((tmp_path / "state.json").read_text())
    data["field_from_the_future"] = [1]
    data["nodes"][0]["container"] = {"id": "abc"}
    data["server"] = {}
    (tmp_path / "state.json").write_text(json.dumps(data))
    loaded = load_state(tmp_path)
    assert loaded.nodes[0].processes == [ProcessRecord(1, 2, 1, "b", "raylet")] and loaded.server is None
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(StateUnreadable) as error:
        load_state(tmp_path)
    assert str(tmp_path / "state.json") in str(error.value)


def test_stop_with_a_corrupt_state_file_is_one_line_exit_1(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "state.json").write_text('{"nodes": 3}')
    env_file = tmp_path / "env"
    env_file.write_text(
        f"DSPARK_HEAD_IP=127.0.0.1\nDSPARK_WORKER_HOSTS=127.0.0.2\nDSPARK_FABRIC_IFNAME=lo\nDSPARK_STATE_DIR={state}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_launch", "stop", "--env-file", str(env_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error:")]
    assert len(errors) == 1 and str(state / "state.json") in errors[0] and "Traceback" not in proc.stderr


def test_typed_values_round_trip_through_json():
    checks = p.RayChecksAnswer((p.RayNode("abc", "10.213.0.1", True, 1.0),))
    assert from_data(p.RayChecksAnswer, json.loads(json.dumps(to_data(checks)))) == checks
    row = p.VersionRow(python="3.11.7", vllm="0.32.0")
    assert from_data(p.VersionRow, json.loads(json.dumps(to_data(row)))) == row


def test_the_version_row_comes_from_the_node_agent_without_importing_vllm():
    """The row the launcher compares across nodes, asked of a node's agent (launch time, while Ray starts)."""
    import hashlib
    import platform

    from dspark_launch.hotfix import patch_tool as hotfix

    row = NodeAgent("here", LocalTransport(sys.executable)).call(p.VersionQuery())
    target = hotfix.find_target()
    assert row.python == platform.python_version() and row.vllm == "0.32.0" and row.ray and row.torch
    assert row.scheduler_sha256 == (
        hotfix.status(target).original_sha256 or hashlib.sha256(target.read_bytes()).hexdigest()
    )
    probe = (
        "import sys, dspark_launch.agent.handlers.hotfix as t; t.version_row(); "
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules, 'imported'"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60).returncode == 0


def test_the_cuda_row_is_read_without_importing_torch():
    import torch

    from dspark_launch.agent.handlers.hotfix import torch_cuda_version

    assert torch_cuda_version() == torch.version.cuda


def test_the_version_row_names_the_nccl_vllm_will_load(tmp_path, monkeypatch):
    from dspark_launch.agent.handlers import hotfix as node_tasks

    library = tmp_path / "libnccl.so.2.27.7"
    library.write_bytes(b"")
    (tmp_path / "libnccl.so.2").symlink_to(library.name)
    monkeypatch.setenv("VLLM_NCCL_SO_PATH", str(tmp_path / "libnccl.so.2"))  # vLLM loads what it names
    assert node_tasks.nccl_version() == "2.27.7"
    monkeypatch.setenv("VLLM_NCCL_SO_PATH", str(tmp_path / "custom.so"))
    assert node_tasks.nccl_version() == f"VLLM_NCCL_SO_PATH={tmp_path / 'custom.so'}"
    monkeypatch.delenv("VLLM_NCCL_SO_PATH")  # else the wheel torch loads it from
    monkeypatch.setattr(
        node_tasks, "installed_version", lambda *dists: "2.28.3" if dists[0] == "nvidia-nccl-cu13" else None
    )
    assert node_tasks.nccl_version() == "2.28.3"
    from dspark_launch.node.versions import COMPARED_ROWS

    assert "nccl" in COMPARED_ROWS  # compared across nodes like every row
