"""Serve-only against full `dspark restart` on the two-namespace testbed (issue 24): the tiny-model
TP=2 serve, restarted with a vLLM flag changed (MAX_NUM_SEQS: serve-only, Ray kept) and with a
cluster-level setting changed (RAY_OBJECT_STORE_MB: full, Ray down and up on both nodes), each
`--rounds` times, alternating values; whether the Ray pids stayed is recorded per restart.

Runs as root under the shared lock (`flock /tmp/dspark-heavy.lock python bench/restarts.py`);
writes bench/results/restarts.json. Target: serve-only <= 0.7x the full restart's median.
"""

from __future__ import annotations

import json
import platform
import statistics
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


def dspark(tb: Testbed, env_file: Path, *args: str) -> float:
    began = time.monotonic()
    proc = tb.exec("head", [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)],
                   env=launcher_env(WORK / "scratch"), timeout=900)
    took = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"dspark {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return took


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
    try:
        env = write_env_file(WORK / "dspark.env", {**cluster_values(tb, WORK / "state"), **serving_values(model)})
        dspark(tb, env, "start")
        for index in range(rounds):
            for kind, (name, values) in (("serve_only", ("MAX_NUM_SEQS", ("4", "6"))),
                                         ("full", ("RAY_OBJECT_STORE_MB", ("160", "128")))):
                before = ray_pids()
                set_knob(env, name, values[index % 2])
                took = dspark(tb, env, "restart")
                runs[kind].append({"seconds": round(took, 1), "ray_pids_kept": ray_pids() == before})
                print(f"{kind}: {took:.1f} s", flush=True)
        dspark(tb, env, "stop")
    finally:
        tb.down()
    serve_only = statistics.median(r["seconds"] for r in runs["serve_only"])
    full = statistics.median(r["seconds"] for r in runs["full"])
    result = {"host": platform.node(), "cpus": __import__("os").cpu_count(), "rounds": rounds, "runs": runs,
              "median_serve_only_s": serve_only, "median_full_s": full, "ratio": round(serve_only / full, 2),
              "target_ratio": 0.7}
    out = REPO / "bench" / "results" / "restarts.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
