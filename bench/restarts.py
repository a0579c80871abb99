"""Serve-only against full `dspark restart` on the two-namespace testbed (issue 24): the tiny-model
TP=2 serve, restarted with a vLLM flag changed (MAX_NUM_SEQS: serve-only, Ray kept) and with a
cluster-level setting changed (RAY_OBJECT_STORE_MB: full, Ray down and up on both nodes), each
`--rounds` times, alternating values; whether the Ray pids stayed is recorded per restart.

Under streaming load (issue 24 point 1): STREAMS streaming chats in flight from inside the head node,
then the cap changed 1 -> 2 with `dspark reload` (the time the launcher measured from writing the
control file to the engine's `(live)` line, the command's wall time, streams cut), against the same
change made with `dspark restart` (serve-only, drained) and a full restart (cluster-level change).

Runs as root under the shared lock (`flock /tmp/dspark-heavy.lock python bench/restarts.py`);
writes bench/results/restarts.json. Targets: serve-only <= 0.7x the full restart's median; reload
< 2 s to the cap in force with 0 streams cut. `--under-load-only` skips the idle restarts.
"""

from __future__ import annotations

import json
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.launcher_env import cluster_values, launcher_env, serving_values, write_env_file  # noqa: E402
from tests.support.on_testbed import set_knob  # noqa: E402
from tests.support.testbed.testbed import Testbed, requirements_met  # noqa: E402
from tests.support.tiny_model import build_tiny_model  # noqa: E402

WORK = Path("/tmp/dspark-bench-restarts")
VENV_BIN = Path(sys.executable).parent
CLIENT = REPO / "tests" / "support" / "stream_client.py"
STREAMS, STREAM_TOKENS = 4, 900
IN_FORCE = re.compile(r"in force on the running scheduler after ([0-9.]+) s")


def dspark(tb: Testbed, env_file: Path, *args: str, out: list | None = None) -> float:
    began = time.monotonic()
    proc = tb.exec(
        "head",
        [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)],
        env=launcher_env(WORK / "scratch"),
        timeout=900,
    )
    took = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"dspark {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    if out is not None:
        out.append(proc.stdout)
    return took


def streams_in_flight(tb: Testbed) -> subprocess.Popen:
    """STREAMS streaming chats from inside the head node, returned once each has its first token."""
    key = "sk-dspark-bench-restarts"
    client = tb.popen(
        "head",
        [sys.executable, str(CLIENT), "http://127.0.0.1:8000", key, "tiny", str(STREAMS), str(STREAM_TOKENS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = 0
    while started < STREAMS:
        line = client.stdout.readline()
        if not line:
            raise SystemExit(f"the stream client ended: {client.stderr.read()[-2000:]}")
        started += line.startswith("first ")
    return client


def streams_cut(client: subprocess.Popen) -> int:
    out, _ = client.communicate(timeout=600)
    found = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return sum(1 for r in found if r["finish_reason"] != "length" or r["error"]) + STREAMS - len(found)


def under_load(tb: Testbed, env: Path, kind: str, value: str) -> dict:
    """One change made while STREAMS streams run: `reload` or `restart` of the cap, or a full restart."""
    client = streams_in_flight(tb)
    out: list[str] = []
    if kind == "full":
        set_knob(env, "RAY_OBJECT_STORE_MB", value)
        took = dspark(tb, env, "restart")
    else:
        set_knob(env, "DSPARK_MAX_INFLIGHT_PREFILLS", value)
        took = dspark(tb, env, kind, out=out)
    row = {"command_s": round(took, 2), "streams": STREAMS, "streams_cut": streams_cut(client)}
    found = IN_FORCE.search("".join(out))
    if found:
        row["write_to_in_force_s"] = float(found.group(1))
    return row


def ray_pids() -> list[int]:
    state = json.loads((WORK / "state" / "state.json").read_text())
    return sorted(p["pid"] for node in state["nodes"] for p in node["processes"])


def main(argv: list[str]) -> int:
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 2
    ok, why = requirements_met()
    if not ok:
        print(f"bench/restarts.py needs the testbed: {why}", file=sys.stderr)
        return 1
    WORK.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(WORK / "tiny-model")
    tb = Testbed(state_dir=str(WORK / "testbed"), nodes=2, venv=str(VENV_BIN.parent), prefix="dsbr")
    tb.up()
    runs: dict[str, list[dict]] = {"serve_only": [], "full": []}
    loaded: dict[str, list[dict]] = {"reload": [], "restart": [], "full": []}
    try:
        env = write_env_file(
            WORK / "dspark.env",
            {
                **cluster_values(tb, WORK / "state"),
                **serving_values(model),
                "VLLM_API_KEY": "sk-dspark-bench-restarts",
                "MAX_MODEL_LEN": "1024",
                "MAX_NUM_BATCHED_TOKENS": "1024",
            },
        )
        dspark(tb, env, "start")
        for index in range(rounds):
            # The cap is 1 before each round: reload takes it to 2, restart back to 1.
            for kind, values in (("reload", ("2", "2")), ("restart", ("1", "1")), ("full", ("160", "128"))):
                loaded[kind].append(under_load(tb, env, kind, values[index % 2]))
                print(f"under load, {kind}: {loaded[kind][-1]}", flush=True)
        for index in range(0 if "--under-load-only" in argv else rounds):
            for kind, (name, values) in (
                ("serve_only", ("MAX_NUM_SEQS", ("4", "6"))),
                ("full", ("RAY_OBJECT_STORE_MB", ("160", "128"))),
            ):
                before = ray_pids()
                set_knob(env, name, values[index % 2])
                took = dspark(tb, env, "restart")
                runs[kind].append({"seconds": round(took, 1), "ray_pids_kept": ray_pids() == before})
                print(f"{kind}: {took:.1f} s", flush=True)
        dspark(tb, env, "stop")
    finally:
        tb.down()
    out = REPO / "bench" / "results" / "restarts.json"
    result = json.loads(out.read_text()) if "--under-load-only" in argv and out.exists() else {}
    if runs["serve_only"]:
        serve_only = statistics.median(r["seconds"] for r in runs["serve_only"])
        full = statistics.median(r["seconds"] for r in runs["full"])
        result.update(
            {
                "rounds": rounds,
                "runs": runs,
                "median_serve_only_s": serve_only,
                "median_full_s": full,
                "ratio": round(serve_only / full, 2),
                "target_ratio": 0.7,
            }
        )
    result.update({"host": platform.node(), "cpus": __import__("os").cpu_count()})
    result["cap_change_under_load"] = {
        "method": f"{STREAMS} streaming chats of {STREAM_TOKENS} tokens in flight (inside the head node), then "
        "DSPARK_MAX_INFLIGHT_PREFILLS 1 -> 2 applied by `dspark reload`, 2 -> 1 by `dspark restart` "
        "(serve-only, drained), or RAY_OBJECT_STORE_MB changed and `dspark restart` (full); "
        "write_to_in_force_s: the launcher's time from writing the control file to the engine's "
        "(live) line; command_s: the command's wall time",
        "runs": loaded,
        "median_reload_in_force_s": statistics.median(r["write_to_in_force_s"] for r in loaded["reload"]),
        "median_reload_command_s": statistics.median(r["command_s"] for r in loaded["reload"]),
        "median_restart_command_s": statistics.median(r["command_s"] for r in loaded["restart"]),
        "median_full_restart_command_s": statistics.median(r["command_s"] for r in loaded["full"]),
        "streams_cut": {kind: sum(r["streams_cut"] for r in rows) for kind, rows in loaded.items()},
        "target_in_force_s": 2.0,
        "target_streams_cut": 0,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
