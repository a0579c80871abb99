"""Model copy to a worker (rsync over SSH, as `dspark model pull` does) against a plain scp of the same
files in the same run, and the pre-start fast check on a many-file model.

Builds a private two-node testbed (root; run it under the heavy lock:
`flock /tmp/dspark-heavy.lock .venv/bin/python bench/model_copy.py`). The worker gets a disk of its
own at the model path (a bind mount in its mount namespace). Writes bench/results/model_copy.json.
Target: rsync throughput at least 0.9 of scp's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dspark_launch.model.copy import SSHTarget, effective_streams, rsync_to  # noqa: E402
from dspark_launch.model.manifest import Manifest, ManifestFile, write_manifest  # noqa: E402
from dspark_launch.model.local_model import local_manifest  # noqa: E402
from dspark_launch.model.node_check import fast_check, verify_model  # noqa: E402

OUT = REPO / "bench" / "results" / "model_copy.json"


def write_payload(folder: Path, files: int, size: int) -> list[str]:
    """Incompressible files (SSH and rsync compress nothing here, but keep it honest)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    block = os.urandom(1 << 20)
    for i in range(files):
        name = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        with open(folder / name, "wb") as fh:
            for n in range(size >> 20):
                fh.write(block[n % 7:] + block[:n % 7])
        names.append(name)
    return names


def inner(request: dict) -> dict:
    """Inside the head node: time scp and rsync (1, 2, 4 streams) to the worker, interleaved."""
    target = SSHTarget(**{**request["target"], "extra_options": tuple(request["target"]["extra_options"])})
    src, names, dest_root = request["src"], request["names"], request["dest_root"]
    total = sum(os.path.getsize(os.path.join(src, n)) for n in names)
    ssh = target.ssh_argv()

    def remote(cmd: str) -> None:
        subprocess.run(ssh + ["--", target.host, cmd], check=True, capture_output=True)

    def scp() -> float:
        remote(f"rm -rf {shlex.quote(dest_root)}/scp && mkdir -p {shlex.quote(dest_root)}/scp")
        options = [a for i, a in enumerate(ssh) if i and a not in ("-p", "-l") and ssh[i - 1] not in ("-p", "-l")]
        argv = ["scp", "-q", "-P", str(target.port), *options] + (["-o", f"User={target.user}"] if target.user else [])
        t0 = time.perf_counter()
        subprocess.run(argv + [os.path.join(src, n) for n in names] + [f"{target.host}:{dest_root}/scp/"], check=True)
        return time.perf_counter() - t0

    def rsync(streams: int) -> float:
        remote(f"find {shlex.quote(src)} -mindepth 1 -delete")  # the worker's own disk at src's path
        t0 = time.perf_counter()
        result = rsync_to(target, src, names, streams)
        assert len(result.files_sent) == len(names), result
        return time.perf_counter() - t0

    runs: dict[str, list[float]] = {"scp": [], "rsync_1": [], "rsync_2": [], "rsync_4": []}
    for _ in range(request["repeat"]):
        runs["scp"].append(scp())
        for streams in (1, 2, 4):
            runs[f"rsync_{streams}"].append(rsync(streams))
    return {"bytes": total, "runs_s": runs}


