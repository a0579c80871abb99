"""Wall time of the light CLI commands (they must not import torch, vllm or ray).

Writes bench/results/cli_startup.json; target: each under 0.3 s.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMANDS = [["--help"], ["--version"], ["config", "show"], ["config", "check"], ["config", "get", "VLLM_PORT"]]


def main(repeat: int = 7) -> dict:
    results = {}
    for args in COMMANDS:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "dspark_launch", *args], capture_output=True, cwd=REPO, check=False)
            times.append(time.perf_counter() - start)
        results[" ".join(args)] = {"median_s": round(statistics.median(times), 4), "max_s": round(max(times), 4)}
    report = {
        "machine": f"{platform.machine()} {platform.processor() or ''} python {platform.python_version()}",
        "repeat": repeat,
        "target_s": 0.3,
        "commands": results,
    }
    out = REPO / "bench" / "results" / "cli_startup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for name, r in results.items():
        print(f"dspark {name:<28} median {r['median_s']:.3f} s  max {r['max_s']:.3f} s")
    return report


if __name__ == "__main__":
    main()
