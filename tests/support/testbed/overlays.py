"""Each node's filesystem view: hostname, /etc/hosts, its own sysfs and /dev/shm, an overlay over the venv."""

from __future__ import annotations

import os
import pwd
import sys
import time
from pathlib import Path


class Overlays:
    """The nodes' mounts (a mixin of Testbed: uses its state paths and _in)."""

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

    def _mount_node_bashrc(self, pid: int, node_dir: str) -> None:
        """The node's own ~/.bashrc for this user: bash reads it for every `ssh NODE COMMAND`, and this machine's
        (pyenv's init: ~0.15 CPU-s and half a second a command on a loaded host, a dozen processes) is not a node's.
        A DGX Spark's Ubuntu ~/.bashrc returns at once in a non-interactive shell; so does the node's."""
        home_rc = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".bashrc"
        if not home_rc.is_file():
            return
        rc = os.path.join(node_dir, "bashrc")
        Path(rc).write_text("# the testbed node's ~/.bashrc: nothing for a non-interactive shell (as Ubuntu's)\n"
                            "case $- in *i*) ;; *) return;; esac\n")  # fmt: skip
        self._in(pid, ["mount", "--bind", rc, str(home_rc)], net=False, uts=False)

    def _setup_node(self, rec: dict) -> None:
        pid, name = rec["holder_pid"], rec["name"]
        d = self._p("nodes", name)
        os.makedirs(d, mode=0o700, exist_ok=True)
        self._in(pid, [sys.executable, "-c", "import socket,sys; socket.sethostname(sys.argv[1])", rec["hostname"]],
                 net=False, mnt=False)  # fmt: skip
        hosts = os.path.join(d, "hosts")
        Path(hosts).write_text(
            f"127.0.0.1\tlocalhost\n127.0.1.1\t{rec['hostname']}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        self._in(pid, ["mount", "--bind", hosts, "/etc/hosts"], net=False, uts=False)
        self._mount_node_bashrc(pid, d)
        # sysfs of the node's own netns, keeping the host's cgroup tree (Ray reads limits there)
        stage = os.path.join(d, "cgroup-stage")
        os.makedirs(stage, exist_ok=True)
        have_cgroup = os.path.ismount("/sys/fs/cgroup")
        if have_cgroup:
            have_cgroup = (
                self._in(pid, ["mount", "--rbind", "/sys/fs/cgroup", stage], check=False, uts=False).returncode == 0
            )
        self._in(pid, ["mount", "-t", "sysfs", "-o", "rw,nosuid,nodev,noexec", f"sysfs-{name}", "/sys"], uts=False)
        if have_cgroup:
            r = self._in(pid, ["mount", "--move", stage, "/sys/fs/cgroup"], check=False, uts=False)
            if r.returncode != 0:
                self._in(pid, ["umount", "-l", stage], check=False, uts=False)
        self._in(
            pid,
            ["mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", f"shm-{name}", "/dev/shm"],
            net=False,
            uts=False,
        )
        self._mount_overlay(rec)
