"""The node container runtime (DSPARK_RUNTIME=podman) on the two-node testbed, real podman.

The launcher's runtime module runs inside the head node (tests.support.containers.drive):
the head's container through LocalHost, the worker's over real SSH. The image is the
registry-free test image (containers.build_test_image); the only difference from
production is DSPARK_TEST_CONTAINER_GPU_ARGS="" (no GPU, RDMA devices or memlock here).
Run under the heavy lock: `flock /tmp/dspark-heavy.lock .venv/bin/python -m pytest tests/test_container_runtime.py`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.containers import SHARED_STORE, build_test_image, container_testbed
from tests.support.disk_room import image_present

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def ctb(testbed):
    return container_testbed(testbed, REPO)


def _marker(node) -> str:
    return f"dspark-ctest-{node.name}"


def _ours_left(ctb, node) -> set[int]:
    """Processes in the node besides the testbed's own (holder, sshd)."""
    return ctb.tb.pids_in(node, include_infra=False)


def test_image_is_built_once_and_reused(ctb):
    again = build_test_image(Path(sys.executable).parent.parent, REPO)
    assert again.tag == ctb.image.tag and again.image_id == ctb.image.image_id
    assert again.build_seconds == 0.0  # found in the shared store by its content key
    assert (SHARED_STORE / "overlay-images").is_dir()
    assert image_present(Path(sys.executable).parent.parent, REPO)  # `make test`'s disk check counts it as built


