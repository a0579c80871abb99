"""The dry boot: the default profile's plan per compute capability holds only values the installed vLLM 0.32's
own code accepts for DeepSeek-V4-Flash-0731 (the shipped config.json), asked on this CPU with the capability
patched in (node/vllm_dryboot.py)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from unittest import mock

import pytest

from dspark_launch.config.profile_resolve import resolve
from dspark_launch.config.settings import resolve as load_settings
from dspark_launch.errors import DsparkError
from dspark_launch.node.values import VersionRow
from dspark_launch.node.versions import differing_rows, modules_of, package_row
from dspark_launch.node.vllm_dryboot import SHIPPED_CONFIG
from dspark_launch.node.vllm_offer import VllmOffer, probe_installed_vllm
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from dspark_launch.profiles.gpu import UNKNOWN, gpu_target
from tests.support.dry_boot_plan import (
    STOCK,
    WITH_B12X,
    assert_gb10_boot_as_vllm_decides,
    line_of,
    plan_for,
    settings,
    value_of,
)


@pytest.fixture(scope="module")
def installed() -> VllmOffer:
    return probe_installed_vllm()


def test_the_dry_boot_runs_on_the_checkpoints_own_config(installed):
    config = json.loads(SHIPPED_CONFIG.read_text())
    assert config["expert_dtype"] == "fp4" and config["n_routed_experts"] == 256
    assert config["quantization_config"]["quant_method"] == "fp8" and "moe_quant_algo" not in config
    assert [b.capability for b in installed.boot_judgements] == ["9.0", "10.0", "10.3", "11.0", "12.0", "12.1"]
    assert_gb10_boot_as_vllm_decides(installed)


def test_gb10_stock_install_gets_an_moe_backend_the_mxfp4_oracle_accepts(installed):
    """Stock `pip install vllm` (FlashInfer, no b12x): the old fallback flashinfer_b12x died at model init; `auto`
    picks DeepGEMM where the build ships it (tests/test_dry_boot_newest.py), so marlin, with DeepGEMM off."""
    resolved = plan_for(installed, "12.1", STOCK)
    chosen = value_of(resolved.serve_args, "--moe-backend")
    assert chosen == "marlin" and dict(resolved.env)["VLLM_USE_DEEP_GEMM"] == "0"
    verdict = installed.boot("12.1").verdict("moe", chosen, "0")
    assert verdict.chosen and not verdict.refusal
    line = line_of(resolved, "moe-backend")
    assert "b12x needs the b12x package, not installed beside the vLLM 0.32.0" in line
    assert "MoE oracle for the checkpoint's experts (Mxfp4MoEMethod) selects MARLIN with VLLM_USE_DEEP_GEMM=0" in line
    assert "--linear-backend" not in resolved.serve_args
    assert "flashinfer_b12x" not in " ".join(resolved.serve_args)


def test_gb10_with_the_b12x_extra_gets_b12x(installed):
    resolved = plan_for(installed, "12.1", WITH_B12X)
    assert value_of(resolved.serve_args, "--moe-backend") == "b12x"
    assert value_of(resolved.serve_args, "--linear-backend") == "b12x"
    assert "selects B12X_MXFP4_MXFP8" in line_of(resolved, "moe-backend")
    assert "selects B12xFp8BlockScaledMMKernel" in line_of(resolved, "linear-backend")


@pytest.mark.parametrize("capability", ["9.0", "10.0", "12.1"])
def test_every_judged_value_is_one_vllm_accepts_on_that_capability(installed, capability):
    resolved = plan_for(installed, capability, WITH_B12X)
    boot, kv = installed.boot(capability), installed.judgement(capability)
    for flag, kind in (("--moe-backend", "moe"), ("--linear-backend", "linear")):
        value = value_of(resolved.serve_args, flag)
        if value is not None:
            assert not boot.verdict(kind, value).refusal, (capability, flag, value)
    assert not kv.verdict(value_of(resolved.serve_args, "--kv-cache-dtype")).refusal
    if capability != "12.1":
        assert "--moe-backend" not in resolved.serve_args and "--linear-backend" not in resolved.serve_args


def test_the_effective_cuda_graph_mode_is_vllms_resolution(installed):
    """VLLM_USE_BREAKABLE_CUDAGRAPH=0 (the recipes'): the NVIDIA DeepSeek-V4 model is not compiled, so vLLM runs
    FULL_DECODE_ONLY, not the FULL_AND_PIECEWISE the flag asks for; unset, 0.32 turns breakable graphs on."""
    from vllm.config.compilation import CompilationConfig, CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    resolved = plan_for(installed, "12.1", WITH_B12X)
    assert dict(resolved.env)["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    assert resolved.cuda_graph_mode == "FULL_DECODE_ONLY"
    line = line_of(resolved, "cuda-graphs (effective)")
    assert line.startswith(
        "cuda-graphs (effective) FULL_DECODE_ONLY: FULL_AND_PIECEWISE requested, "
        "VLLM_USE_BREAKABLE_CUDAGRAPH=0: on 12.1 breakable CUDA graphs off"
    )
    # The same call vLLM's model runner makes, here by hand: no piecewise capture -> FULL_DECODE_ONLY.
    by_hand = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE).resolve_cudagraph_mode_and_sizes(
        AttentionCGSupport.ALWAYS, "x", 6, use_v2_model_runner=True, piecewise_capture_available=False
    )
    assert by_hand.name == resolved.cuda_graph_mode
    unset = plan_for(installed, "12.1", WITH_B12X, {"DSPARK_PROFILE_ENV": "VLLM_USE_BREAKABLE_CUDAGRAPH="})
    assert unset.cuda_graph_mode == "FULL_AND_PIECEWISE"
    assert "VllmConfig turns them on for DeepseekV4ForCausalLM" in line_of(unset, "cuda-graphs (effective)")


def test_no_capability_never_emits_a_value_refused_everywhere(installed):
    """CPU-only nodes (or a plan with nothing reported): nvfp4_ds_mla and flashinfer_b12x are refused on every
    capability the build was asked for, so they are not emitted even unjudged."""
    resolved = resolve(DEEPSEEK_V4_FLASH, dataclasses.replace(installed, modules=WITH_B12X), settings(), UNKNOWN)
    assert value_of(resolved.serve_args, "--kv-cache-dtype") == "fp8"
    assert "nvfp4_ds_mla refused by the installed vLLM 0.32.0 on every capability it was asked for" in line_of(
        resolved, "kv-cache-dtype"
    )
    for judgement in installed.kv_judgements:
        assert judgement.verdict("nvfp4_ds_mla").refusal  # what makes it "everywhere"


def test_a_node_with_a_driver_but_no_capability_is_a_refusal_naming_it(installed):
    blind = gpu_target({"head": "12.1", "worker1": None}, {"head": "580.95.05", "worker1": "580.95.05"})
    with pytest.raises(DsparkError) as caught:
        resolve(DEEPSEEK_V4_FLASH, installed, settings(), blind)
    assert str(caught.value).startswith(
        "worker1 (driver 580.95.05): an NVIDIA driver but no GPU compute capability "
        "reported (nvidia-smi missing or failing"
    )
    # No driver at all (the CPU testbed): not a refusal.
    assert not gpu_target({"head": None}, {"head": None}).refusal


def test_a_worker_without_b12x_while_the_head_has_it_is_decided_for_the_cluster(installed):
    head, worker = (
        VersionRow(packages="b12x 0.4.1; flashinfer-python 0.6.2"),
        VersionRow(packages="b12x absent; flashinfer-python 0.6.2"),
    )
    assert modules_of(head.packages) == ("b12x", "flashinfer") and modules_of(worker.packages) == ("flashinfer",)
    # start: the version matrix compares the packages row, so start refuses before Ray starts ...
    assert differing_rows({"head": head, "worker1": worker}) == ["packages"]
    # ... and resolution (plan) drops b12x for the whole cluster, the head's own install notwithstanding.
    cluster = gpu_target(
        {"head": "12.1", "worker1": "12.1"},
        packages={"head": modules_of(head.packages), "worker1": modules_of(worker.packages)},
    )
    resolved = resolve(DEEPSEEK_V4_FLASH, dataclasses.replace(installed, modules=WITH_B12X), settings(), cluster)
    assert value_of(resolved.serve_args, "--moe-backend") == "marlin"
    assert "b12x needs the b12x package on every node, not installed on worker1 (decided for the cluster)" in (
        line_of(resolved, "moe-backend")
    )
    assert "--linear-backend" not in resolved.serve_args


def test_the_package_row_names_every_optional_package():
    row = package_row()
    assert [part.split(" ")[0] for part in row.split("; ")] == [
        "b12x",
        "flashinfer-python",
        "instanttensor",
        "fastsafetensors",
        "nvidia-cutlass-dsl",
        "deep-gemm",
    ]


def test_gpu_nodes_need_nvcc_and_in_host_mode_a_memlock_limit_rdma_can_use():
    from dspark_launch.node.versions import COMPARED_ROWS, gpu_node_problems, memlock_limit

    ready = VersionRow(compute_capability="12.1", nvcc="13.0", memlock="unlimited")
    no_nvcc = dataclasses.replace(ready, nvcc=None)
    low = dataclasses.replace(ready, memlock=str(8 << 20))
    assert gpu_node_problems({"head": ready, "worker1": ready}, host_mode=True) == []
    problems = gpu_node_problems({"head": ready, "worker1": no_nvcc}, host_mode=True)
    assert problems == [
        "worker1: no nvcc (CUDA_HOME/bin, /usr/local/cuda/bin, PATH): DeepSeek-V4's attention "
        "JIT-compiles DeepGEMM kernels with it; install the CUDA toolkit on every node"
    ]
    assert gpu_node_problems({"head": low}, host_mode=True)[0].startswith("head: locked-memory limit 8192 KiB")
    assert gpu_node_problems({"head": low}, host_mode=False) == []  # a container's own limit (--ulimit) applies
    cpu = VersionRow(nvcc=None, memlock=str(8 << 20))  # the CPU testbed: no capability, not asked
    assert gpu_node_problems({"head": cpu}, host_mode=True) == []
    assert "memlock" not in COMPARED_ROWS and "nvcc" in COMPARED_ROWS and "packages" in COMPARED_ROWS
    assert memlock_limit() == "unlimited" or int(memlock_limit()) >= 0


def test_a_pulled_models_own_config_json_is_what_the_dry_boot_judges(tmp_path):
    """A checkpoint whose config says NVFP4 experts (MiaAI's patched build): vLLM's DeepSeek-V4 quant config routes
    them to the NVFP4 method, not the MXFP4 oracle; the pulled bytes decide, not the shipped copy."""
    from dspark_launch.agent.offer_cache import install_identity
    from dspark_launch.model.onnodes import pulled_config
    from dspark_launch.node.vllm_dryboot import dry_boot

    config = json.loads(SHIPPED_CONFIG.read_text())
    config["quantization_config"]["moe_quant_algo"] = "NVFP4"
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert pulled_config(str(tmp_path)) == str(tmp_path / "config.json") and pulled_config(None) == ""
    boots, booted_by = dry_boot(("12.1",), pulled_config(str(tmp_path)))
    assert boots[0].moe_method != "Mxfp4MoEMethod" and "the pulled model's config.json" in booted_by
    shipped, pulled_identity = install_identity(), install_identity(str(tmp_path / "config.json"))
    assert shipped is not None and pulled_identity is not None and shipped != pulled_identity  # kept apart


def test_another_models_config_gets_no_dry_boot_and_resolution_says_not_judged(tmp_path):
    from dspark_launch.node.vllm_dryboot import dry_boot

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    boots, why = dry_boot(("12.1",), str(tmp_path / "config.json"))
    assert boots == () and why.startswith("no dry boot: the pulled model's config.json") and "'llama'" in why


def test_a_decision_the_dry_boot_cannot_judge_is_a_named_refusal_in_plan(installed, monkeypatch, tmp_path):
    """vLLM's code failing under the dry boot (a TypeError patched into the MoE oracle's call; a
    resolve_cudagraph_mode_and_sizes without the keyword the graph judgement needs, as a release could ship) is
    recorded for that decision, never swallowed: the plan for 12.1 leaves the flag out and refuses, one line naming
    the decision and the vLLM version, `dspark plan` exits 1 on it and start refuses it."""
    from typer.testing import CliRunner
    from vllm.config.compilation import CompilationConfig, CUDAGraphMode

    from dspark_launch.agent import protocol as p
    from dspark_launch.cli.main import app
    from dspark_launch.cluster.spec import Node
    from dspark_launch.node import vllm_dryboot
    from dspark_launch.profiles.gpu import given_target
    from dspark_launch.report import SilentReporter
    from dspark_launch.serve.preview import build_plan
    from tests.support.fake_nodes import healthy_answer

    def without_piecewise(self, min_cg_support, min_cg_attn_backend, uniform_decode_query_len=1):
        return CUDAGraphMode.FULL_AND_PIECEWISE

    without_piecewise.__qualname__ = "CompilationConfig.resolve_cudagraph_mode_and_sizes"
    moved = TypeError("FusedMoEConfig.__init__() got an unexpected keyword argument 'moe_backend'")
    with (
        mock.patch.object(vllm_dryboot, "_moe_verdicts", side_effect=moved),
        mock.patch.object(CompilationConfig, "resolve_cudagraph_mode_and_sizes", without_piecewise),
    ):
        boots, booted_by = vllm_dryboot.dry_boot(("12.1",))
    assert boots[0].unjudged == (
        ("moe", f"TypeError: {moved}"),
        (
            "graphs",
            "Unjudgeable: CompilationConfig.resolve_cudagraph_mode_and_sizes takes no "
            "piecewise_capture_available in this vLLM",
        ),
    )
    assert boots[0].linear and boots[0].attention  # the other decisions are still vLLM's answers
    assert "not judged: graphs, moe" in booted_by
    offer = dataclasses.replace(installed, boot_judgements=boots)
    resolved = plan_for(offer, "12.1", WITH_B12X)
    assert "--moe-backend" not in resolved.serve_args and resolved.cuda_graph_mode == ""
    assert value_of(resolved.serve_args, "--linear-backend") == "b12x"
    assert resolved.unjudged == (
        f"moe-backend: not judged for 12.1 by the installed vLLM 0.32.0: TypeError: {moved}; start refuses a "
        "decision its dry boot could not judge (choose it yourself in VLLM_EXTRA_ARGS, --moe-backend ..., or run a "
        "vLLM the dry boot can ask)",
        "cuda-graphs: not judged for 12.1 by the installed vLLM 0.32.0: Unjudgeable: "
        "CompilationConfig.resolve_cudagraph_mode_and_sizes takes no piecewise_capture_available in this vLLM; start "
        "refuses a decision its dry boot could not judge (choose it yourself in VLLM_EXTRA_ARGS, or run a vLLM the "
        "dry boot can ask)",
    )
    assert line_of(resolved, "moe-backend").startswith(
        "moe-backend omitted: b12x not judged for 12.1 by the installed vLLM 0.32.0 (TypeError: "
    )
    assert "judged:" not in line_of(resolved, "VLLM_USE_BREAKABLE_CUDAGRAPH")  # no mode stated unjudged
    # The operator's own value is not the dry boot's to judge: no refusal.
    chosen = plan_for(offer, "12.1", WITH_B12X, {"VLLM_EXTRA_ARGS": "--moe-backend marlin"})
    assert [r.split(":")[0] for r in chosen.unjudged] == ["cuda-graphs"]

    # `dspark plan --gpu 12.1`, its nodes' agents faked (healthy, b12x installed), the head's offer this one.
    class Agent:
        def __init__(self, node):
            self.node = node

        def call(self, request, step="", timeout=None):
            if isinstance(request, p.MemoryQuery):
                return p.MemoryAnswer(128 << 30, 120 << 30, False)
            if isinstance(request, p.HotfixCheck):
                return p.HotfixCheckAnswer(
                    self.node.name, p.HotfixResult("check", 0, "not-applied", "can apply", "0.32.0", 7)
                )
            if isinstance(request, p.VersionQuery):
                return dataclasses.replace(
                    healthy_answer(self.node, request), packages=package_line, compute_capability=capability
                )
            return healthy_answer(self.node, request)

        def describe_vllm(self, config_path=""):
            return offer

    capability = None  # plan: --gpu gives it; start: the nodes report it
    package_line = "b12x 0.4.1; flashinfer-python 0.6.2; instanttensor 0.1; fastsafetensors 0.1; nvidia-cutlass-dsl 4.4"
    monkeypatch.setattr(Node, "agent", lambda node, reporter=None: Agent(node))
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "hub").mkdir()
    env_file = tmp_path / "dspark.env"
    env_file.write_text(
        f"DSPARK_HEAD_IP=10.9.0.1\nDSPARK_WORKER_HOSTS=root@10.9.0.2\nDSPARK_FABRIC_IFNAME=fab0\n"
        f"DSPARK_STATE_DIR={tmp_path / 'state'}\nDSPARK_MODEL_CACHE={tmp_path / 'hub'}\n"
    )
    given = load_settings(env_file=str(env_file), environ={})
    plan = build_plan(given, SilentReporter(), given_target("12.1"))
    assert plan.refusals == resolved.unjudged and plan.start_would_refuse  # the only reasons start would refuse
    result = CliRunner().invoke(app, ["plan", "--gpu", "12.1", "--env-file", str(env_file)])
    assert result.exit_code == 1, result.output
    assert "moe-backend: not judged for 12.1 by the installed vLLM 0.32.0: TypeError" in " ".join(result.output.split())
    # start, its nodes reporting 12.1: refused before anything starts, on the same line.
    from dspark_launch.cluster.spec import cluster_spec
    from dspark_launch.serve.start import resolved_serve_spec

    capability = "12.1"
    model = SimpleNamespace(location=SimpleNamespace(folder=None), revision="", env=())
    with pytest.raises(DsparkError) as refused:
        resolved_serve_spec(given, cluster_spec(given), SilentReporter(), {}, model)
    assert str(refused.value) == resolved.unjudged[0]
