"""A testbed's state file, its nodes, and running things inside a node (nsenter)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from tests.support.processes import alive, terminate_pids
from tests.support.testbed.base import STATE_FILE, Node, TestbedError
from tests.support.testbed.namespaces import file_ns_id, ns_id, pids_in_namespaces


class NodeAccess:
    """State, node lookup, exec/popen inside a node, the processes a node holds."""

    state_dir: str
    prefix: str

    # ----------------------------------------------------------------- paths and state

    def _p(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    @property
    def ssh_key(self) -> str:
        """The root client private key (its .pub is every worker's AuthorizedKeysFile)."""
        return self._p("ssh", "id_ed25519")

    @property
    def known_hosts(self) -> str:
        """A known_hosts file already holding every worker's host key (by IP)."""
        return self._p("ssh", "known_hosts")

    @property
    def fabric_netns(self) -> str:
        return f"{self.prefix}-fabric"

    def _lock_path(self) -> str:
        return self.state_dir.rstrip("/") + ".lock"

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(self._lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read_state(self) -> Optional[dict]:
        try:
            with open(self._p(STATE_FILE)) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    def _write_state(self, state: dict) -> None:
        tmp = self._p(STATE_FILE + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(state, fh, indent=2, sort_keys=True)
        os.replace(tmp, self._p(STATE_FILE))

    def _state(self) -> dict:
        st = self._read_state()
        if not st:
            raise TestbedError(f"no testbed at {self.state_dir} (run `up` first)")
        return st

    def _holder_ok(self, rec: dict) -> bool:
        pid, ns = rec.get("holder_pid"), rec.get("ns")
        if not pid or not ns or rec.get("holder_start") is None or not alive(pid, rec["holder_start"]):
            return False
        return all(ns_id(pid, k) == tuple(ns[k]) for k in ("net", "mnt", "uts"))

    # ----------------------------------------------------------------- nodes

    @property
    def nodes(self) -> List[Node]:
        st = self._state()
        return [
            Node(r["name"], r["ip"], r["hostname"], r["netns"], r["holder_pid"], r["name"] == "head")
            for r in st["nodes"]
        ]

    def node(self, name) -> Node:
        if isinstance(name, Node):
            return name
        for n in self.nodes:
            if name in (n.name, n.hostname, n.ip, n.netns):
                return n
        raise TestbedError(f"no node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> List[Node]:
        return self.nodes[1:]

    def _rec(self, node) -> dict:
        name = self.node(node).name
        return next(r for r in self._state()["nodes"] if r["name"] == name)

    # ----------------------------------------------------------------- running things

    def _nsenter(self, pid: int, net=True, mnt=True, uts=True) -> List[str]:
        argv = ["nsenter", "-t", str(pid)]
        if net:
            argv.append("-n")
        if mnt:
            argv.append("-m")
        if uts:
            argv.append("-u")
        return argv

    def _node_argv(self, node, argv: Sequence[str], cwd: Optional[str]) -> List[str]:
        rec = self._rec(node)
        if not self._holder_ok(rec):
            raise TestbedError(f"node {rec['name']}: holder process {rec['holder_pid']} is gone (run down, then up)")
        cwd = os.path.abspath(cwd or os.getcwd())
        # --wdns resolves the directory inside the node's mount namespace (so a cwd
        # inside the venv sees the node's overlay); plain --wd would keep the host's.
        return [*self._nsenter(rec["holder_pid"]), f"--wdns={cwd}", "--", *argv]

    def _env(self, env: Optional[Mapping[str, str]]) -> Optional[dict]:
        return None if env is None else {**os.environ, **{k: str(v) for k, v in env.items()}}

    def exec(
        self,
        node,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        check: bool = False,
        timeout: Optional[float] = 120,
        capture: bool = True,
        text: bool = True,
        cwd: Optional[str] = None,
        input: Optional[str] = None,
    ) -> subprocess.CompletedProcess:
        """Run argv inside the node's net, mount and UTS namespaces.

        env is added on top of this process's environment; cwd defaults to ours.
        """
        full = self._node_argv(node, list(argv), cwd)
        r = subprocess.run(
            full,
            env=self._env(env),
            capture_output=capture,
            text=text,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and r.returncode != 0:
            raise subprocess.CalledProcessError(r.returncode, list(argv), r.stdout, r.stderr)
        return r

    def popen(
        self, node, argv: Sequence[str], env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, **kw
    ) -> subprocess.Popen:
        """subprocess.Popen of argv inside the node (same env/cwd rules as exec)."""
        return subprocess.Popen(self._node_argv(node, list(argv), cwd), env=self._env(env), **kw)

    def nsenter_argv(self, node, cwd: Optional[str] = None) -> List[str]:
        """The argv prefix (ending in '--') that runs a command inside the node."""
        return self._node_argv(node, [], cwd)

    def _run(self, argv: Sequence[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        r = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)
        if check and r.returncode != 0:
            raise TestbedError(f"`{shlex.join(argv)}` failed (rc={r.returncode}): {(r.stderr or r.stdout).strip()}")
        return r

    def _in(self, pid: int, argv: Sequence[str], check: bool = True, **ns) -> subprocess.CompletedProcess:
        return self._run([*self._nsenter(pid, **ns), "--", *argv], check=check)

    # ----------------------------------------------------------------- processes

    def _ns_ids(self, rec: dict) -> Dict[str, List[Tuple[int, int]]]:
        """Namespace ids that are known to belong to this node *now* (never stale ones)."""
        ids: Dict[str, List[Tuple[int, int]]] = {"net": [], "mnt": [], "uts": []}
        if self._holder_ok(rec):
            for k in ids:
                ids[k].append(tuple(rec["ns"][k]))
        net = file_ns_id(f"/run/netns/{rec['netns']}")
        if net and net not in ids["net"]:
            ids["net"].append(net)
        return ids

    def pids_in(self, node, include_infra: bool = True) -> Set[int]:
        """Every live pid in the node's namespaces (holder and sshd listener too unless include_infra=False)."""
        rec = self._rec(node)
        pids = pids_in_namespaces(self._ns_ids(rec))
        if not include_infra:
            pids -= self.infra_pids(node)
        return pids

    def infra_pids(self, node) -> Set[int]:
        """The testbed's own processes in the node: the holder and the sshd listener."""
        rec = self._rec(node)
        out = {rec["holder_pid"]} if self._holder_ok(rec) else set()
        sp = self.sshd_pid(node) if rec["name"] != "head" else None
        if sp:
            out.add(sp)
        return out

    def kill_procs(self, node, grace: float = 5.0, rounds: int = 3) -> Set[int]:
        """End every process in the node except the holder and sshd (TERM, then KILL after grace)."""
        killed: Set[int] = set()
        for _ in range(rounds):
            pids = self.pids_in(node, include_infra=False)
            if not pids:
                break
            killed |= terminate_pids(pids, grace=grace)
        return killed
