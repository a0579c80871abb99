"""Copy model files to a worker with rsync over SSH (the launcher's SSH settings), in parallel streams.

rsync sends only files whose size or mtime differ (`force`: the named files whatever
their metadata, for repairs after a checksum failure); whole files, no delta pass (the
fabric is faster than rsync's delta search). One stream is bound by one core's SSH
cipher, hence several streams over balanced shares of the files.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

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
        """The same settings the launcher's SSHTransport (dspark_launch.agent.transport) uses."""
        return cls(
            transport.host,
            transport.port,
            transport.user,
            transport.key,
            transport.host_key_check,
            transport.connect_timeout,
            tuple(transport.extra_options),
        )

    def ssh_argv(self) -> list[str]:
        """ssh and its options, without the host (rsync adds it): exactly what the launcher's agent
        calls use, taken from SSHTransport so the two never drift apart, then the copy's bulk options."""
        from dspark_launch.agent.transport import SSHTransport

        argv = SSHTransport(
            self.host, "", self.port, self.user, self.key, self.host_key_check, self.connect_timeout, self.extra_options
        ).argv()
        options = argv[: argv.index("--")]
        return options + cipher_preference(tuple(options), self.host) + list(BULK_SSH_OPTIONS)


# After the agent's options (ssh takes the first value of each keyword), for the bytes of the copy:
# AES-GCM tried first, the rest of ssh's default list kept after it (`^`: prepended, so any sshd
# that accepts a default cipher still connects). With AES instructions (x86 AES-NI, the Arm crypto
# extension of the GB10's cores) it runs about twice chacha20-poly1305, ssh's default first choice,
# per core (bench/model_copy.py); weights do not compress, so compression stays off whatever
# ~/.ssh/config says.
BULK_SSH_OPTIONS = ("-o", "Compression=no")
CIPHER_PREFERENCE = ("-o", "Ciphers=^aes128-gcm@openssh.com,aes256-gcm@openssh.com")


@functools.lru_cache(maxsize=None)
def cipher_preference(ssh_options: tuple[str, ...], host: str) -> list[str]:
    """The AES-GCM preference, only when the operator's ssh configuration sets no cipher list: `ssh -G` (which
    connects nowhere) with every config file shows the same list as with none. A hardened list (say, only
    aes256-gcm) is kept as it is: prepending to it would bring ssh's whole default list back."""

    def ciphers(*extra: str) -> str:
        try:
            out = subprocess.run(
                [*ssh_options, *extra, "-G", host], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return next((line for line in out.splitlines() if line.startswith("ciphers ")), "")

    configured, default = ciphers(), ciphers("-F", "/dev/null")
    return list(CIPHER_PREFERENCE) if configured and configured == default else []


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


_PROGRESS = re.compile(r"^\s*([\d,]+)\s+\d+%")  # rsync --info=progress2: bytes so far, percent, ...


@dataclass
class CopyProgress:
    """Bytes sent to one worker over all its streams, reported as one line (bytes, rate, ETA) every
    `every_s` seconds and at the end; to a `report` with `measured` (the CLI's reporter) as each update, which
    it shows as a progress bar on a terminal and rate-limits without one."""

    node: str
    total_bytes: int
    report: Callable[[str], None]
    every_s: float = 5.0
    _per_stream: dict[int, int] = field(default_factory=dict)
    _started: float = field(default_factory=time.monotonic)
    _last: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, stream: int, sent: int) -> None:
        with self._lock:
            self._per_stream[stream] = sent
            measured = getattr(self.report, "measured", None)  # a reporter that shows a progress bar
            if measured is not None:
                measured(f"{self.node}: copying the weights", sum(self._per_stream.values()), self.total_bytes, "bytes")
                return
            now = time.monotonic()
            if now - self._last >= self.every_s:
                self._last = now
                self.report(self.line())

    def line(self) -> str:
        sent = sum(self._per_stream.values())
        elapsed = max(time.monotonic() - self._started, 1e-6)
        rate = sent / elapsed
        left = max(self.total_bytes - sent, 0)
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        return (
            f"{self.node}: copied {sent / (1 << 30):.2f} of {self.total_bytes / (1 << 30):.2f} GiB, "
            f"{rate / 1e6:.0f} MB/s, ETA {eta}"
        )


def _read_stream(proc: subprocess.Popen, index: int, names: list[str], progress: CopyProgress | None) -> None:
    """rsync's stdout: a file name per line (--out-format) between \\r-separated progress updates."""
    pending = ""
    while chunk := proc.stdout.read1(65536):
        pending += chunk.decode(errors="replace")
        *parts, pending = re.split(r"[\r\n]", pending)
        for part in parts:
            _take(part, index, names, progress)
    _take(pending, index, names, progress)


