"""Node operations for the model tests, until the agent (issue 10) carries them.

`LocalNodeOps` runs dspark_launch.model.node_check in this process (the head).
`SSHNodeOps` runs the same functions on a worker over the launcher's SSH settings
(`python -c`, arguments as JSON on stdin): the honest stand-in for the agent; the
integrator replaces both with the per-node agent client's methods.
Plus mount helpers that give one testbed node its own view of a path.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import asdict, dataclass

from dspark_launch.model.copy import SSHTarget
from dspark_launch.model.manifest import Manifest
from dspark_launch.model.node_check import DiskSpace, FileProblem, VerifyReport, fast_check, free_space, verify_model

_REMOTE = r"""
import json, sys
from dataclasses import asdict
from dspark_launch.model import node_check
from dspark_launch.model.manifest import Manifest
req = json.load(sys.stdin)
if req["op"] == "free_space":
    out = node_check.free_space(req["path"])
elif req["op"] == "fast_check":
    out = node_check.fast_check(req["folder"], req["stamp"])
else:
    out = node_check.verify_model(req["folder"], Manifest.from_json(req["manifest"]), req["full"])
print(json.dumps(asdict(out)))
"""


def report_from(data: dict) -> VerifyReport:
    return VerifyReport(data["folder"], data["full"], data["files_checked"], data["bytes_checked"],
                        tuple(FileProblem(**p) for p in data["problems"]))


@dataclass(frozen=True)
class LocalNodeOps:
    name: str = "head"

    def free_space(self, path: str) -> DiskSpace:
        return free_space(path)

    def verify(self, folder: str, manifest: Manifest, full: bool) -> VerifyReport:
        return verify_model(folder, manifest, full)

    def fast_check(self, folder: str, stamp: str) -> VerifyReport:
        return fast_check(folder, stamp)


@dataclass(frozen=True)
class SSHNodeOps:
    name: str
    target: SSHTarget
    python: str

    def _call(self, request: dict) -> dict:
        argv = self.target.ssh_argv() + ["--", self.target.host, shlex.join([self.python, "-c", _REMOTE])]
        proc = subprocess.run(argv, input=json.dumps(request), capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name}: node operation failed: {proc.stderr.strip()[-500:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def free_space(self, path: str) -> DiskSpace:
        return DiskSpace(**self._call({"op": "free_space", "path": path}))

    def verify(self, folder: str, manifest: Manifest, full: bool) -> VerifyReport:
        return report_from(self._call({"op": "verify", "folder": folder, "manifest": manifest.to_json(), "full": full}))

    def fast_check(self, folder: str, stamp: str) -> VerifyReport:
        return report_from(self._call({"op": "fast_check", "folder": folder, "stamp": stamp}))


def mount_in_node(tb, node, argv_tail: list[str]) -> None:
    """`mount ARGS` inside one node's mount namespace only (the others keep the host's view)."""
    tb.exec(node, ["mount", *argv_tail], check=True)


def bind_in_node(tb, node, source: str, path: str) -> None:
    tb.exec(node, ["mkdir", "-p", path], check=True)
    mount_in_node(tb, node, ["--bind", source, path])


def tmpfs_in_node(tb, node, path: str, size: str) -> None:
    tb.exec(node, ["mkdir", "-p", path], check=True)
    mount_in_node(tb, node, ["-t", "tmpfs", "-o", f"size={size},mode=0755", "dspark-model-test", path])


def umount_in_node(tb, node, path: str) -> None:
    tb.exec(node, ["umount", "-l", path], check=False)


def asjson(value) -> str:
    return json.dumps(asdict(value))
