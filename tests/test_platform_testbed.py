"""The platform pre-flight and the memory guard on the two-node testbed, each node with fake procfs, sysfs and
/lib/modules of its own (bind-mounted at one path in each node's mount namespace): `CmaTotal: 0 kB` on the head and a
driver module not built for the worker's kernel make `plan` and `start` exit 2 naming both, with nothing started;
with those fixed, the nodes' differing ConnectX firmware is a warning and the supervisor serves; the worker's
MemAvailable below DSPARK_MEMORY_FLOOR_MIB closes admission (a stream goes on, a new prompt waits), back above it
opens it, and supervision's end opens it too; a kernel changed on the worker since start is what `status` shows.
The supervision ends as systemd may end it: SIGTERM, and SIGTERM again while the supervisor holds the deployment lock
to stop its run (the second is ignored; the lock is left free, no record behind)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dspark_launch.cluster.state import STATE_FILE, load_state, lock_holder
from tests.support.launcher_env import FORWARDED, launcher_env, paced_extra_args, scratch
from tests.support.on_testbed import VENV_BIN, our_pids, read_until_served, serving_env
from tests.support.platform_trees import KERNEL, meminfo, spark_tree, write
from tests.support.processes import describe
from tests.support.supervised import Journal, completion_argv, one_stream

pytestmark = [pytest.mark.testbed, pytest.mark.serving]

NEW_KERNEL = "7.0.0-1019-nvidia"
AMPLE_KB = 100_000_000
# The stream must decode while the guard closes admission, a prompt waits and status shows both: paced steps make
# its tokens last at least STREAM_TOKENS x PACED_STEP_MS (90 s), however loaded the host.
STREAM_TOKENS = 900
ROOTS = {"proc": "DSPARK_TEST_PROCFS_ROOT", "sys": "DSPARK_TEST_SYSFS_ROOT", "modules": "DSPARK_TEST_MODULES_ROOT"}


def state_log(tmp_path: Path) -> Path:
    return tmp_path / "state" / "logs" / "vllm-serve.log"


def engine_counters(dspark, wanted, timeout: float = 120) -> dict:
    """`status --json`'s engine numbers once `wanted(counters)` holds (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engine = json.loads(dspark("status", "--json").stdout)["server"].get("engine") or {}
        counters = engine.get("counters")
        if counters and wanted(counters):
            return counters
        time.sleep(0.5)
    raise AssertionError("the engine's numbers never showed it")


