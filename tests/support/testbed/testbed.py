#!/usr/bin/env python3
"""An N-node "DGX Spark" testbed on one Linux machine (root only, stdlib only).

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

CLI:  python3 tests/testbed/testbed.py [--state-dir D] [--nodes N] [--venv V]
          {up,down,status,exec NODE -- CMD...,env}
API:  Testbed(...).up() / .down() / .exec(node, argv) ...; see README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

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

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = "/tmp/dspark-testbed"
DEFAULT_PREFIX = "dspark"
DEFAULT_SUBNET = "10.213.0"
FABRIC_IF = "fab0"
BRIDGE_IF = "br0"
SSH_PORT = 22
STATE_FILE = "testbed.json"
MARKER_FILE = ".dspark-testbed"
SSHD = "/usr/sbin/sshd"
TOOLS = ("unshare", "nsenter", "ip", "mount", "umount", "sleep", "ssh", "ssh-keygen")
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")  # no , : = or blanks (overlay options)
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,10}$")


class TestbedError(RuntimeError):
    """The testbed could not be built, entered or torn down."""

    __test__ = False  # not a pytest test class


def default_venv() -> str:
    """The venv to overlay: $DSPARK_TESTBED_VENV, the running venv, else <repo>/.venv."""
    env = os.environ.get("DSPARK_TESTBED_VENV")
    if env:
        return env
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return sys.prefix
    return str(REPO_ROOT / ".venv")


def node_names(count: int) -> List[str]:
    if not 1 <= count <= 200:
        raise TestbedError(f"--nodes must be between 1 and 200, got {count}")
    return ["head"] + [f"worker{i}" for i in range(1, count)]


@dataclasses.dataclass(frozen=True)
class Node:
    name: str  # "head", "worker1", ...
    ip: str  # fabric address, 10.213.0.N
    hostname: str  # "dspark-head", ...
    netns: str  # name under /run/netns (ip netns exec NETNS ...)
    holder_pid: int  # the process holding the namespaces (nsenter -t)
    is_head: bool

    @property
    def ifname(self) -> str:
        return FABRIC_IF


# --------------------------------------------------------------------------- /proc helpers


def _proc_stat(pid: int) -> Optional[Tuple[str, int]]:
    """(state letter, start time in clock ticks) or None when the pid does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[19])
    except (IndexError, ValueError):
        return None


def _alive(pid: int, start: Optional[int] = None) -> bool:
    """True if pid runs (not a zombie) and, when given, started at `start`."""
    st = _proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return start is None or st[1] == start


