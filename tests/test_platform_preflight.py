"""The platform pre-flight (node/platform.py, cluster/platform_check.py) on fake per-node trees: what a node's procfs,
sysfs and /lib/modules say, the refusals (CmaTotal 0 kB, the driver's module not built for the running kernel) and
the warnings (the nodes differ), `dspark plan` exiting 2 over fake node agents, and what `status` reports as changed
since start. The same with start on two real nodes: tests/test_platform_testbed.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_launch.agent import protocol as p
from dspark_launch.agent.handlers.platform import platform_query
from dspark_launch.cluster import platform_check
from dspark_launch.cluster.spec import Node, cluster_spec
from dspark_launch.config.settings import resolve
from dspark_launch.node import platform
from dspark_launch.node.values import FabricPortFacts
from dspark_launch.node.vllm_offer import VllmOffer
from dspark_launch.report import SilentReporter
from tests.support.fake_nodes import healthy_answer
from tests.support.paths import DATA
from tests.support.platform_trees import DRIVER, KERNEL, spark_tree

HEAD_IP, WORKER_IP = "10.9.0.1", "10.9.0.2"
NEW_KERNEL = "7.0.0-1019-nvidia"


def facts(root: Path):
    return platform_query(p.PlatformQuery(str(root / "proc"), str(root / "sys"), str(root / "modules")))


def test_a_nodes_facts_come_from_its_own_procfs_sysfs_and_modules(tmp_path):
    found = facts(spark_tree(tmp_path, module_kernels=(KERNEL, "6.8.0-1010-nvidia")))
    assert (found.kernel, found.cma_total_kb, found.nvidia_driver, found.nvidia_loaded) == (KERNEL, 65536, DRIVER, True)
    assert found.nvidia_module_kernels == ("6.8.0-1010-nvidia", KERNEL)
    assert found.ports == (FabricPortFacts("rocep1s0f1", "1", "28.45.1020", "4: ACTIVE", "fab0", 9000, 200000),)
    assert found.memlock  # the agent's own limit
    assert platform.memory_pressure(platform.PlatformRoots.given(str(tmp_path / "proc"))) == platform.Pressure(0.0, 0.0)
    bare = facts(tmp_path / "nothing")  # a node without any of it: nothing to judge, nothing refused
    assert (bare.kernel, bare.cma_total_kb, bare.nvidia_driver, bare.ports) == ("", None, None, ())
    assert platform.judge({"head": bare}).refusals == ()


def test_cma_total_zero_and_a_module_not_built_for_the_kernel_are_refused_naming_node_value_and_report(tmp_path):
    cma = facts(spark_tree(tmp_path / "a", kernel=NEW_KERNEL, module_kernels=(NEW_KERNEL,), cma_kb=0))
    stale = facts(spark_tree(tmp_path / "b", kernel=NEW_KERNEL, module_kernels=(KERNEL,), loaded=False))
    verdict = platform.judge({"head (10.9.0.1)": cma, "worker1 (10.9.0.2)": stale})
    assert verdict.refusals[0] == (
        f"platform: head (10.9.0.1): CmaTotal 0 kB (kernel {NEW_KERNEL}): NCCL's memory registration for RDMA fails "
        "(ibv_reg_mr ENOMEM; eugr/spark-vllm-docker #389 and #392, MiaAI-Lab's DeepSeek-V4-Flash repository #259); "
        "update the board firmware (NVIDIA's fix for kernel 7.0.0-1019) or boot the kernel before it"
    )
    assert verdict.refusals[1] == (
        f"platform: worker1 (10.9.0.2): the NVIDIA driver's kernel module is NOT built for the running kernel "
        f"{NEW_KERNEL} (built for {KERNEL}): CUDA cannot reach the GPU; install the driver's modules for {NEW_KERNEL} "
        f"(DKMS, or the linux-modules-nvidia package of this kernel) or boot {KERNEL}"
    )
    assert len(verdict.refusals) == 2
    # A node without the NVIDIA driver (the CPU testbed's) is not judged on either.
    cpu = facts(spark_tree(tmp_path / "c", cma_kb=0, nvidia=False))
    assert platform.judge({"head": cpu}).refusals == ()


def test_what_differs_between_the_nodes_is_a_warning(tmp_path):
    head = facts(spark_tree(tmp_path / "head"))
    worker = facts(spark_tree(tmp_path / "worker", firmware="28.44.1036", ip=WORKER_IP))
    verdict = platform.judge({"head": head, "worker1": worker})
    assert verdict.refusals == ()
    assert verdict.warnings == (
        "platform: ConnectX firmware differs between the nodes: head 28.45.1020; worker1 28.44.1036",
    )


def test_status_names_what_changed_since_start(tmp_path):
    at_start = platform_check.recorded({"worker1": facts(spark_tree(tmp_path / "before"))})["worker1"]
    now = facts(spark_tree(tmp_path / "after", kernel=NEW_KERNEL, module_kernels=(NEW_KERNEL,), cma_kb=0))
    assert platform.drift(at_start, now) == [f"kernel {KERNEL} -> {NEW_KERNEL}", "CmaTotal 65536 kB -> 0 kB"]


class FakeNode:
    """A healthy node for `plan`, whose PlatformQuery is answered from its own fake tree."""

    def __init__(self, node: Node, trees: dict[str, Path], sent: list):
        self.node, self.trees, self.sent = node, trees, sent

    def call(self, request, step: str = "", timeout: float | None = None):
        self.sent.append((self.node.name, type(request).__name__))
        if isinstance(request, p.PlatformQuery):
            return facts(self.trees[self.node.name])
        if isinstance(request, p.MemoryQuery):
            return p.MemoryAnswer(128 << 30, 120 << 30, False)
        if isinstance(request, p.HotfixCheck):
            return p.HotfixCheckAnswer(
                self.node.name, p.HotfixResult("check", 0, "not-applied", "can apply", "0.32.0", 7)
            )
        answer = healthy_answer(self.node, request)
        if answer is None:
            raise AssertionError(f"{self.node.name}: unexpected {type(request).__name__}")
        return answer

    def describe_vllm(self, config_path: str = "") -> VllmOffer:
        return VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text())


@pytest.fixture
def env_file(monkeypatch, tmp_path: Path):
    trees = {
        "head": spark_tree(tmp_path / "head", cma_kb=0, kernel=NEW_KERNEL, module_kernels=(NEW_KERNEL,)),
        "worker1": spark_tree(tmp_path / "worker1", ip=WORKER_IP, firmware="28.44.1036"),
    }
    monkeypatch.setattr(Node, "agent", lambda node, reporter=None: FakeNode(node, trees, []))
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "hub").mkdir()
    path = tmp_path / "dspark.env"
    path.write_text(
        f"DSPARK_HEAD_IP={HEAD_IP}\nDSPARK_WORKER_HOSTS=root@{WORKER_IP}\nDSPARK_FABRIC_IFNAME=fab0\n"
        f"DSPARK_STATE_DIR={tmp_path / 'state'}\nDSPARK_MODEL_CACHE={tmp_path / 'hub'}\n"
        "DSPARK_ALLOW_TCP_FABRIC=1\n"
    )
    return path


def test_plan_exits_2_listing_the_refusal_and_the_warning(env_file):
    from typer.testing import CliRunner

    from dspark_launch.cli.main import app
    from dspark_launch.serve.preview import build_plan

    plan = build_plan(resolve(env_file=str(env_file), environ={}), SilentReporter())
    refused = [r for r in plan.refusals if r.startswith("platform: ")]
    assert len(refused) == 1 and refused[0].startswith(
        f"platform: head ({HEAD_IP}): CmaTotal 0 kB (kernel {NEW_KERNEL})"
    )
    assert plan.platform_refused and refused[0] in plan.warnings
    assert any(w.startswith("platform: ConnectX firmware differs between the nodes") for w in plan.warnings)
    shown = CliRunner().invoke(app, ["plan", "--env-file", str(env_file)])
    assert shown.exit_code == 2, shown.output
    assert "CmaTotal 0 kB" in shown.output


def test_start_refuses_before_anything_is_stopped_or_started(env_file):
    spec = cluster_spec(resolve(env_file=str(env_file), environ={}))
    with pytest.raises(platform_check.PlatformRefused) as caught:
        platform_check.preflight(spec, platform_check.node_platforms(spec), SilentReporter())
    assert caught.value.exit_code == 2 and str(caught.value).endswith(
        "start refuses this (exit 2), nothing was started"
    )
