"""The node container runtime (DSPARK_RUNTIME=podman) on the two-node testbed, real podman.

The launcher's runtime module runs inside the head node (tests.support.containers.drive):
the head's container through LocalHost, the worker's over real SSH. The image is the
registry-free test image (containers.build_test_image); the only difference from
production is DSPARK_TEST_CONTAINER_GPU_ARGS="" (no GPU, RDMA devices or memlock here).
Run under the heavy lock: `flock /tmp/dspark-heavy.lock .venv/bin/python -m pytest tests/test_container_runtime.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.containers import SHARED_STORE, build_test_image, container_testbed

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
        assert Path(shipped, "cluster", "agent.py").read_bytes() == (REPO / "dspark_launch/cluster/agent.py").read_bytes()
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
        assert probe["ok"], probe
        # The agent runs on the image's Python (the test venv baked into the image), vLLM and Ray importable.
        assert probe["modules"]["vllm"]["found"] and probe["modules"]["ray"]["found"]
        assert probe["modules"]["dspark_launch"]["found"]
        assert Path(probe["python"]).parent == Path(sys.executable).parent  # `python3` on the image's PATH
        # Inside the container: its own PID namespace holds only the init, `sleep infinity` and the agent.
        pids = ctb.drive(node, {"op": "agent", "spec": spec,
                                "request": {"op": "glob", "root": "/proc", "pattern": "[0-9]*"}})["answer"]["paths"]
        assert "/proc/1" in pids and len(pids) <= 4, pids
        # Host network: the node's own fabric address is visible inside the container.
        fabric = ctb.drive(node, {"op": "agent", "spec": spec,
                                  "request": {"op": "interface", "ifname": "fab0", "ip": node.ip}})["answer"]
        assert fabric["ok"] and fabric["has_ip"], fabric

        # The agent inside sees the state folder at its host path (same file both sides).
        probe_dir = ctb.drive(node, {"op": "agent", "spec": spec,
                                     "request": {"op": "probe", "log_dir": spec["state_dir"] + "/logs"}})["answer"]
        assert probe_dir["log_dir_error"] is None
        assert Path(spec["state_dir"], "logs").is_dir()

        # Logs are written and read inside (the agent's run/tail), and are the host's files too.
        log = spec["state_dir"] + f"/logs/{name}-inside.log"
        ran = ctb.drive(node, {"op": "agent", "spec": spec, "request": {
            "op": "run", "argv": ["sh", "-c", "echo written-inside-$$"], "marker": marker, "log": log,
            "timeout": 30}})["answer"]
        assert ran["ok"] and ran["returncode"] == 0, ran
        tail = ctb.drive(node, {"op": "agent", "spec": spec,
                                "request": {"op": "tail", "paths": [log], "lines": 5}})["answer"]
        assert any(line.startswith("written-inside-") for line in tail["lines"]), tail
        assert Path(log).read_text().startswith("written-inside-")
        # A long-lived child the agent starts inside (as Ray will be) ends with the container.
        spawned = ctb.drive(node, {"op": "agent", "spec": spec, "request": {
            "op": "spawn", "argv": ["sleep", "600"], "marker": marker, "log": log}})["answer"]
        assert spawned["ok"], spawned
        assert any("sleep 600" in " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0"))
                   for pid in _ours_left(ctb, node) if Path(f"/proc/{pid}/cmdline").exists())

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
    for extra in (["--network", "bridge"], ["--pid=host"],
                  ["-v", f"/tmp:{ctb.spec_desc(marker)['state_dir']}"], ["--mount", "type=tmpfs,target=/opt/dspark-launch"]):
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
    tiny = tb.exec(worker, ["sh", "-c", f"cd {tb.state_dir} && echo other > other.txt && "
                            f"tar -cf - other.txt | podman import - {tag}"])
    assert tiny.returncode == 0, tiny.stderr
    try:
        ids = [ctb.drive(n, {"op": "resolve", "image": tag, "node": n.name})["identity"] for n in (head, worker)]
        assert all(i["image_id"].startswith("sha256:") for i in ids)
        assert ids[0]["image_id"] != ids[1]["image_id"]
        check = _check_same(ids)
        assert check.startswith("ImageMismatch") and "differs between nodes" in check
        assert "head" in check and "worker1" in check

        same = [ctb.drive(n, {"op": "resolve", "image": ctb.image.tag, "node": n.name})["identity"]
                for n in (head, worker)]
        assert _check_same(same) == "sha256:" + ctb.image.image_id

        missing = [ctb.drive(n, {"op": "resolve", "image": "localhost/none:here", "node": n.name})["identity"]
                   for n in (head, worker)]
        assert "is not on head, worker1" in _check_same(missing)
    finally:
        ctb.podman(head, "rmi", tag)
        ctb.podman(worker, "rmi", tag)


def _check_same(identities: list[dict]) -> str:
    from dspark_launch.cluster.runtime import ImageIdentity, ImageMismatch, check_same_image

    try:
        return check_same_image([ImageIdentity(**{**i, "repo_digests": tuple(i["repo_digests"])})
                                 for i in identities])
    except ImageMismatch as exc:
        return f"ImageMismatch: {exc}"