@pytest.mark.parametrize("name", ["head", "worker1"])
def test_node_container_runs_the_agent_on_the_nodes_network(ctb, name):
    tb = ctb.tb
    node = tb.node(name)
    marker = _marker(node)
    spec = ctb.spec_desc(marker)
    if not node.is_head:
        # The worker mounts a copy of the head's package, shipped over SSH into its state folder.
        ship = {"op": "ship", "package": str(REPO / "dspark_launch"), "dest_root": spec["state_dir"]}
        shipped = ctb.drive(node, ship)["path"]
        assert shipped.startswith(spec["state_dir"] + "/agent-") and ctb.drive(node, ship)["path"] == shipped
        assert (
            Path(shipped, "agent", "node_end.py").read_bytes()
            == (REPO / "dspark_launch/agent/node_end.py").read_bytes()
        )
        spec["agent_package"] = shipped
    try:
        up = ctb.drive(node, {"op": "up", "spec": spec})
        assert "error" not in up, up
        assert up["state"]["status"] == "running"
        assert up["state"]["name"] == marker and up["state"]["owner"] == marker
        assert up["state"]["image_id"] == "sha256:" + ctb.image.image_id

        # The container is the node's: its podman lists it by the marker's name, the other node's does not.
        listed = ctb.podman(node, "ps", "--format", "{{.Names}}").stdout.split()
        assert marker in listed
        other = tb.workers[0] if node.is_head else tb.head
        assert marker not in ctb.podman(other, "ps", "--all", "--format", "{{.Names}}").stdout.split()

        probe = ctb.drive(node, {"op": "agent", "spec": spec, "request": {"op": "probe"}})["answer"]
        # The agent runs on the image's Python (the test venv baked into the image), vLLM and Ray importable.
        assert probe["modules"]["vllm"]["found"] and probe["modules"]["ray"]["found"]
        assert probe["modules"]["dspark_launch"]["found"]
        assert Path(probe["python"]).parent == Path(sys.executable).parent  # `python3` on the image's PATH
        # Inside the container: its own PID namespace holds only the init, `sleep infinity` and the agent.
        pids = ctb.drive(
            node, {"op": "agent", "spec": spec, "request": {"op": "glob", "root": "/proc", "pattern": "[0-9]*"}}
        )["answer"]["paths"]
        assert "/proc/1" in pids and len(pids) <= 4, pids
        # Host network: the node's own fabric address is visible inside the container.
        fabric = ctb.drive(
            node, {"op": "agent", "spec": spec, "request": {"op": "interface_query", "ifname": "fab0", "ip": node.ip}}
        )["answer"]
        assert fabric["has_ip"], fabric

        # The agent inside sees the state folder at its host path (same file both sides).
        log_dir = ctb.drive(
            node,
            {"op": "agent", "spec": spec, "request": {"op": "prepare_log_dir", "path": spec["state_dir"] + "/logs"}},
        )["answer"]
        assert log_dir["error"] is None
        assert Path(spec["state_dir"], "logs").is_dir()

        # Logs are written and read inside (the agent's run/tail), and are the host's files too.
        log = spec["state_dir"] + f"/logs/{name}-inside.log"
        ran = ctb.drive(
            node,
            {
                "op": "agent",
                "spec": spec,
                "request": {
                    "op": "run",
                    "argv": ["sh", "-c", "echo written-inside-$$"],
                    "env": {},
                    "marker": marker,
                    "log": log,
                    "timeout": 30,
                },
            },
        )["answer"]
        assert ran["returncode"] == 0, ran
        tail = ctb.drive(node, {"op": "agent", "spec": spec, "request": {"op": "tail", "paths": [log], "lines": 5}})[
            "answer"
        ]
        assert any(line.startswith("written-inside-") for line in tail["lines"]), tail
        assert Path(log).read_text().startswith("written-inside-")
        # A long-lived child the agent starts inside (as Ray will be) ends with the container.
        spawned = ctb.drive(
            node,
            {
                "op": "agent",
                "spec": spec,
                "request": {"op": "spawn", "argv": ["sleep", "600"], "env": {}, "marker": marker, "log": log},
            },
        )["answer"]
        assert spawned["process"]["pid"] > 0, spawned
        assert any(
            "sleep 600" in " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0"))
            for pid in _ours_left(ctb, node)
            if Path(f"/proc/{pid}/cmdline").exists()
        )

        assert _ours_left(ctb, node), "the container's processes live in the node"
        down = ctb.drive(node, {"op": "down", "marker": marker})
        assert down == {"removed": True}
        gone = ctb.drive(node, {"op": "inspect", "name": marker})["state"]
        assert gone["status"] == "absent"
        assert ctb.podman(node, "ps", "--all", "--quiet").stdout.strip() == ""
        assert _ours_left(ctb, node) == set()
        assert ctb.drive(node, {"op": "down", "marker": marker}) == {"removed": False}
    finally:
        ctb.podman(node, "rm", "--force", "--time", "1", marker)


def test_down_leaves_a_container_that_is_not_ours(ctb):
    node = ctb.tb.head
    marker = "dspark-ctest-foreign"
    created = ctb.podman(node, "create", "--name", marker, ctb.image.tag, "true")
    assert created.returncode == 0, created.stderr
    try:
        answer = ctb.drive(node, {"op": "down", "marker": marker})
        assert answer["error"] == "ContainerError" and "not ours" in answer["message"]
        assert ctb.podman(node, "container", "exists", marker).returncode == 0
    finally:
        ctb.podman(node, "rm", "--force", marker)


def test_refused_container_args_start_nothing(ctb):
    node = ctb.tb.head
    marker = "dspark-ctest-refused"
    for extra in (
        ["--network", "bridge"],
        ["--pid=host"],
        ["-v", f"/tmp:{ctb.spec_desc(marker)['state_dir']}"],
        ["--mount", "type=tmpfs,target=/opt/dspark-launch"],
    ):
        answer = ctb.drive(node, {"op": "up", "spec": ctb.spec_desc(marker, extra_args=extra)})
        assert answer["error"] == "ConfigError" and answer["exit_code"] == 2, answer
        assert "DSPARK_CONTAINER_ARGS" in answer["message"]
    assert ctb.podman(node, "ps", "--all", "--quiet").stdout.strip() == ""


