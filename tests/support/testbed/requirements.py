"""Can this machine host a testbed (root, namespaces, overlayfs, sshd), and installing sshd when not."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from typing import Callable, List, Optional, Tuple

from tests.support.testbed.base import _SAFE_PATH, SSHD, TOOLS, TestbedError


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
        hint = (
            " (openssh-server: call ensure_openssh_server() or `python -m tests.support.testbed up`)"
            if SSHD in missing
            else ""
        )
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
        return (
            False,
            "root's password is locked ('!' in /etc/shadow); sshd (UsePAM no) refuses it: run `usermod -p '*' root`",
        )
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