def run_inner_in_head(tb, request: dict) -> dict:
    proc = tb.exec(tb.head, [f"{tb.venv}/bin/python", str(Path(__file__).resolve()), "--inner"],
                   input=json.dumps(request), cwd=str(REPO), timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"inner run failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def verify_bench(folder: Path) -> dict:
    """sha256 throughput: building a manifest (one file at a time) and a full verify (threads), warm cache."""
    t0 = time.perf_counter()
    manifest = local_manifest(str(folder))
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert verify_model(str(folder), manifest, full=True).ok
    verify = time.perf_counter() - t0
    total = manifest.total_size
    return {"bytes": total, "manifest_build_s": round(build, 3), "manifest_build_MBps": round(total / build / 1e6, 1),
            "full_verify_s": round(verify, 3), "full_verify_MBps": round(total / verify / 1e6, 1)}


def fast_check_bench(folder: Path, files: int, total: int, repeat: int) -> dict:
    """Sparse files (no disk used), a manifest over them, fast_check timed warm."""
    folder.mkdir(parents=True, exist_ok=True)
    size = total // files
    entries = []
    for i in range(files):
        name = f"layer-{i:05d}.safetensors"
        with open(folder / name, "wb") as fh:
            fh.truncate(size)
        entries.append(ManifestFile(name, size, f"{i:064x}"))
    manifest = Manifest("bench/many-files", "0" * 40, tuple(entries))
    write_manifest(folder, manifest)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        report = fast_check(str(folder), manifest.stamp)
        times.append(time.perf_counter() - t0)
        assert report.ok, report.problems[:3]
    return {"files": files, "total_bytes": size * files, "median_s": round(statistics.median(times), 4),
            "max_s": round(max(times), 4), "repeat": repeat}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--files", type=int, default=8, help="payload files (default 8)")
    ap.add_argument("--file-mib", type=int, default=128, help="MiB per payload file (default 128)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--many-files", type=int, default=2000)
    ap.add_argument("--many-gib", type=float, default=4.0)
    args = ap.parse_args()
    if args.inner:
        print(json.dumps(inner(json.load(sys.stdin))))
        return 0

    from tests.support.testbed.testbed import Testbed

    pid = os.getpid()
    root = Path(f"/tmp/dspmb-{pid}")
    tb = Testbed(state_dir=f"/tmp/dspmb-tb-{pid}", nodes=2, prefix=f"dspmb{pid}")
    try:
        src, worker_disk, dest_root = root / "src", root / "worker-disk", root / "dest"
        names = write_payload(src, args.files, args.file_mib << 20)
        worker_disk.mkdir(parents=True)
        tb.up()
        worker = tb.workers[0]
        # the worker's own disk at the copy's paths: rsync writes to src's path there, scp under dest
        for path in (src, dest_root):
            sub = worker_disk / path.name
            sub.mkdir()
            tb.exec(worker, ["mkdir", "-p", str(path)], check=True)
            tb.exec(worker, ["mount", "--bind", str(sub), str(path)], check=True)
        target = SSHTarget(worker.ip, user="root", key=tb.ssh_key, host_key_check="accept-new",
                           extra_options=("-o", f"UserKnownHostsFile={tb.known_hosts}"))
        copy = run_inner_in_head(tb, {"target": asdict(target), "src": str(src), "names": names,
                                      "dest_root": str(dest_root), "repeat": args.repeat})
        fast = fast_check_bench(root / "many", args.many_files, int(args.many_gib * (1 << 30)), 7)
        hashing = verify_bench(src)
    finally:
        tb.down()
        shutil.rmtree(root, ignore_errors=True)

    total = copy["bytes"]
    medians = {k: statistics.median(v) for k, v in copy["runs_s"].items()}
    rates = {k: round(total / v / 1e6, 1) for k, v in medians.items()}
    best = max((k for k in rates if k.startswith("rsync")), key=rates.get)
    report = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}, "
                   f"load {os.getloadavg()[0]:.2f}",
        "link": "veth pair through a bridge (two network namespaces on one machine), SSH with default ciphers",
        "payload": {"files": args.files, "bytes": total},
        "repeat": args.repeat,
        "median_s": {k: round(v, 3) for k, v in medians.items()},
        "runs_s": {k: [round(x, 3) for x in v] for k, v in copy["runs_s"].items()},
        "throughput_MBps": rates,
        "default_streams": effective_streams(4),  # DSPARK_MODEL_COPY_STREAMS=4, capped at this head's cores
        "default_over_scp": round(rates[f"rsync_{effective_streams(4)}"] / rates["scp"], 3),
        "best_rsync": best,
        "best_rsync_over_scp": round(rates[best] / rates["scp"], 3),
        "target_ratio": 0.9,
        "fast_check": fast,
        "sha256": hashing,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