def test_different_image_digests_on_the_nodes_are_detected(ctb):
    tb = ctb.tb
    tag = "localhost/dspark-test-node:digest-check"
    head, worker = tb.head, tb.workers[0]
    # Same tag on both nodes: the shared test image on the head, a one-file image on the worker.
    assert ctb.podman(head, "tag", ctb.image.tag, tag).returncode == 0
    tiny = tb.exec(
        worker,
        ["sh", "-c", f"cd {tb.state_dir} && echo other > other.txt && tar -cf - other.txt | podman import - {tag}"],
    )
    assert tiny.returncode == 0, tiny.stderr
    try:
        ids = [ctb.drive(n, {"op": "resolve", "image": tag, "node": n.name})["identity"] for n in (head, worker)]
        assert all(i["image_id"].startswith("sha256:") for i in ids)
        assert ids[0]["image_id"] != ids[1]["image_id"]
        check = _check_same(ids)
        assert check.startswith("ImageMismatch") and "differs between nodes" in check
        assert "head" in check and "worker1" in check

        same = [
            ctb.drive(n, {"op": "resolve", "image": ctb.image.tag, "node": n.name})["identity"] for n in (head, worker)
        ]
        assert _check_same(same) == "sha256:" + ctb.image.image_id

        missing = [
            ctb.drive(n, {"op": "resolve", "image": "localhost/none:here", "node": n.name})["identity"]
            for n in (head, worker)
        ]
        assert "is not on head, worker1" in _check_same(missing)
    finally:
        ctb.podman(head, "rmi", tag)
        ctb.podman(worker, "rmi", tag)


def _check_same(identities: list[dict]) -> str:
    from dspark_launch.cluster.container_engine import ImageIdentity, ImageMismatch, check_same_image

    try:
        return check_same_image([ImageIdentity(**{**i, "repo_digests": tuple(i["repo_digests"])}) for i in identities])
    except ImageMismatch as exc:
        return f"ImageMismatch: {exc}"


# ---------------------------------------------------------------- the launcher with DSPARK_RUNTIME=podman


def _container_env(ctb, tmp_path: Path, model: Path, image: str, **extra: str) -> Path:
    from tests.support.launcher_env import scratch, serving_values
    from tests.support.on_testbed import write_env

    values = {
        **serving_values(model),
        "START_TIMEOUT_S": "400",
        "VLLM_API_KEY": "sk-dspark-ctest-5e1d",
        "DSPARK_RUNTIME": "podman",
        "DSPARK_IMAGE": image,
        # The model folder lies in the mounted cache; vLLM's sockets and compile cache in a mounted scratch.
        "DSPARK_CONTAINER_MODEL_CACHE": str(model.parent),
        "DSPARK_CONTAINER_ARGS": f"--volume {scratch(tmp_path)}:{scratch(tmp_path)}",
    }
    return write_env(ctb.tb, tmp_path, **{**values, **extra})


def _dspark(ctb, tmp_path: Path, env_file: Path, *args: str, timeout: float = 600):
    from tests.support.launcher_env import launcher_env, scratch
    from tests.support.on_testbed import VENV_BIN

    env = {**launcher_env(scratch(tmp_path)), "DSPARK_TEST_CONTAINER_GPU_ARGS": ""}  # the test hook
    return ctb.tb.exec("head", [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)], env=env, timeout=timeout)


def _status(ctb, tmp_path, env_file) -> tuple[int, dict]:
    import json

    proc = _dspark(ctb, tmp_path, env_file, "status", "--json")
    return proc.returncode, json.loads(proc.stdout)


def _containers(ctb, node) -> list[str]:
    return ctb.podman(node, "ps", "--all", "--format", "{{.Names}}").stdout.split()


