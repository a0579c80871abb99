"""A real sshd in every worker: its config and keys, start/stop, ssh argv from the head."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import List, Optional

from dspark_launch.node import procfs
from tests.support.processes import alive, terminate_pids
from tests.support.testbed.base import SSH_PORT, SSHD, TestbedError
from tests.support.testbed.namespaces import ns_id


class Sshd:
    """The workers' sshd (a mixin of Testbed: uses its state, exec and _in)."""

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
        if not alive(pid) or ns_id(pid, "net") != tuple(rec["ns"]["net"]):
            return None
        if not any(os.path.basename(a).startswith("sshd") for a in procfs.cmdline(pid)[:1]):
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
