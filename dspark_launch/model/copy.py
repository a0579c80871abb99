"""Copy model files to a worker with rsync over SSH (the launcher's SSH settings), in parallel streams.

rsync sends only files whose size or mtime differ (`force`: the named files whatever
their metadata, for repairs after a checksum failure); whole files, no delta pass (the
fabric is faster than rsync's delta search). One stream is bound by one core's SSH
cipher, hence several streams over balanced shares of the files.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import CopyFailed


@dataclass(frozen=True)
class SSHTarget:
    host: str
    port: int = 22
    user: str = ""
    key: str = ""
    host_key_check: str = "yes"  # StrictHostKeyChecking
    connect_timeout: int = 10
    extra_options: tuple[str, ...] = ()  # e.g. ("-o", "UserKnownHostsFile=/path")

    @classmethod
    def from_transport(cls, transport) -> "SSHTarget":
        """The same settings the launcher's SSHTransport (dspark_launch.cluster.transport) uses."""
        return cls(transport.host, transport.port, transport.user, transport.key, transport.host_key_check,
                   transport.connect_timeout, tuple(transport.extra_options))

    def ssh_argv(self) -> list[str]:
        """ssh and its options, without the host (rsync adds it): exactly what the launcher's agent
        calls use, taken from SSHTransport so the two never drift apart."""
        from dspark_launch.cluster.transport import SSHTransport

        argv = SSHTransport(self.host, "", self.port, self.user, self.key, self.host_key_check,
                            self.connect_timeout, self.extra_options).argv()
        return argv[:argv.index("--")]


@dataclass(frozen=True)
class CopyResult:
    host: str
    files_sent: tuple[str, ...]  # paths relative to the copied root that rsync transferred
    bytes_sent: int
    seconds: float
    streams: int


def effective_streams(requested: int) -> int:
    """Streams actually used: each takes about two cores on the head (rsync and ssh), so more streams
    than cores slow the copy down (measured: bench/model_copy.py)."""
    return max(1, min(requested, os.cpu_count() or 1))


def _shares(root: Path, paths: list[str], streams: int) -> list[list[str]]:
    """Split paths into at most `streams` lists of about equal bytes (largest first, to the lightest)."""
    sized = sorted(((os.lstat(root / p).st_size, p) for p in paths), reverse=True)
    bins: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, min(streams, len(sized))))]
    for size, path in sized:
        bins.sort(key=lambda b: b[0])
        bins[0] = (bins[0][0] + size, bins[0][1] + [path])
    return [b[1] for b in bins if b[1]]


RSYNC_OPTIONS = ("-a", "--no-owner", "--no-group", "--chmod=go-w", "--whole-file")


def rsync_argv(target: SSHTarget, root: str, list_file: str, force: bool) -> list[str]:
    ssh = target.ssh_argv()
    if any("'" in a or '"' in a or "\n" in a for a in ssh):
        raise CopyFailed(f"{target.host}: SSH options with quotes cannot be passed to rsync -e")
    # The copy belongs to whoever receives it (the serving user there), never to the head's owner's
    # namesake (-a's -o/-g as root), and nobody else can write it: the start check refuses otherwise.
    argv = ["rsync", *RSYNC_OPTIONS, "--protect-args", "--mkpath", f"--files-from={list_file}",
            "--out-format=%n", "-e", shlex.join(ssh)]
    if force:
        argv.append("--ignore-times")
    return argv + ["--", root.rstrip("/") + "/", f"{target.host}:{root.rstrip('/')}/"]


def rsync_to(target: SSHTarget, root: str, paths: list[str], streams: int = 4, force: bool = False) -> CopyResult:
    """Copy `paths` (relative to `root`) to the same `root` on the target, `streams` rsyncs at once."""
    t0 = time.monotonic()
    shares = _shares(Path(root), paths, streams)
    if not shares:
        return CopyResult(target.host, (), 0, 0.0, 0)
    with tempfile.TemporaryDirectory(prefix="dspark-rsync-") as tmp:
        procs = []
        for i, share in enumerate(shares):
            list_file = os.path.join(tmp, f"share{i}")
            Path(list_file).write_text("".join(p + "\n" for p in share))
            procs.append(subprocess.Popen(rsync_argv(target, root, list_file, force), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outputs = [(p, *p.communicate()) for p in procs]
    for proc, _, err in outputs:
        if proc.returncode != 0:
            detail = (err.strip().splitlines() or ["no message"])[-1]
            raise CopyFailed(f"rsync to {target.host} failed (exit {proc.returncode}): {detail}")
    sent = tuple(line for _, out, _ in outputs for line in out.splitlines() if line and not line.endswith("/"))
    sent_bytes = sum(os.lstat(Path(root) / p).st_size for p in sent if (Path(root) / p).exists())
    return CopyResult(target.host, sent, sent_bytes, time.monotonic() - t0, len(shares))