def test_start_refuses_different_images_on_the_nodes(ctb, tmp_path, tiny_model):
    tb = ctb.tb
    tag = "localhost/dspark-test-node:start-check"
    assert ctb.podman(tb.head, "tag", ctb.image.tag, tag).returncode == 0
    other = tb.exec(
        tb.workers[0],
        ["sh", "-c", f"cd {tb.state_dir} && echo other > other2.txt && tar -cf - other2.txt | podman import - {tag}"],
    )
    assert other.returncode == 0, other.stderr
    try:
        env = _container_env(ctb, tmp_path, tiny_model, tag)
        refused = _dspark(ctb, tmp_path, env, "start", timeout=120)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "differs between nodes" in refused.stderr and "head" in refused.stderr and "worker1" in refused.stderr
        # Nothing started: no container, no process, no record.
        assert _containers(ctb, tb.head) == [] and _containers(ctb, tb.workers[0]) == []
        assert _ours_left(ctb, tb.head) == set() and _ours_left(ctb, tb.workers[0]) == set()
        assert not (tmp_path / "state" / "state.json").exists()
    finally:
        ctb.podman(tb.head, "rmi", tag)
        ctb.podman(tb.workers[0], "rmi", tag)


def test_start_restart_degraded_stop_in_node_containers(ctb, tmp_path, tiny_model, step):
    """One serve: `start` (TP=2 across the two containers), drift, `restart`, a killed container, `stop`."""
    import json
    import re
    import shutil

    from tests.support.launcher_env import scratch
    from tests.support.model_nodes import bind_in_node, umount_in_node
    from tests.support.on_testbed import processes_named, scheduler_sha, set_knob

    tb = ctb.tb
    worker = tb.workers[0]
    # The model in a folder of the mounted cache; the worker's copy of that folder is its own disk.
    models = Path(f"/tmp/dspctr-{os.getpid()}")
    model, worker_disk = models / "tiny", tmp_path / "worker-disk"
    shutil.copytree(tiny_model, model, ignore=shutil.ignore_patterns(".dspark-manifest.json*"))
    worker_disk.mkdir()
    bind_in_node(tb, worker, str(worker_disk), str(model))
    env = _container_env(ctb, tmp_path, model, ctb.image.tag)
    host_sha = {n: scheduler_sha(tb, n) for n in ("head", "worker1")}
    try:
        step("model pull without a node container")
        # `model pull` with no node container: the head hashes in the launcher's Python, the worker's check
        # runs in a --rm container from the checked image; the copy goes to the worker's own disk.
        assert _containers(ctb, tb.head) == [] and _containers(ctb, worker) == []
        pulled = _dspark(ctb, tmp_path, env, "model", "pull", "--json", timeout=300)
        assert pulled.returncode == 0, pulled.stdout[-2000:] + pulled.stderr[-3000:]
        placed = json.loads(pulled.stdout)
        assert placed["workers"][0]["report"]["problems"] == [] and placed["workers"][0]["report"]["bytes_checked"] > 0
        assert (worker_disk / "config.json").read_bytes() == (model / "config.json").read_bytes()
        assert (worker_disk / ".dspark-manifest.json").is_file()
        assert _containers(ctb, tb.head) == [] and _containers(ctb, worker) == []  # the --rm ones are gone
        assert _dspark(ctb, tmp_path, env, "model", "status").returncode == 0

        step("start in the node containers")
        started = _dspark(ctb, tmp_path, env, "start")
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-4000:]
        assert "serving " in started.stdout and "in-flight prefill cap: 1" in started.stdout
        assert "hotfix head: applied" in started.stdout and "hotfix worker1: applied" in started.stdout
        record = json.loads((tmp_path / "state" / "state.json").read_text())
        names = {n["name"]: n["container_name"] for n in record["nodes"]}
        assert names["head"].endswith("-head") and names["worker1"].endswith("-worker1")
        image_id = "sha256:" + ctb.image.image_id
        assert {n["container_image_id"] for n in record["nodes"]} == {image_id}
        assert {row["image"] for row in record["versions"].values()} == {image_id}
        # Each node runs exactly its own container; Ray and vLLM's TP ranks run inside them.
        assert _containers(ctb, tb.head) == [names["head"]] and _containers(ctb, worker) == [names["worker1"]]
        for node in (tb.head, worker):
            init = ctb.podman(node, "inspect", "--format", "{{.State.Pid}}", names[node.name]).stdout.strip()
            inside = os.readlink(f"/proc/{init}/ns/pid")
            ranks = processes_named(tb, node.name, "RayWorkerProc")
            assert ranks and all(os.readlink(f"/proc/{pid}/ns/pid") == inside for pid in ranks), node.name
        # The hotfix patched the image's vLLM inside the containers, not the nodes' own venvs.
        assert {n: scheduler_sha(tb, n) for n in ("head", "worker1")} == host_sha
        log = (tmp_path / "state" / "logs" / "vllm-serve.log").read_text(errors="replace")
        assert re.search(r"dspark-issue27 hotfix v\d+ active: cap=1 ", log)

        step("status and logs")
        code, data = _status(ctb, tmp_path, env)
        assert code == 0 and data["state"] == "up", data
        assert [(n["name"], n["container"], n["container_status"], n["image_id"]) for n in data["nodes"]] == [
            ("head", names["head"], "running", image_id),
            ("worker1", names["worker1"], "running", image_id),
        ]
        assert data["server"]["healthy"] and data["server"]["cap"] == 1
        text = _dspark(ctb, tmp_path, env, "status").stdout
        assert names["worker1"] in text and image_id[:19] in text
        # `logs` reads inside the worker's container (Ray's own log under its temp dir there).
        logs = _dspark(ctb, tmp_path, env, "logs", "--node", "worker1", "--tail", "5")
        assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr

        step("drift, then a serve-only restart with cap 2")
        # A cap change: drift shown; `restart` is serve-only (issue 24): the containers and Ray stay, the
        # scheduler logs the new cap.
        set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", "2")
        assert (
            "drift: DSPARK_MAX_INFLIGHT_PREFILLS 1 -> 2: `dspark reload` applies it"
            in _dspark(ctb, tmp_path, env, "status").stdout
        )
        ids = lambda: {
            n.name: ctb.podman(n, "inspect", "--format", "{{.Id}}", names[n.name]).stdout.strip()  # noqa: E731
            for n in (tb.head, worker)
        }
        first_ids = ids()
        # The JIT caches live in the node's host folder, mounted at its path: kept by a reused container.
        jit = tmp_path / "state" / "jit-cache"
        inside = ctb.podman(worker, "exec", names["worker1"], "printenv", "TRITON_CACHE_DIR").stdout.strip()
        assert inside == str(jit / "triton")
        (jit / "triton").mkdir(parents=True, exist_ok=True)
        (jit / "triton" / "kept").write_text("compiled")
        restarted = _dspark(ctb, tmp_path, env, "restart")
        assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-4000:]
        assert "hotfix head: applied" in restarted.stdout and "hotfix worker1: applied" in restarted.stdout
        # Serve-only (issue 24): Ray and the containers stay up (no container start, so no "reusing" line);
        # the JIT cache in the kept container is still there.
        assert "restart: serve-only" in restarted.stderr, restarted.stderr[-3000:]
        assert ids() == first_ids, "a serve-only restart keeps both containers"
        assert ctb.podman(worker, "exec", names["worker1"], "cat", str(jit / "triton" / "kept")).stdout == "compiled"
        log = (tmp_path / "state" / "logs" / "vllm-serve.log").read_text(errors="replace")
        assert re.search(r"dspark-issue27 hotfix v\d+ active: cap=2 ", log)
        code, data = _status(ctb, tmp_path, env)
        assert code == 0 and data["server"]["cap"] == 2 and data["server"]["drift"] == [], data

        step("the worker's container is killed: degraded")
        # The worker's container is killed: status says degraded, naming it.
        assert ctb.podman(worker, "kill", names["worker1"]).returncode == 0
        code, data = _status(ctb, tmp_path, env)
        assert code == 1 and data["state"] == "degraded", data
        assert data["nodes"][1]["container_status"] in ("exited", "stopped"), data["nodes"]
        assert any(f"container {names['worker1']} is" in p for p in data["problems"]), data["problems"]

        step("stop: the head's container stays, warm")
        # `stop` ends Ray and vLLM inside; the head's container stays, idle and warm; the dead one goes.
        stopped = _dspark(ctb, tmp_path, env, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert _containers(ctb, tb.head) == [names["head"]] and _containers(ctb, worker) == []
        assert processes_named(tb, "head", "RayWorkerProc") == [] and processes_named(tb, "head", "raylet") == []
        assert not (tmp_path / "state" / "state.json").exists()

        step("other container arguments: the container recreated")
        # Other container arguments: the kept container is not reused but recreated (`cluster up`: no serve).
        set_knob(env, "DSPARK_CONTAINER_ARGS", f"--volume {scratch(tmp_path)}:{scratch(tmp_path)} --env DSPARK_CTEST=2")
        head_before = ids()["head"]
        up = _dspark(ctb, tmp_path, env, "cluster", "up")
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-3000:]
        assert ids()["head"] != head_before and "reusing container" not in up.stderr
        assert ctb.podman(tb.head, "exec", names["head"], "printenv", "DSPARK_CTEST").stdout.strip() == "2"

        step("stop --remove: nothing left")
        removed = _dspark(ctb, tmp_path, env, "stop", "--remove")
        assert removed.returncode == 0, removed.stderr
        assert _containers(ctb, tb.head) == [] and _containers(ctb, worker) == []
        left = _ours_left(ctb, tb.head) | _ours_left(ctb, worker)
        assert left == set(), left
        assert not (tmp_path / "state" / "state.json").exists()
    finally:
        for node in (tb.head, worker):
            ctb.podman(node, "rm", "--force", "--all", "--time", "1")
        umount_in_node(tb, worker, str(model))
        shutil.rmtree(models, ignore_errors=True)


