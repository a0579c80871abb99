"""Launcher-side model operations (node checks through each node's agent) run inside the testbed's head node (where the workers' sshd is
reachable): `python -m tests.support.model_runner` with one JSON request on stdin, one JSON answer on stdout.

Requests: {"op": "pull_everywhere" | "place_local" | "sync" | "check_disk" | "verify" | "fast_check",
"target": SSHTarget fields, "source": HubSource fields, "folder": a local model folder,
"python": the worker's interpreter, "worker": node name, "location": ModelLocation fields,
"manifest": manifest JSON, "streams": int, "full": bool}.
Answers: the result as a dict, or {"error": class name, "message": one line}; each with "calls": the
agent operations sent to each node ({"head": [...], "worker1": [...]}) and "rsync_runs": the streams of
each rsync round (counted, for tests that bound the round trips of a re-pull).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from dspark_launch.errors import DsparkError
from dspark_launch.model import distribute
from dspark_launch.model.copy import SSHTarget
from dspark_launch.model.distribute import check_disk, sync_worker
from dspark_launch.model.errors import ModelError
from dspark_launch.model.hub import HubSource
from dspark_launch.model.location import ModelLocation
from dspark_launch.model.workflow import Worker, place_local, pull_everywhere
from dspark_launch.node.manifest import Manifest
from tests.support.model_nodes import agent_calls, head_ops, worker_ops

RSYNC_RUNS: list[int] = []  # streams of each rsync_to call, in order


def _counted_rsync(*args, **kwargs):
    result = _rsync_to(*args, **kwargs)
    RSYNC_RUNS.append(result.streams)
    return result


_rsync_to, distribute.rsync_to = distribute.rsync_to, _counted_rsync


def handle(req: dict, head, worker) -> dict:
    target = SSHTarget(**{**req["target"], "extra_options": tuple(req["target"]["extra_options"])})
    if req["op"] == "pull_everywhere":
        source = HubSource(**req["source"])
        return asdict(pull_everywhere(source, head, [Worker(target, worker)], req.get("streams", 4)))
    if req["op"] == "place_local":
        return asdict(place_local(req["folder"], head, [Worker(target, worker)], req.get("streams", 4)))
    location = ModelLocation(**req["location"])
    manifest = Manifest.from_json(req["manifest"])
    if req["op"] == "sync":
        return asdict(
            sync_worker(location, manifest, target, worker, streams=req.get("streams", 4), full=req.get("full", False))
        )
    if req["op"] == "check_disk":
        return {"checks": [asdict(c) for c in check_disk(location, manifest, [head, worker])]}
    if req["op"] == "fast_check":
        return asdict(worker.fast_check(location.folder, manifest.stamp))
    return asdict(worker.verify(location.folder, manifest, req.get("full", True)))


def main() -> int:
    req = json.load(sys.stdin)
    target = SSHTarget(**{**req["target"], "extra_options": tuple(req["target"]["extra_options"])})
    head = head_ops(req["python"], counted=True)
    worker = worker_ops(req["worker"], target, req["python"], counted=True)
    try:
        answer = handle(req, head, worker)
    except (ModelError, DsparkError) as exc:  # a node's refusal (ClusterFailure) too
        answer = {"error": type(exc).__name__, "message": str(exc)}
    answer["calls"] = {"head": agent_calls(head), req["worker"]: agent_calls(worker)}
    answer["rsync_runs"] = RSYNC_RUNS
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