def _take(part: str, index: int, names: list[str], progress: CopyProgress | None) -> None:
    match = _PROGRESS.match(part)
    if match:
        if progress is not None:
            progress.update(index, int(match.group(1).replace(",", "")))
    elif part.strip():
        names.append(part)


def rsync_failure(target: SSHTarget, code: int, err: str) -> CopyFailed:
    """One line naming the address the copy used; an unknown host key says how to add it."""
    if "Host key verification failed" in err:
        return CopyFailed(
            f"rsync to {target.host} failed: the SSH host key of {target.host} (the copy address: "
            f"the worker's fabric IP unless DSPARK_MODEL_COPY_HOSTS says otherwise) is not known; "
            f"check its fingerprint on the worker and add it, e.g. "
            f"`ssh-keyscan -p {target.port} {target.host} >> ~/.ssh/known_hosts`"
        )
    detail = (err.strip().splitlines() or ["no message"])[-1]
    return CopyFailed(f"rsync to {target.host} failed (exit {code}): {detail}")


RSYNC_OPTIONS = ("-a", "--no-owner", "--no-group", "--chmod=go-w", "--whole-file")


def rsync_argv(target: SSHTarget, root: str, list_file: str, force: bool) -> list[str]:
    ssh = target.ssh_argv()
    if any("'" in a or '"' in a or "\n" in a for a in ssh):
        raise CopyFailed(f"{target.host}: SSH options with quotes cannot be passed to rsync -e")
    # The copy belongs to whoever receives it (the serving user there), never to the head's owner's
    # namesake (-a's -o/-g as root), and nobody else can write it: the start check refuses otherwise.
    argv = [
        "rsync",
        *RSYNC_OPTIONS,
        "--protect-args",
        "--mkpath",
        f"--files-from={list_file}",
        "--out-format=%n",
        "--info=progress2",
        "-e",
        shlex.join(ssh),
    ]
    if force:
        argv.append("--ignore-times")
    host = f"[{target.host}]" if ":" in target.host else target.host
    return argv + ["--", root.rstrip("/") + "/", f"{host}:{root.rstrip('/')}/"]


def _make_root(target: SSHTarget, root: str, tmp: str) -> None:
    """The destination folder made by one rsync of nothing: each rsync's receiver makes a missing destination
    itself (stat, then mkdir), and parallel ones racing to it fail ("mkdir ... failed: File exists", exit 11)."""
    nothing = os.path.join(tmp, "nothing")
    Path(nothing).write_text("")
    made = subprocess.run(rsync_argv(target, root, nothing, False), capture_output=True, text=True)
    if made.returncode != 0:
        raise rsync_failure(target, made.returncode, made.stderr)


def rsync_to(
    target: SSHTarget,
    root: str,
    paths: list[str],
    streams: int = 4,
    force: bool = False,
    progress: CopyProgress | None = None,
) -> CopyResult:
    """Copy `paths` (relative to `root`) to the same `root` on the target, `streams` rsyncs at once;
    `progress` gets each stream's bytes as rsync reports them."""
    t0 = time.monotonic()
    shares = _shares(Path(root), paths, streams)
    if not shares:
        return CopyResult(target.host, (), 0, 0.0, 0)
    with tempfile.TemporaryDirectory(prefix="dspark-rsync-") as tmp:
        if len(shares) > 1:
            _make_root(target, root, tmp)
        procs, readers, names = [], [], [[] for _ in shares]
        for i, share in enumerate(shares):
            list_file = os.path.join(tmp, f"share{i}")
            Path(list_file).write_text("".join(p + "\n" for p in share))
            proc = subprocess.Popen(
                rsync_argv(target, root, list_file, force), stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            procs.append(proc)
            readers.append(threading.Thread(target=_read_stream, args=(proc, i, names[i], progress), daemon=True))
            readers[-1].start()
        errors = [p.stderr.read().decode(errors="replace") for p in procs]
        for reader in readers:
            reader.join()
        for proc in procs:
            proc.wait()
    for proc, err in zip(procs, errors):
        if proc.returncode != 0:
            raise rsync_failure(target, proc.returncode, err)
    sent = tuple(line for share in names for line in share if not line.endswith("/"))
    sent_bytes = sum(os.lstat(Path(root) / p).st_size for p in sent if (Path(root) / p).exists())
    if progress is not None and sent_bytes:
        progress.report(progress.line())
    return CopyResult(target.host, sent, sent_bytes, time.monotonic() - t0, len(shares))
