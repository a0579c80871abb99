"""An N-node "DGX Spark" testbed on one Linux machine (root only; stdlib and the product's procfs).

Each node is a network + mount + UTS namespace held open by one small holder
process (``sleep infinity`` started by ``unshare``) and entered with ``nsenter``:

* own hostname (``dspark-head``, ``dspark-worker1``, ...), own ``/etc/hosts``
  (``127.0.1.1 <hostname>``, like a stock Debian/Ubuntu box; peers have no names);
* an interface with the same name on every node (``fab0``), 10.213.0.1 (head),
  .2, .3 ... /24, no default route, joined through a bridge that lives in a
  namespace of its own (never in the host's root namespace);
* sysfs remounted inside the node (``/sys/class/net`` shows ``lo`` and ``fab0``),
  the host's ``/sys/fs/cgroup`` kept, a private ``/dev/shm``;
* an overlayfs over the venv (lowerdir = the venv, upper/work on a tmpfs that
  only exists inside the node), so a file changed on one node stays unchanged on
  the others and in the host's venv;
* a real ``sshd`` in every worker, listening on the worker's fabric address.

CLI:  python -m tests.support.testbed [--state-dir D] [--nodes N] [--venv V]
          {up,down,status,exec NODE -- CMD...,env}
Parts: base (constants, Node), namespaces, requirements, nodes (state, exec), sshd, fabric, overlays.
API:  Testbed(...).up() / .down() / .exec(node, argv) ...; see README.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set, Tuple

from dspark_launch.node import procfs
from tests.support.processes import alive, terminate_pids
from tests.support.testbed.base import (  # noqa: F401  (re-exported: the testbed's public names)
    _NAME,
    _SAFE_PATH,
    BRIDGE_IF,
    DEFAULT_PREFIX,
    DEFAULT_STATE_DIR,
    DEFAULT_SUBNET,
    FABRIC_IF,
    MARKER_FILE,
    SSH_PORT,
    SSHD,
    Node,
    TestbedError,
    default_venv,
    node_names,
)
from tests.support.testbed.fabric import Fabric
from tests.support.testbed.namespaces import file_ns_id, ns_id, pids_in_namespaces
from tests.support.testbed.nodes import NodeAccess
from tests.support.testbed.overlays import Overlays
from tests.support.testbed.requirements import ensure_openssh_server, requirements_met
from tests.support.testbed.sshd import Sshd

__all__ = [
    "Node",
    "Testbed",
    "TestbedError",
    "requirements_met",
    "ensure_openssh_server",
    "default_venv",
    "DEFAULT_STATE_DIR",
    "FABRIC_IF",
]


class Testbed(NodeAccess, Sshd, Fabric, Overlays):
    """N namespace "nodes" on this machine. See the module docstring and README.md."""

    __test__ = False

    def __init__(
        self,
        state_dir: str = DEFAULT_STATE_DIR,
        nodes: int = 2,
        venv: Optional[str] = None,
        prefix: str = DEFAULT_PREFIX,
        subnet: str = DEFAULT_SUBNET,
        log: Optional[Callable[[str], None]] = None,
    ):
        self.state_dir = os.path.abspath(state_dir)
        self.count = nodes
        self.venv = os.path.realpath(venv or default_venv())
        self.prefix = prefix
        self.subnet = subnet
        self._log = log or (lambda msg: None)
        self._holders: Dict[str, subprocess.Popen] = {}  # children of this process, reaped in down()
        if not _NAME.match(prefix):
            raise TestbedError(f"bad prefix {prefix!r} (lower-case letters, digits, '-', at most 11)")
        if not re.fullmatch(r"10\.\d{1,3}\.\d{1,3}", subnet):
            raise TestbedError(f"subnet must look like 10.X.Y (a private /24), got {subnet!r}")
        if not _SAFE_PATH.match(self.state_dir) or len(self.state_dir) > 60:
            raise TestbedError(f"state dir {self.state_dir!r}: use a short path without , : = or blanks")

    def reset(self) -> None:
        """Back to a fresh testbed: no processes but ours, links up, sshd running, pristine venvs."""
        for n in self.nodes:
            self.link_up(n)
            self.reset_overlay(n)
        for n in self.workers:
            self.start_sshd(n)

    # ----------------------------------------------------------------- up

    def owner_alive(self) -> Optional[bool]:
        """Whether the process that ran up() still runs (None when unknown)."""
        st = self._read_state()
        if not st or "owner" not in st:
            return None
        return alive(st["owner"]["pid"], st["owner"]["start"])

    def is_up(self) -> bool:
        st = self._read_state()
        if not st or not st.get("complete"):
            return False
        for rec in st["nodes"]:
            if not self._holder_ok(rec):
                return False
            if file_ns_id(f"/run/netns/{rec['netns']}") != tuple(rec["ns"]["net"]):
                return False
        return os.path.exists(f"/run/netns/{st['fabric_netns']}")

    def _config(self) -> dict:
        return {"nodes": self.count, "venv": self.venv, "prefix": self.prefix, "subnet": self.subnet}

    def up(self) -> "Testbed":
        """Build the testbed. No-op when it is already up with the same settings;
        refuses (TestbedError) when it is up with other settings; cleans a partial one first."""
        ok, why = requirements_met(self.venv)
        if not ok and SSHD in why:
            ensure_openssh_server(self._log)
            ok, why = requirements_met(self.venv)
        if not ok:
            raise TestbedError(why)
        with self._locked():
            st = self._read_state()
            if self.is_up():
                if st["config"] == self._config():
                    self._log(f"testbed at {self.state_dir} is already up")
                    return self
                raise TestbedError(
                    f"a testbed with other settings is up at {self.state_dir} ({st['config']}); run `down` first"
                )
            if st or self._leftover_netns():
                self._log("cleaning a partial testbed first")
                self._down_locked()
            try:
                self._up_locked()
            except BaseException:
                self._log("up failed: tearing down")
                with contextlib.suppress(Exception):
                    self._down_locked(keep_state=True)
                raise
        return self

    def _up_locked(self) -> None:
        t0 = time.monotonic()
        names = node_names(self.count)
        if os.path.isdir(self.state_dir) and os.listdir(self.state_dir) and not os.path.exists(self._p(MARKER_FILE)):
            raise TestbedError(f"{self.state_dir} exists and is not a testbed state dir; refusing to use it")
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        Path(self._p(MARKER_FILE)).write_text("dspark testbed state; removed by `testbed.py down`\n")
        for sub in ("ssh", "nodes"):
            os.makedirs(self._p(sub), mode=0o700, exist_ok=True)
        state = {
            "version": 1,
            "config": self._config(),
            "complete": False,
            "fabric_netns": self.fabric_netns,
            "bridge": BRIDGE_IF,
            "owner": {"pid": os.getpid(), "start": procfs.start_time(os.getpid())},
            "nodes": [],
        }
        # 1. holders first (before any of our netns is registered, so no node's
        #    mount namespace copies, and pins, another node's /run/netns entry).
        for i, name in enumerate(names):
            p = subprocess.Popen(
                ["unshare", "--net", "--mount", "--uts", "--propagation", "private", "--", "sleep", "infinity"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True, cwd="/",
            )  # fmt: skip
            self._holders[name] = p
            rec = {
                "name": name,
                "hostname": f"dspark-{name}",
                "ip": f"{self.subnet}.{i + 1}",
                "netns": f"{self.prefix}-{name}",
                "holder_pid": p.pid,
                "holder_start": None,
                "ns": {},
                "sshd_pidfile": self._p("nodes", name, "sshd.pid") if i else None,
            }
            state["nodes"].append(rec)
        self._write_state(state)
        me = {k: ns_id("self", k) for k in ("net", "mnt", "uts")}
        deadline = time.monotonic() + 10
        for rec in state["nodes"]:
            pid = rec["holder_pid"]
            while True:
                ns = {k: ns_id(pid, k) for k in me}
                if all(ns[k] and ns[k] != me[k] for k in me) and procfs.cmdline(pid)[:1] == ["sleep"]:
                    break
                if self._holders[rec["name"]].poll() is not None or time.monotonic() > deadline:
                    raise TestbedError(f"holder for {rec['name']} did not start (unshare failed?)")
                time.sleep(0.01)
            rec["holder_start"] = procfs.start_time(pid)
            rec["ns"] = {k: list(v) for k, v in ns.items()}
        self._write_state(state)
        # drop copies of other network namespaces' /run/netns mounts from the
        # nodes' mount namespaces: a copy keeps that netns (and its links) alive.
        for rec in state["nodes"]:
            self._drop_nsfs_mounts(rec["holder_pid"])
        # 2. register the namespaces, build the fabric
        self._build_fabric(state)
        # 3. per-node identity and filesystem view
        for rec in state["nodes"]:
            self._setup_node(rec)
        # 4. ssh: one client key for root, a host key + sshd per worker
        self._keygen(self.ssh_key, "dspark-testbed-root")
        known = []
        for rec in state["nodes"][1:]:
            d = self._p("nodes", rec["name"])
            hostkey = os.path.join(d, "ssh_host_ed25519_key")
            self._keygen(hostkey, f"root@{rec['hostname']}")
            keytype, keydata = Path(hostkey + ".pub").read_text().split()[:2]
            known.append(f"{rec['ip']} {keytype} {keydata}")
            Path(d, "sshd_config").write_text(self._sshd_config(rec, hostkey))
        Path(self.known_hosts).write_text("".join(line + "\n" for line in known))
        state["complete"] = True  # complete enough for node lookups in start_sshd
        self._write_state(state)
        for rec in state["nodes"][1:]:
            self.start_sshd(rec["name"])
        state["up_seconds"] = round(time.monotonic() - t0, 2)
        self._write_state(state)
        self._log(
            f"testbed up in {state['up_seconds']} s: " + ", ".join(f"{r['name']}={r['ip']}" for r in state["nodes"])
        )

    # ----------------------------------------------------------------- down

    def _leftover_netns(self) -> List[str]:
        try:
            entries = os.listdir("/run/netns")
        except OSError:
            return []
        pat = re.compile(rf"^{re.escape(self.prefix)}-(head|worker\d+|fabric)$")
        return sorted(e for e in entries if pat.match(e))

    def down(self, keep_state: bool = False, grace: float = 3.0) -> None:
        """Kill everything in the nodes, delete the namespaces, remove the state dir.

        Works after a partial up and after the holders died. Idempotent."""
        with self._locked():
            self._down_locked(keep_state=keep_state, grace=grace)
        with contextlib.suppress(OSError):
            if not keep_state:
                os.unlink(self._lock_path())

    def _down_locked(self, keep_state: bool = False, grace: float = 3.0) -> None:
        t0 = time.monotonic()
        st = self._read_state() or {}
        recs = st.get("nodes", [])
        netns_names = set(self._leftover_netns())
        ids: Dict[str, List[Tuple[int, int]]] = {"net": [], "mnt": [], "uts": []}
        for rec in recs:
            if rec.get("ns"):
                netns_names.add(rec["netns"])
                for k, v in self._ns_ids(rec).items():
                    ids[k].extend(v)
            elif rec.get("holder_pid"):  # holder spawned, namespaces not recorded yet
                p = self._holders.get(rec["name"])
                if p is not None and p.poll() is None:
                    p.kill()
        for name in netns_names:
            nid = file_ns_id(f"/run/netns/{name}")
            if nid:
                ids["net"].append(nid)
        killed: Set[int] = set()
        for _ in range(4):
            pids = pids_in_namespaces(ids)
            if not pids:
                break
            killed |= terminate_pids(pids, grace=grace)
        for p in self._holders.values():  # reap our own children
            with contextlib.suppress(Exception):
                p.wait(timeout=2)
        self._holders.clear()
        for name in sorted(netns_names):
            self._run(["ip", "netns", "delete", name], check=False)
        if not keep_state and os.path.isdir(self.state_dir):
            if os.path.exists(self._p(MARKER_FILE)) or not os.listdir(self.state_dir):
                shutil.rmtree(self.state_dir, ignore_errors=True)
            else:
                self._log(f"not removing {self.state_dir}: no {MARKER_FILE} marker in it")
        self._log(f"testbed down in {time.monotonic() - t0:.2f} s ({len(killed)} processes ended, "
                  f"{len(netns_names)} namespaces deleted)")  # fmt: skip

    # ----------------------------------------------------------------- status / env

    def status(self) -> dict:
        st = self._read_state()
        if not st:
            return {"up": False, "state_dir": self.state_dir, "leftover_netns": self._leftover_netns(), "nodes": []}
        nodes = []
        for rec in st["nodes"]:
            ok = self._holder_ok(rec)
            sshd = self.sshd_pid(rec["name"]) if ok and rec["name"] != "head" and st.get("complete") else None
            nodes.append({
                "name": rec["name"],
                "hostname": rec["hostname"],
                "ip": rec["ip"],
                "ifname": FABRIC_IF,
                "netns": rec["netns"],
                "is_head": rec["name"] == "head",
                "holder_pid": rec["holder_pid"],
                "holder_alive": ok,
                "sshd_pid": sshd,
                "pids": len(pids_in_namespaces(self._ns_ids(rec))),
            })  # fmt: skip
        return {
            "up": self.is_up(),
            "state_dir": self.state_dir,
            "config": st.get("config"),
            "fabric_netns": st.get("fabric_netns"),
            "subnet": f"{st['config']['subnet']}.0/24",
            "ssh_key": self.ssh_key,
            "known_hosts": self.known_hosts,
            "ssh_options": self.ssh_options(),
            "up_seconds": st.get("up_seconds"),
            "nodes": nodes,
        }

    def env(self) -> Dict[str, str]:
        """Shell-friendly facts for scripts (the demo): DSPARK_TESTBED_* variables."""
        st = self._state()
        out = {
            "DSPARK_TESTBED_STATE_DIR": self.state_dir,
            "DSPARK_TESTBED_VENV": st["config"]["venv"],
            "DSPARK_TESTBED_NODES": " ".join(r["name"] for r in st["nodes"]),
            "DSPARK_TESTBED_FABRIC_IF": FABRIC_IF,
            "DSPARK_TESTBED_SSH_KEY": self.ssh_key,
            "DSPARK_TESTBED_SSH_PORT": str(SSH_PORT),
            "DSPARK_TESTBED_KNOWN_HOSTS": self.known_hosts,
            "DSPARK_TESTBED_SSH_OPTS": shlex.join(self.ssh_options()),
        }
        for rec in st["nodes"]:
            key = rec["name"].upper()
            out[f"DSPARK_TESTBED_{key}_IP"] = rec["ip"]
            out[f"DSPARK_TESTBED_{key}_HOSTNAME"] = rec["hostname"]
            out[f"DSPARK_TESTBED_{key}_NETNS"] = rec["netns"]
            out[f"DSPARK_TESTBED_{key}_PID"] = str(rec["holder_pid"])
        return out