def test_platform_refusals_stop_plan_and_start_the_memory_guard_pauses_admission_and_status_shows_what_changed(
    testbed_clean, tmp_path, tiny_model
):
    tb = testbed_clean
    trees = {
        "head": spark_tree(tmp_path / "head-tree", ip=tb.head.ip, cma_kb=0),
        "worker1": spark_tree(
            tmp_path / "worker-tree",
            ip=tb.node("worker1").ip,
            kernel=NEW_KERNEL,
            module_kernels=(KERNEL,),
            loaded=False,
            firmware="28.44.1036",
        ),
    }
    mounted = {name: tmp_path / name for name in ROOTS}
    for folder in mounted.values():
        folder.mkdir()
    for node, tree in trees.items():  # one path, each node's own tree
        for name, folder in mounted.items():
            tb.exec(node, ["mount", "--bind", str(tree / name), str(folder)], check=True)
    env_file = serving_env(
        tb,
        tmp_path,
        tiny_model,
        DSPARK_FORWARD_ENV=" ".join((*FORWARDED, *ROOTS.values())),
        MAX_MODEL_LEN="1024",
        VLLM_EXTRA_ARGS=paced_extra_args(),
        DSPARK_MEMORY_GUARD="pause",
        DSPARK_MEMORY_FLOOR_MIB="2048",
        DSPARK_RECOVERY_LIMIT="0",
    )
    cli_env = {**launcher_env(scratch(tmp_path)), **{var: str(mounted[name]) for name, var in ROOTS.items()}}
    state_dir = tmp_path / "state"

    def dspark(*args: str):
        return tb.exec("head", [str(VENV_BIN / "dspark"), *args, "--env-file", str(env_file)], env=cli_env, timeout=600)

    head, worker = f"head ({tb.head.ip})", f"worker1 ({tb.node('worker1').ip})"
    supervisor = None
    try:
        planned = dspark("plan", "--json")
        assert planned.returncode == 2, planned.stderr[-3000:]
        refusals = [r for r in json.loads(planned.stdout)["refusals"] if r.startswith("platform: ")]
        assert refusals[0].startswith(f"platform: {head}: CmaTotal 0 kB (kernel {KERNEL})") and "#389" in refusals[0]
        assert refusals[1].startswith(
            f"platform: {worker}: the NVIDIA driver's kernel module is NOT built for the "
            f"running kernel {NEW_KERNEL} (built for {KERNEL})"
        )
        warnings = json.loads(planned.stdout)["warnings"]
        assert any(w.startswith("platform: ConnectX firmware differs between the nodes") for w in warnings)

        refused = dspark("start")
        assert refused.returncode == 2, refused.stderr[-3000:]
        errors = [line for line in refused.stderr.splitlines() if line.startswith("dspark: error: ")]
        assert errors[0].startswith(f"dspark: error: platform: {worker}: the NVIDIA driver's kernel module") or errors[
            0
        ].startswith(f"dspark: error: platform: {head}: CmaTotal 0 kB"), refused.stderr[-3000:]
        assert len(errors) == 2 and "nothing was started" in refused.stderr, refused.stderr[-3000:]
        assert "starting Ray" not in refused.stderr and not (tmp_path / "state" / "state.json").exists()
        assert our_pids(tb, "head") | our_pids(tb, "worker1") == set()

        # Fixed (the board firmware's CMA back, the worker's module built for its kernel): the firmware still differs.
        # Served under the supervisor with the memory guard on.
        write(trees["head"] / "proc" / "meminfo", meminfo(AMPLE_KB))
        write(trees["worker1"] / "modules" / NEW_KERNEL / "modules.dep", "updates/dkms/nvidia.ko.zst:\n")
        supervisor = tb.popen(
            "head",
            [str(VENV_BIN / "dspark"), "start", "--foreground", "--env-file", str(env_file)],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seen = read_until_served(supervisor)
        journal = Journal(supervisor)
        assert "platform: ConnectX firmware differs between the nodes" in "".join(seen)

        # The worker's MemAvailable below the floor with a stream running: admission closes (the engine says so),
        # the stream goes on decoding, a new prompt waits; back above 1.5 x the floor it opens and the prompt is served.
        stream = one_stream(tb, STREAM_TOKENS)
        log = state_log(tmp_path)
        write(trees["worker1"] / "proc" / "meminfo", meminfo(1 << 20))  # 1 GiB
        journal.wait_for(
            rf"memory guard: admission closed: {re.escape(worker)}: MemAvailable 1024 MiB below "
            r"DSPARK_MEMORY_FLOOR_MIB 2048: in force",
            120,
        )
        assert "admission closed off -> on (live)" in log.read_text(errors="replace")
        waiting = tb.popen(
            "head", completion_argv(4), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        waiting.stdin.write("Hello there")
        waiting.stdin.close()
        held = engine_counters(dspark, lambda c: c["waiting"] >= 1 and c["running"] >= 1)
        later = engine_counters(dspark, lambda c: c["generation_tokens"] > held["generation_tokens"])
        assert later["waiting"] >= 1 and waiting.poll() is None, later  # the stream decoded, the prompt still waits
        shown = dspark("status")
        assert "memory guard (DSPARK_MEMORY_GUARD=pause): admission closed since" in shown.stdout, shown.stdout
        write(trees["worker1"] / "proc" / "meminfo", meminfo(AMPLE_KB))
        journal.wait_for(r"memory guard: admission open again: every node above 3072 MiB available", 120)
        waiting.wait(timeout=300)
        assert json.loads(waiting.stdout.read())["status"] == 200, waiting.stderr.read()[-2000:]
        stream.kill()

        write(trees["worker1"] / "proc" / "sys" / "kernel" / "osrelease", "7.0.0-1020-nvidia\n")
        shown = dspark("status", "--json")
        assert (
            f"platform: {worker} changed since start: kernel {NEW_KERNEL} -> 7.0.0-1020-nvidia; NVIDIA module "
            "built for the running kernel -> NOT built for the running kernel" in json.loads(shown.stdout)["warnings"]
        )
        text = dspark("status")
        assert f"warning: platform: {worker} changed since start: kernel" in text.stdout

        # Closed again, then supervision ends: SIGTERM, and SIGTERM again while the supervisor holds the lock to stop
        # its run (systemd, an impatient operator). The guard opens admission before the run is stopped, the second
        # signal is ignored, the stop completes (exit 143), the lock is free and no record is left.
        write(trees["worker1"] / "proc" / "meminfo", meminfo(1 << 20))
        journal.wait_for(r"memory guard: admission closed: ", 120, count=2)
        supervisor.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while lock_holder(state_dir) != str(supervisor.pid):
            assert supervisor.poll() is None and time.monotonic() < deadline, journal.text()[-3000:]
            time.sleep(0.005)
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=300)
        journal.thread.join(timeout=10)
        out = journal.text()
        assert "memory guard: admission open again: supervision ended" in out, out[-3000:]
        assert supervisor.returncode == 143, out[-3000:]
        assert "dspark: still stopping what this run started; please wait" in out, out[-3000:]
        assert "interrupted; everything this run started was stopped (exit 143)" in out and "Traceback" not in out
        assert lock_holder(state_dir) is None and load_state(state_dir) is None
        assert [p.name for p in state_dir.iterdir() if p.name.startswith(f".{STATE_FILE}.")] == []
    finally:
        if supervisor is not None and supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(timeout=300)
        stopped = dspark("stop")
        for node in trees:
            for folder in mounted.values():
                tb.exec(node, ["umount", str(folder)])
    assert stopped.returncode == 0, stopped.stderr
    left = our_pids(tb, "head") | our_pids(tb, "worker1")
    assert left == set(), describe(left)
