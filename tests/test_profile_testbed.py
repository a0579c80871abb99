"""`dspark plan` with no network at all, on the example file (the tiny-test profile's serve on the testbed, each
node with its own fabric values in vLLM's Ray workers: tests/test_serving.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.on_testbed import VENV_BIN
from tests.support.paths import REPO

EXAMPLE = REPO / ".env.dspark.example"


def in_empty_netns(*args: str) -> subprocess.CompletedProcess:
    """`dspark ARGS` in a network namespace of its own with only a loopback that is down: nothing reachable."""
    return subprocess.run(
        ["unshare", "-n", str(VENV_BIN / "dspark"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DSPARK_STATE_DIR": "/nonexistent/dspark-plan-test"},
    )


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for unshare -n")
def test_plan_on_the_example_file_contacts_nothing_and_exits_1():
    """Start would refuse the example's placeholders: plan, a pre-flight for scripts, exits 1 and says why."""
    text = in_empty_netns("plan", "--env-file", str(EXAMPLE))
    assert text.returncode == 1, text.stderr[-3000:]
    assert "start would refuse (" in text.stdout and "placeholders from the example still set" in text.stdout
    assert "worker1 (192.0.2.2): not probed: its address is a placeholder from the example file" in text.stdout
    # nvfp4_ds_mla is refused on every capability vLLM 0.32 was asked for: not emitted, even with no GPU known.
    assert "kv-cache-dtype fp8: nvfp4_ds_mla refused by the installed vLLM 0.32.0 on every capability" in text.stdout
    assert " --kv-cache-dtype fp8 " in text.stdout and "RAY_AUTH_TOKEN=set  (secret)" in text.stdout
    shown = in_empty_netns("plan", "--json", "--env-file", str(EXAMPLE))
    assert shown.returncode == 1, shown.stderr[-3000:]
    plan = json.loads(shown.stdout)
    assert plan["schema"] == "dspark-plan/1" and plan["from_example"] and plan["vllm_version"] == "0.32.0"
    assert [(n["node"], n["probed"]) for n in plan["nodes"]] == [("head", True), ("worker1", False)]
    head = plan["nodes"][0]
    serve_argv = head["commands"][1]
    for flag in ("--trust-remote-code", "--tokenizer-mode", "--speculative-config", "--tensor-parallel-size"):
        assert flag in serve_argv, flag
    env = {(e["origin"], e["name"]): e["value"] for e in head["env"]}
    assert env[("vllm serve", "VLLM_ALLOW_LONG_MAX_MODEL_LEN")] == "1"
    assert env[("ray start: fabric (sysfs)", "NCCL_CUMEM_ENABLE")] == "0"
    assert plan["memory"]["kv_cache_dtype"] == "fp8"  # not judged for a GPU here; sized as fp8_ds_mla rows
    # Weights not pulled: the profile's measured 81.34 GiB per node and ~11.5 GiB overhead are counted, so this
    # small CPU machine does not hold the share, and the plan says start would refuse it.
    memory = plan["memory"]
    assert memory["weights_per_node"] == int(81.34 * 2**30) and memory["non_kv_bytes"] == int(11.5 * 2**30)
    assert head["memory"]["need_bytes"] == memory["weights_per_node"] + memory["non_kv_bytes"] + memory["kv_per_node"]
    refused = [w for w in plan["warnings"] if w.startswith("memory: head:")]
    assert head["memory"]["fits"] == (not refused) and all("start refuses this without --force" in w for w in refused)
    # No such interface in this namespace: the plan names it missing and says start would refuse it (exit 2).
    # (the interfaces listed are this host's: `unshare -n` keeps the host's /sys mounted)
    refusal = next(r for r in head["refusals"] if r.startswith("fabric: "))
    assert refusal.startswith(
        "fabric: head (192.0.2.1): no interface enp1s0f1np1 on this node (DSPARK_FABRIC_IFNAME; its interfaces: "
    ) and refusal.endswith("): start refuses this (exit 2) unless DSPARK_ALLOW_TCP_FABRIC=1"), refusal
    assert refusal in plan["warnings"] and refusal in plan["refusals"]
    # Every flag and variable of the profile with its reason; this CPU node reports no GPU, and the lines say so.
    reasons = {d["subject"]: d["reason"] for d in plan["decisions"]}
    for subject in (
        "kv-cache-dtype",
        "moe-backend",
        "load-format",
        "max-cudagraph-capture-size",
        "VLLM_USE_BREAKABLE_CUDAGRAPH",
        "CUTE_DSL_ARCH",
        "PYTORCH_CUDA_ALLOC_CONF",
    ):
        assert reasons[subject], subject
    assert "not judged for a GPU: no node reported a GPU compute capability (asked: head" in reasons["kv-cache-dtype"]
    assert not Path("/nonexistent/dspark-plan-test").exists()  # nothing written


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for unshare -n")
def test_plan_gpu_12_1_json_is_judged_by_the_installed_vllm_for_gb10():
    """`dspark plan --gpu 12.1 --json` on the example file: every node as a GB10, judged by vLLM 0.32's own code
    (this CPU box has neither b12x nor FlashInfer: the stock-install answer)."""
    shown = in_empty_netns("plan", "--gpu", "12.1", "--json", "--env-file", str(EXAMPLE))
    # exit 1: start would refuse the example's placeholder hosts (issue 33); the plan itself is complete
    assert shown.returncode == 1, shown.stderr[-3000:]
    plan = json.loads(shown.stdout)
    assert plan["judged_for"] == "compute capability 12.1 given by --gpu (as if every node reported it)"
    assert plan["cuda_graph_mode"] == "FULL_DECODE_ONLY"
    decisions = {d["subject"]: d for d in plan["decisions"]}
    assert (
        decisions["kv-cache-dtype"]["value"] == "fp8"
        and "stored as fp8_ds_mla" in decisions["kv-cache-dtype"]["reason"]
    )
    assert decisions["moe-backend"]["value"] == "marlin"  # not auto: DeepGEMM where the build ships it
    assert (
        "MoE oracle for the checkpoint's experts (Mxfp4MoEMethod) selects MARLIN with VLLM_USE_DEEP_GEMM=0"
        in decisions["moe-backend"]["reason"]
    )
    assert decisions["cuda-graphs (effective)"]["value"] == "FULL_DECODE_ONLY"
    assert decisions["VLLM_USE_DEEP_GEMM"]["value"] == "0"
    assert not [r for r in plan["refusals"] if "not judged" in r]
    serve_argv = plan["nodes"][0]["commands"][1]
    assert serve_argv[serve_argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert "flashinfer_b12x" not in serve_argv
    bad = in_empty_netns("plan", "--gpu", "twelve", "--env-file", str(EXAMPLE))
    assert bad.returncode == 2 and "--gpu 'twelve' from the command line is not a compute capability" in bad.stderr