def _ns_id(pid, kind: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _file_ns_id(path: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _all_pids() -> List[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _pids_in_namespaces(ns_ids: Mapping[str, Iterable[Tuple[int, int]]]) -> Set[int]:
    """Pids whose namespace of any given kind ("net", "mnt", "uts") is one of the ids."""
    wanted = {k: set(v) for k, v in ns_ids.items() if v}
    found = set()
    me = os.getpid()
    for pid in _all_pids():
        if pid == me:
            continue
        for kind, ids in wanted.items():
            if _ns_id(pid, kind) in ids:
                found.add(pid)
                break
    return {p for p in found if _alive(p)}


def _cmdline(pid: int) -> List[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def terminate_pids(pids: Iterable[int], grace: float = 5.0, kill_wait: float = 5.0) -> Set[int]:
    """SIGTERM, wait up to `grace` s, SIGKILL what is left, wait up to `kill_wait` s.

    Start times are taken first so a reused pid is never signalled twice.
    Returns the pids that were signalled.
    """
    starts = {}
    for pid in pids:
        st = _proc_stat(pid)
        if st and st[0] not in ("Z", "X"):
            starts[pid] = st[1]
    for pid in starts:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)

    def left() -> List[int]:
        return [p for p, s in starts.items() if _alive(p, s)]

    deadline = time.monotonic() + grace
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + kill_wait
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    return set(starts)


# --------------------------------------------------------------------------- requirements


def _missing_tools() -> List[str]:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    return missing


def _root_locked() -> bool:
    """sshd with UsePAM no refuses accounts whose shadow password starts with '!'."""
    try:
        with open("/etc/shadow") as fh:
            for line in fh:
                if line.startswith("root:"):
                    return line.split(":")[1].startswith("!")
    except OSError:
        pass
    return False


def requirements_met(venv: Optional[str] = None, probe: bool = True) -> Tuple[bool, str]:
    """(True, "ok") when a testbed can be built here, else (False, why)."""
    if not sys.platform.startswith("linux"):
        return False, "the testbed needs Linux namespaces"
    if os.geteuid() != 0:
        return False, "the testbed needs root (namespaces, mounts, sshd)"
    missing = _missing_tools()
    if missing:
        hint = " (openssh-server: call ensure_openssh_server() or `testbed.py up`)" if SSHD in missing else ""
        return False, "missing tools: " + ", ".join(missing) + hint
    try:
        with open("/proc/filesystems") as fh:
            fss = fh.read()
    except OSError:
        fss = ""
    if "\toverlay\n" not in fss:
        subprocess.run(["modprobe", "overlay"], capture_output=True)
        with open("/proc/filesystems") as fh:
            if "\toverlay\n" not in fh.read():
                return False, "no overlayfs in this kernel (/proc/filesystems)"
    if _root_locked():
        return False, "root's password is locked ('!' in /etc/shadow); sshd (UsePAM no) refuses it: run `usermod -p '*' root`"
    if venv is not None:
        if not os.path.isfile(os.path.join(venv, "bin", "python")):
            return False, f"no venv at {venv} (bin/python missing)"
        if not _SAFE_PATH.match(os.path.realpath(venv)):
            return False, f"venv path {venv!r} has characters overlayfs options cannot carry"
    if probe:
        r = subprocess.run(["unshare", "--net", "--mount", "--uts", "true"], capture_output=True, text=True)
        if r.returncode != 0:
            return False, "cannot create namespaces here: " + (r.stderr.strip() or f"rc={r.returncode}")
        r = subprocess.run(["ip", "netns", "help"], capture_output=True, text=True)
        if "attach" not in (r.stdout + r.stderr):
            return False, "iproute2 too old: `ip netns attach` missing"
    return True, "ok"


def ensure_openssh_server(log: Optional[Callable[[str], None]] = None) -> None:
    """Install openssh-server/-client (and iproute2) with apt when missing.

    A temporary /usr/sbin/policy-rc.d (exit 101) keeps the package from starting
    a host sshd. No-op when everything is already there.
    """
    need = []
    if not os.access(SSHD, os.X_OK):
        need.append("openssh-server")
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        need.append("openssh-client")
    if shutil.which("ip") is None:
        need.append("iproute2")
    if not need:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise TestbedError(f"{', '.join(need)} missing and cannot be installed (needs root and apt-get)")
    if log:
        log(f"installing {' '.join(need)} with apt-get")
    policy = "/usr/sbin/policy-rc.d"
    created = False
    if not os.path.exists(policy):
        with open(policy, "w") as fh:
            fh.write("#!/bin/sh\n# dspark testbed: no services started by package installs\nexit 101\n")
        os.chmod(policy, 0o755)
        created = True
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *need]):
            r = subprocess.run(argv, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise TestbedError(f"{' '.join(argv)} failed (rc={r.returncode}): {r.stderr.strip()[-800:]}")
    finally:
        if created:
            with contextlib.suppress(OSError):
                os.unlink(policy)
    if _missing_tools():
        raise TestbedError("still missing after apt-get: " + ", ".join(_missing_tools()))


# --------------------------------------------------------------------------- the testbed


class Testbed:
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
        if not pid or not ns or rec.get("holder_start") is None or not _alive(pid, rec["holder_start"]):
            return False
        return all(_ns_id(pid, k) == tuple(ns[k]) for k in ("net", "mnt", "uts"))

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

    def popen(self, node, argv: Sequence[str], env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, **kw) -> subprocess.Popen:
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

    # ----------------------------------------------------------------- ssh

    def ssh_options(self) -> List[str]:
        """The -o options a launcher passes to ssh to reach the workers."""
        return [
            "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=5",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "StrictHostKeyChecking=accept-new",
            "-o", "IdentitiesOnly=yes",
        ]  # fmt: skip

    def ssh_argv(self, node, *command: str, user: str = "root") -> List[str]:
        """ssh argv (run it from inside another node, e.g. exec(head, ...)) for `command` on node."""
        n = self.node(node)
        return ["ssh", "-i", self.ssh_key, "-p", str(SSH_PORT), *self.ssh_options(), f"{user}@{n.ip}", *command]

    def sshd_pid(self, node) -> Optional[int]:
        """The pid of the node's sshd listener, or None when it is not running."""
        rec = self._rec(node)
        pidfile = rec.get("sshd_pidfile")
        if not pidfile:
            return None
        try:
            pid = int(Path(pidfile).read_text().strip())
        except (OSError, ValueError):
            return None
        if not _alive(pid) or _ns_id(pid, "net") != tuple(rec["ns"]["net"]):
            return None
        if not any(os.path.basename(a).startswith("sshd") for a in _cmdline(pid)[:1]):
            return None
        return pid

    def start_sshd(self, node, wait: float = 10.0) -> int:
        """Start the node's sshd (no-op when running); waits until ssh from the head works."""
        rec = self._rec(node)
        if rec["name"] == "head":
            raise TestbedError("the head runs no sshd")
        pid = self.sshd_pid(node)
        if pid:
            return pid
        d = self._p("nodes", rec["name"])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(rec["sshd_pidfile"])
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        conf = os.path.join(d, "sshd_config")
        self._in(rec["holder_pid"], [SSHD, "-t", "-f", conf])
        self._in(rec["holder_pid"], [SSHD, "-f", conf, "-E", os.path.join(d, "sshd.log")])
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pid = self.sshd_pid(node)
            if pid:
                break
            time.sleep(0.05)
        else:
            raise TestbedError(f"node {rec['name']}: sshd did not write {rec['sshd_pidfile']} (see {d}/sshd.log)")
        self.wait_ssh(node, timeout=max(1.0, deadline - time.monotonic()))
        return pid

    def kill_sshd(self, node, grace: float = 3.0) -> Optional[int]:
        """Stop the node's sshd listener (open sessions keep running, like a real host)."""
        pid = self.sshd_pid(node)
        if pid:
            terminate_pids([pid], grace=grace)
        return pid

    def wait_ssh(self, node, timeout: float = 10.0) -> None:
        """Wait until `ssh root@node hostname` from the head prints the node's hostname."""
        n = self.node(node)
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            r = self.exec(self.head, self.ssh_argv(n, "hostname"), timeout=15, cwd="/")
            if r.returncode == 0 and r.stdout.strip() == n.hostname:
                return
            last = (r.stderr or r.stdout).strip()
            if time.monotonic() >= deadline:
                raise TestbedError(f"ssh from head to {n.name} ({n.ip}) does not work: {last}")
            time.sleep(0.2)

    # ----------------------------------------------------------------- processes

    def _ns_ids(self, rec: dict) -> Dict[str, List[Tuple[int, int]]]:
        """Namespace ids that are known to belong to this node *now* (never stale ones)."""
        ids: Dict[str, List[Tuple[int, int]]] = {"net": [], "mnt": [], "uts": []}
        if self._holder_ok(rec):
            for k in ids:
                ids[k].append(tuple(rec["ns"][k]))
        net = _file_ns_id(f"/run/netns/{rec['netns']}")
        if net and net not in ids["net"]:
            ids["net"].append(net)
        return ids

    def pids_in(self, node, include_infra: bool = True) -> Set[int]:
        """Every live pid in the node's namespaces (holder and sshd listener too unless include_infra=False)."""
        rec = self._rec(node)
        pids = _pids_in_namespaces(self._ns_ids(rec))
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

    # ----------------------------------------------------------------- network

    def _port(self, name: str) -> str:
        return f"p-{name}"[:15]

    def link_down(self, node) -> None:
        """Unplug the node's cable: its bridge port goes down (fab0 loses carrier)."""
        self._run(["ip", "-n", self.fabric_netns, "link", "set", self._port(self.node(node).name), "down"])

    def link_up(self, node) -> None:
        self._run(["ip", "-n", self.fabric_netns, "link", "set", self._port(self.node(node).name), "up"])

    # ----------------------------------------------------------------- overlay

    def _mount_overlay(self, rec: dict) -> None:
        pid = rec["holder_pid"]
        base = self._p("nodes", rec["name"], "overlay")
        os.makedirs(base, exist_ok=True)
        # upper/work on a tmpfs mounted inside the node only: works whatever the
        # state dir's filesystem is (overlay cannot be an upperdir) and vanishes
        # with the node.
        self._in(pid, ["mount", "-t", "tmpfs", "-o", "mode=0700", f"{rec['name']}-venv", base], net=False, uts=False)
        self._in(pid, ["mkdir", "-p", f"{base}/upper", f"{base}/work"], net=False, uts=False)
        opts = f"lowerdir={self.venv},upperdir={base}/upper,workdir={base}/work"
        self._in(pid, ["mount", "-t", "overlay", "-o", opts, f"{rec['name']}-venv", self.venv], net=False, uts=False)

    def _umount(self, pid: int, target: str) -> None:
        """Unmount inside a node; a process still exiting can keep it busy for a moment."""
        for _ in range(10):
            if self._in(pid, ["umount", target], check=False, net=False, uts=False).returncode == 0:
                return
            time.sleep(0.5)
        self._in(pid, ["umount", "--lazy", target], net=False, uts=False)

    def reset_overlay(self, node) -> None:
        """Throw away every change made to the venv on this node (kills its non-infra processes)."""
        rec = self._rec(node)
        self.kill_procs(node)
        base = self._p("nodes", rec["name"], "overlay")
        for target in (self.venv, base):
            self._umount(rec["holder_pid"], target)
        self._mount_overlay(rec)

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
        return _alive(st["owner"]["pid"], st["owner"]["start"])

    def is_up(self) -> bool:
        st = self._read_state()
        if not st or not st.get("complete"):
            return False
        for rec in st["nodes"]:
            if not self._holder_ok(rec):
                return False
            if _file_ns_id(f"/run/netns/{rec['netns']}") != tuple(rec["ns"]["net"]):
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
            "owner": {"pid": os.getpid(), "start": _proc_stat(os.getpid())[1]},
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
        me = {k: _ns_id("self", k) for k in ("net", "mnt", "uts")}
        deadline = time.monotonic() + 10
        for rec in state["nodes"]:
            pid = rec["holder_pid"]
            while True:
                ns = {k: _ns_id(pid, k) for k in me}
                if all(ns[k] and ns[k] != me[k] for k in me) and _cmdline(pid)[:1] == ["sleep"]:
                    break
                if self._holders[rec["name"]].poll() is not None or time.monotonic() > deadline:
                    raise TestbedError(f"holder for {rec['name']} did not start (unshare failed?)")
                time.sleep(0.01)
            rec["holder_start"] = _proc_stat(pid)[1]
            rec["ns"] = {k: list(v) for k, v in ns.items()}
        self._write_state(state)
        # drop copies of other network namespaces' /run/netns mounts from the
        # nodes' mount namespaces: a copy keeps that netns (and its links) alive.
        for rec in state["nodes"]:
            self._drop_nsfs_mounts(rec["holder_pid"])
        # 2. register the namespaces, build the fabric
        fab = self.fabric_netns
        self._run(["ip", "netns", "add", fab])
        for rec in state["nodes"]:
            self._run(["ip", "netns", "attach", rec["netns"], str(rec["holder_pid"])])
        self._run(["ip", "-n", fab, "link", "set", "lo", "up"])
        self._run(["ip", "-n", fab, "link", "add", BRIDGE_IF, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        self._run(["ip", "-n", fab, "link", "set", BRIDGE_IF, "up"])
        for rec in state["nodes"]:
            port, ns = self._port(rec["name"]), rec["netns"]
            self._run(["ip", "-n", fab, "link", "add", port, "type", "veth", "peer", "name", FABRIC_IF, "netns", ns])
            self._run(["ip", "-n", fab, "link", "set", port, "master", BRIDGE_IF, "up"])
            self._run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._run(["ip", "-n", ns, "addr", "add", f"{rec['ip']}/24", "dev", FABRIC_IF])
            self._run(["ip", "-n", ns, "link", "set", FABRIC_IF, "up"])
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
        self._log(f"testbed up in {state['up_seconds']} s: " + ", ".join(f"{r['name']}={r['ip']}" for r in state["nodes"]))

    def _drop_nsfs_mounts(self, pid: int) -> None:
        try:
            with open(f"/proc/{pid}/mountinfo") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return
        points = []
        for line in lines:
            left, _, right = line.partition(" - ")
            if right.split(" ")[:1] == ["nsfs"]:
                points.append(left.split(" ")[4])
        for mp in sorted(points, key=len, reverse=True):
            self._in(pid, ["umount", "-l", mp.encode().decode("unicode_escape")], check=False, net=False, uts=False)

    def _setup_node(self, rec: dict) -> None:
        pid, name = rec["holder_pid"], rec["name"]
        d = self._p("nodes", name)
        os.makedirs(d, mode=0o700, exist_ok=True)
        self._in(pid, [sys.executable, "-c", "import socket,sys; socket.sethostname(sys.argv[1])", rec["hostname"]],
                 net=False, mnt=False)  # fmt: skip
        hosts = os.path.join(d, "hosts")
        Path(hosts).write_text(
            "127.0.0.1\tlocalhost\n"
            f"127.0.1.1\t{rec['hostname']}\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        self._in(pid, ["mount", "--bind", hosts, "/etc/hosts"], net=False, uts=False)
        # sysfs of the node's own netns, keeping the host's cgroup tree (Ray reads limits there)
        stage = os.path.join(d, "cgroup-stage")
        os.makedirs(stage, exist_ok=True)
        have_cgroup = os.path.ismount("/sys/fs/cgroup")
        if have_cgroup:
            have_cgroup = self._in(pid, ["mount", "--rbind", "/sys/fs/cgroup", stage], check=False, uts=False).returncode == 0
        self._in(pid, ["mount", "-t", "sysfs", "-o", "rw,nosuid,nodev,noexec", f"sysfs-{name}", "/sys"], uts=False)
        if have_cgroup:
            r = self._in(pid, ["mount", "--move", stage, "/sys/fs/cgroup"], check=False, uts=False)
            if r.returncode != 0:
                self._in(pid, ["umount", "-l", stage], check=False, uts=False)
        self._in(pid, ["mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", f"shm-{name}", "/dev/shm"], net=False, uts=False)
        self._mount_overlay(rec)

    def _keygen(self, path: str, comment: str) -> None:
        for p in (path, path + ".pub"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        self._run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])

    def _sshd_config(self, rec: dict, hostkey: str) -> str:
        return "\n".join([
            "# dspark testbed sshd for " + rec["hostname"],
            f"Port {SSH_PORT}",
            f"ListenAddress {rec['ip']}",
            f"HostKey {hostkey}",
            f"PidFile {rec['sshd_pidfile']}",
            f"AuthorizedKeysFile {self.ssh_key}.pub",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "X11Forwarding no",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "Subsystem sftp internal-sftp",
            "",
        ])  # fmt: skip

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
            nid = _file_ns_id(f"/run/netns/{name}")
            if nid:
                ids["net"].append(nid)
        killed: Set[int] = set()
        for _ in range(4):
            pids = _pids_in_namespaces(ids)
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
                "pids": len(_pids_in_namespaces(self._ns_ids(rec))),
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


# --------------------------------------------------------------------------- CLI


def _stderr(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", default=argparse.SUPPRESS, help=f"state folder (default {DEFAULT_STATE_DIR})")
    common.add_argument("--nodes", type=int, default=argparse.SUPPRESS, help="node count for up (default 2)")
    common.add_argument("--venv", default=argparse.SUPPRESS, help="venv overlaid on every node")
    common.add_argument("--prefix", default=argparse.SUPPRESS, help=f"netns name prefix (default {DEFAULT_PREFIX})")
    ap = argparse.ArgumentParser(prog="testbed.py", description=__doc__.split("\n\n")[0], parents=[common])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", parents=[common], help="build the nodes (idempotent)")
    p = sub.add_parser("down", parents=[common], help="kill everything in the nodes and remove them")
    p.add_argument("--keep-state", action="store_true", help="keep the state folder (logs)")
    sub.add_parser("status", parents=[common], help="JSON status")
    p = sub.add_parser("env", parents=[common], help="print DSPARK_TESTBED_* variables (sh syntax)")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("exec", parents=[common], help="run a command inside a node: exec NODE -- CMD...")
    p.add_argument("node")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    state_dir = getattr(args, "state_dir", None) or os.environ.get("DSPARK_TESTBED_STATE_DIR", DEFAULT_STATE_DIR)
    tb = Testbed(
        state_dir=state_dir,
        nodes=getattr(args, "nodes", 2),
        venv=getattr(args, "venv", None),
        prefix=getattr(args, "prefix", DEFAULT_PREFIX),
        log=_stderr,
    )
    try:
        if args.cmd == "up":
            tb.up()
            print(json.dumps(tb.status(), indent=2))
        elif args.cmd == "down":
            tb.down(keep_state=args.keep_state)
        elif args.cmd == "status":
            print(json.dumps(tb.status(), indent=2))
            return 0 if tb.is_up() else 1
        elif args.cmd == "env":
            env = tb.env()
            if args.json:
                print(json.dumps(env, indent=2))
            else:
                for k, v in env.items():
                    print(f"export {k}={shlex.quote(v)}")
        elif args.cmd == "exec":
            cmd = list(args.command)
            if cmd[:1] == ["--"]:
                cmd = cmd[1:]
            if not cmd:
                ap.error("exec NODE -- CMD...: no command given")
            full = tb._node_argv(args.node, cmd, None)
            os.execvp(full[0], full)
    except TestbedError as exc:
        _stderr(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