def test_an_image_without_ray_is_one_line_naming_the_dockerfile_fix(ctb, tmp_path, tiny_model):
    """The image's Python sees vLLM but not Ray (as in recent NGC vLLM images): a wrapper interpreter in a
    mounted folder hides Ray from everything it runs."""
    import json as _json
    from importlib import metadata

    from tests.support.launcher_env import scratch

    tb = ctb.tb
    folder = scratch(tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "python-noray"
    hide_ray = "import runpy, sys; sys.modules['ray'] = None; runpy.run_module(sys.argv[2], run_name='__main__', alter_sys=True)"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -c {_json.dumps(hide_ray)} "$@"\n')
    wrapper.chmod(0o755)
    env = _container_env(ctb, tmp_path, tiny_model, ctb.image.tag, DSPARK_CONTAINER_PYTHON=str(wrapper))
    refused = _dspark(ctb, tmp_path, env, "start", timeout=300)
    assert refused.returncode == 1, refused.stdout[-2000:] + refused.stderr[-3000:]
    line = (
        f"image {ctb.image.tag} has no Ray: build FROM {ctb.image.tag} with "
        f"`pip install ray=={metadata.version('ray')}`"
    )
    assert line in refused.stderr, refused.stderr[-3000:]
    assert refused.stderr.count("dspark: error") == 1
    # Nothing left running: no container, no process, no record.
    assert _containers(ctb, tb.head) == [] and _containers(ctb, tb.workers[0]) == []
    assert _ours_left(ctb, tb.head) == set() and _ours_left(ctb, tb.workers[0]) == set()
    assert not (tmp_path / "state" / "state.json").exists()
