"""The `dspark plan` model: what start would run per node, secrets as set/unset, JSON shape."""

from __future__ import annotations

import json

from dspark_launch.config.profile_resolve import resolve
from dspark_launch.config.settings import resolve as load_settings
from dspark_launch.node.fabric import FabricRequest, fabric_env
from dspark_launch.node.vllm_offer import VllmOffer
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from dspark_launch.profiles.memory_model import GIB, NodeMemory, estimate_memory
from dspark_launch.serve.plan_report import (
    NOT_PROBED_EXAMPLE,
    PLAN_SCHEMA,
    NodePlan,
    Plan,
    env_entries,
    not_probed,
    profile_decisions,
)
from tests.support.paths import DATA, REPO
from tests.support.sysfs import add_port, ipv4_gid

SECRET = "sk-very-secret-value"


def test_plan_on_the_example_file_marks_workers_not_probed_and_hides_secrets(tmp_path):
    settings = load_settings(env_file=str(REPO / ".env.dspark.example"), environ={"VLLM_API_KEY": SECRET})
    offer = VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text())
    resolved = resolve(DEEPSEEK_V4_FLASH, offer, settings)
    add_port(tmp_path, "0000:01:00.1", "enp1s0f1np1", "rocep1s0f1", {3: (ipv4_gid("192.0.2.1"), "RoCE v2")})
    head_fabric = fabric_env(FabricRequest("head", "enp1s0f1np1", "192.0.2.1"), tmp_path)
    memory = estimate_memory(
        DEEPSEEK_V4_FLASH,
        resolved.kv_cache_dtype,
        resolved.max_model_len,
        2,
        None,
        None,
        (NodeMemory("head", 128 * GIB),),
        resolved.gpu_memory_utilization,
    )
    head = NodePlan(
        node="head",
        address="192.0.2.1",
        probed=True,
        status="probed",
        commands=(("vllm", "serve", *resolved.serve_args),),
        env=env_entries(resolved.env, "profile")
        + env_entries(head_fabric.env, "fabric (sysfs)")
        + env_entries((("VLLM_API_KEY", SECRET), ("RAY_AUTH_TOKEN", "")), "settings"),
        fabric_notes=head_fabric.notes,
        warnings=head_fabric.warnings,
        memory=memory.findings[0],
    )
    plan = Plan(
        profile=resolved.profile,
        vllm_version=resolved.vllm_version,
        env_file=str(settings.env_file),
        from_example=settings.from_example,
        decisions=profile_decisions(resolved),
        nodes=(head, not_probed("worker1", "192.0.2.2")),
        memory=memory,
    )
    text = plan.to_json()
    assert SECRET not in text
    body = json.loads(text)
    assert body["schema"] == PLAN_SCHEMA and body["from_example"] is True and body["vllm_version"] == "0.25.0"
    env = {e["name"]: e for e in body["nodes"][0]["env"]}
    assert env["VLLM_API_KEY"] == {"name": "VLLM_API_KEY", "value": "set", "secret": True, "origin": "settings"}
    assert env["RAY_AUTH_TOKEN"]["value"] == "unset" and env["NCCL_IB_GID_INDEX"]["value"] == "3"
    assert body["nodes"][1] == {
        "node": "worker1",
        "address": "192.0.2.2",
        "probed": False,
        "status": NOT_PROBED_EXAMPLE,
        "commands": [],
        "env": [],
        "fabric_notes": [],
        "warnings": [],
        "memory": None,
        "refusals": [],
    }
    lines = [d["line"] for d in body["decisions"]]
    assert lines[0] == "vllm 0.25.0: installed on the head; profile deepseek-v4-flash-0731"
    assert any(line.startswith("kv-cache-dtype fp8: nvfp4_ds_mla not offered") for line in lines)
    assert body["memory"]["fits"] is True and body["memory"]["kv_cache_dtype"] == "fp8"
    assert "--kv-cache-dtype" in body["nodes"][0]["commands"][0]


def test_plan_json_on_the_example_file_shows_every_flag_and_variable_with_its_source_and_reason():
    """The GB10 judgement as `dspark plan --json` carries it: the installed 0.32's KV verdicts (recorded from
    the live offer's shape), each profile flag and variable a decision with its recipe and why."""
    from dataclasses import replace

    from dspark_launch.node.values import BackendVerdict
    from dspark_launch.node.vllm_offer import BootJudgement, KvJudgement, KvVerdict
    from dspark_launch.profiles.gpu import gpu_target

    settings = load_settings(env_file=str(REPO / ".env.dspark.example"), environ={})
    attention = "DeepseekV4FlashInferSM120Attention (FLASHINFER_MLA_SPARSE_DSV4)"
    offer = replace(
        VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text()),
        kv_judgements=(
            KvJudgement(
                "12.1",
                attention,
                (KvVerdict("nvfp4_ds_mla", "", "fp8_ds_mla layout only supports fp8"), KvVerdict("fp8", "fp8_ds_mla")),
            ),
        ),
        # The dry boot's verdicts for the chosen values (without one, the plan refuses the decision).
        boot_judgements=(
            BootJudgement(
                "12.1",
                attention,
                "Mxfp4MoEMethod",
                (BackendVerdict("b12x", "B12X_MXFP4_MXFP8"),),
                (BackendVerdict("b12x", "B12xFp8BlockScaledMMKernel"),),
                (),
            ),
        ),
        modules=("b12x", "instanttensor", "cutlass"),
        env_names=("VLLM_USE_BREAKABLE_CUDAGRAPH",),
    )
    resolved = resolve(DEEPSEEK_V4_FLASH, offer, settings, gpu_target({"head": "12.1", "worker1": "12.1"}))
    plan = Plan(
        profile=resolved.profile,
        vllm_version=resolved.vllm_version,
        env_file=str(settings.env_file),
        from_example=settings.from_example,
        decisions=profile_decisions(resolved),
        nodes=(not_probed("worker1", "192.0.2.2"),),
        memory=None,
    )
    decisions = {d["subject"]: d for d in json.loads(plan.to_json())["decisions"]}
    profile = DEEPSEEK_V4_FLASH
    for pref in profile.preferences:
        decision = decisions[pref.flag.lstrip("-")]
        assert decision["reason"] and decision["line"].startswith(pref.flag.lstrip("-")), pref.flag
        assert pref.source in decision["reason"], pref.flag
    for var in profile.env:
        assert decisions[var.name]["reason"] and var.source in decisions[var.name]["reason"], var.name
    for subject in ("speculative-config", "max-cudagraph-capture-size", "trust-remote-code"):
        assert decisions[subject]["reason"], subject
    assert (
        decisions["kv-cache-dtype"]["value"] == "fp8"
        and "stored as fp8_ds_mla" in decisions["kv-cache-dtype"]["reason"]
    )
    assert decisions["moe-backend"]["value"] == "b12x" and decisions["load-format"]["value"] == "instanttensor"
    assert decisions["VLLM_USE_FLASHINFER_SAMPLER"]["value"] == ""  # not among the variables this build reads
    assert "does not read VLLM_USE_FLASHINFER_SAMPLER" in decisions["VLLM_USE_FLASHINFER_SAMPLER"]["reason"]
