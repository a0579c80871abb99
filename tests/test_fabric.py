"""Each node's fabric environment from (fake) sysfs trees, and vLLM 0.32's driver-to-worker variable copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_launch.config.node_fabric import fabric_request
from dspark_launch.config.settings import resolve as load_settings
from dspark_launch.errors import ConfigError
from dspark_launch.node.fabric import (
    FIXED_ENV,
    NON_CARRY_OVER,
    FabricError,
    FabricRequest,
    fabric_env,
    write_non_carry_over,
)
from tests.support.paths import REPO
from tests.support.sysfs import DOWN, V1, V2, add_port, ipv4_gid

LINK_LOCAL = "fe80:0000:0000:0000:0a20:e7ff:fe96:0708"


@pytest.fixture
def head_tree(tmp_path: Path) -> Path:
    """A DGX Spark as peers describe it: rocep* names, the twin in PCI domain 0002, the GID at index 3."""
    root = tmp_path / "head-sys"
    add_port(root, "0000:01:00.0", "enp1s0f0np0", "rocep1s0f0", {0: (LINK_LOCAL, V1), 1: (LINK_LOCAL, V2)})
    add_port(
        root,
        "0000:01:00.1",
        "enp1s0f1np1",
        "rocep1s0f1",
        {0: (LINK_LOCAL, V1), 1: (LINK_LOCAL, V2), 2: (ipv4_gid("10.213.0.1"), V1), 3: (ipv4_gid("10.213.0.1"), V2)},
    )
    add_port(
        root,
        "0002:01:00.1",
        "enP2p1s0f1np1",
        "roceP2p1s0f1",
        {0: (LINK_LOCAL, V1), 1: (LINK_LOCAL, V2), 2: (ipv4_gid("10.214.0.1"), V1), 3: (ipv4_gid("10.214.0.1"), V2)},
    )
    add_port(root, "0000:00:1f.6", "eno1", None, {})
    return root


@pytest.fixture
def worker_tree(tmp_path: Path) -> Path:
    """Another naming (mlx5_*), a GID table with a hole (the RoCE v2 IPv4 GID at 5), a twin without it there."""
    root = tmp_path / "worker-sys"
    add_port(
        root,
        "0000:01:00.1",
        "enp1s0f1np1",
        "mlx5_1",
        {0: (LINK_LOCAL, V1), 1: (LINK_LOCAL, V2), 4: (ipv4_gid("10.213.0.2"), V1), 5: (ipv4_gid("10.213.0.2"), V2)},
    )
    add_port(root, "0002:01:00.1", "enP2p1s0f1np1", "mlx5_3", {0: (LINK_LOCAL, V1), 1: (LINK_LOCAL, V2)})
    return root


def request(node: str, ip: str, **kw) -> FabricRequest:
    return FabricRequest(node=node, ifname=kw.pop("ifname", "enp1s0f1np1"), fabric_ip=ip, **kw)


def test_head_finds_its_device_its_twin_and_its_gid_index(head_tree):
    found = fabric_env(request("head", "10.213.0.1"), head_tree)
    env = dict(found.env)
    assert found.roce and found.hcas == ("rocep1s0f1", "roceP2p1s0f1") and found.warnings == ()
    assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and env["NCCL_IB_GID_INDEX"] == "3"
    assert env["NCCL_NET"] == "IB" and env["NCCL_IB_DISABLE"] == "0" and env["NCCL_IB_ROCE_VERSION_NUM"] == "2"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert set(FIXED_ENV) <= set(found.env)


def test_worker_tree_gives_its_own_names_and_index(worker_tree):
    found = fabric_env(request("worker1", "10.213.0.2"), worker_tree)
    assert dict(found.env)["NCCL_IB_HCA"] == "mlx5_1" and found.gid_index == "5"
    assert found.warnings == (
        "worker1: twin port mlx5_3 left out of NCCL_IB_HCA: no RoCE v2 GID of its own IPv4 "
        "address at index 5 (enP2p1s0f1np1 carries no IPv4 address of its own)",
    )


def test_the_gid_index_differs_per_node_and_each_node_finds_its_own(head_tree, worker_tree):
    head = fabric_env(request("head", "10.213.0.1"), head_tree)
    worker = fabric_env(request("worker1", "10.213.0.2"), worker_tree)
    assert (dict(head.env)["NCCL_IB_GID_INDEX"], dict(worker.env)["NCCL_IB_GID_INDEX"]) == ("3", "5")


def spark(tmp_path: Path, **twin) -> Path:
    """The head's primary port (GID of 10.213.0.1 at 3) and a twin port built from `twin` (add_port's arguments)."""
    root = tmp_path / "sys"
    add_port(
        root,
        "0000:01:00.1",
        "enp1s0f1np1",
        "rocep1s0f1",
        {0: (LINK_LOCAL, V1), 1: (LINK_LOCAL, V2), 2: (ipv4_gid("10.213.0.1"), V1), 3: (ipv4_gid("10.213.0.1"), V2)},
    )
    add_port(
        root,
        "0002:01:00.1",
        "enP2p1s0f1np1",
        "roceP2p1s0f1",
        **{
            "gids": {
                0: (LINK_LOCAL, V1),
                1: (LINK_LOCAL, V2),
                2: (ipv4_gid("10.214.0.1"), V1),
                3: (ipv4_gid("10.214.0.1"), V2),
            },
            **twin,
        },
    )
    return root


def test_a_twin_whose_gid_is_another_netdevs_address_is_left_out(tmp_path):
    # The GID at index 3 carries the primary's own IP, from the primary's netdev (gid_attrs/ndevs): not the twin's.
    root = spark(tmp_path, gids={3: (ipv4_gid("10.213.0.1"), V2)}, ndevs={3: "enp1s0f1np1"})
    found = fabric_env(request("head", "10.213.0.1"), root)
    assert found.hcas == ("rocep1s0f1",)
    assert found.warnings == (
        "head: twin port roceP2p1s0f1 left out of NCCL_IB_HCA: no RoCE v2 GID of its own IPv4 "
        "address at index 3 (enP2p1s0f1np1 carries no IPv4 address of its own)",
    )


def test_link_local_addresses_are_no_address_of_its_own(tmp_path):
    root = spark(tmp_path, gids={0: (LINK_LOCAL, V1), 1: (LINK_LOCAL, V2), 3: (ipv4_gid("169.254.7.9"), V2)})
    found = fabric_env(request("head", "10.213.0.1"), root)
    assert found.hcas == ("rocep1s0f1",) and "carries no IPv4 address of its own" in found.warnings[0]


def test_a_twin_with_its_own_address_at_another_index_is_left_out(tmp_path):
    root = spark(tmp_path, gids={0: (LINK_LOCAL, V1), 4: (ipv4_gid("10.214.0.1"), V2)})
    found = fabric_env(request("head", "10.213.0.1"), root)
    assert found.hcas == ("rocep1s0f1",) and found.warnings[0].endswith("at index 3 (its own at 4)")


def test_a_down_twin_is_left_out_and_a_down_primary_means_no_roce(tmp_path):
    found = fabric_env(request("head", "10.213.0.1"), spark(tmp_path / "a", state=DOWN))
    assert found.roce and found.hcas == ("rocep1s0f1",)
    assert found.warnings == (
        "head: twin port roceP2p1s0f1 left out of NCCL_IB_HCA: roceP2p1s0f1 port 1 "
        "(enP2p1s0f1np1) is not ACTIVE (state 1: DOWN)",
    )
    root = tmp_path / "b"
    add_port(root, "0000:01:00.1", "enp1s0f1np1", "rocep1s0f1", {3: (ipv4_gid("10.213.0.1"), V2)}, state=DOWN)
    down = fabric_env(request("head", "10.213.0.1"), root)
    assert not down.roce and "NCCL_IB_HCA" not in dict(down.env)
    assert down.missing == "enp1s0f1np1: rocep1s0f1 port 1 (enp1s0f1np1) is not ACTIVE (state 1: DOWN)"


def test_an_infiniband_link_layer_is_no_roce(tmp_path):
    root = tmp_path / "ib"
    add_port(
        root, "0000:01:00.1", "enp1s0f1np1", "rocep1s0f1", {3: (ipv4_gid("10.213.0.1"), V2)}, link_layer="InfiniBand"
    )
    found = fabric_env(request("head", "10.213.0.1"), root)
    assert not found.roce and "has link layer InfiniBand, not Ethernet" in found.missing


def test_an_mtu_below_9000_on_a_fabric_member_is_a_warning(tmp_path):
    found = fabric_env(request("head", "10.213.0.1"), spark(tmp_path, mtu=1500))
    assert found.roce and found.hcas == ("rocep1s0f1", "roceP2p1s0f1")
    assert found.warnings == (
        "head: MTU 1500 on fabric member enP2p1s0f1np1, below 9000: RoCE runs with smaller "
        "frames (set mtu 9000 on enP2p1s0f1np1 on every node)",
    )


def test_nccls_exact_form_checks_every_listed_device(head_tree):
    found = fabric_env(request("head", "10.213.0.1", hca_list="=rocep1s0f1,roceP2p1s0f1"), head_tree)
    assert dict(found.env)["NCCL_IB_HCA"] == "=rocep1s0f1,roceP2p1s0f1"  # as written: NCCL reads the form
    assert found.hcas == ("rocep1s0f1", "roceP2p1s0f1") and found.gid_index == "3"
    with pytest.raises(FabricError) as caught:  # the second device has no IPv4 GID of its own: checked too
        fabric_env(request("head", "10.213.0.1", hca_list="=rocep1s0f1,rocep1s0f0"), head_tree)
    assert caught.value.args[0].startswith(
        "head: rocep1s0f0 port 1 (enp1s0f0np0) has no RoCE v2 GID of its own "
        "IPv4 address at index 3 (its own RoCE v2 IPv4 GIDs: none)"
    )


def test_the_env_files_double_equals_form_is_nccls_exact_match(tmp_path):
    env = tmp_path / "e.env"
    env.write_text("NCCL_IB_HCA==rocep1s0f1,roceP2p1s0f1\n")  # MiaAI-Lab's recommended line
    settings = load_settings(env_file=str(env), environ={})
    assert settings.nccl_ib_hca == "=rocep1s0f1,roceP2p1s0f1"
    assert fabric_request(settings, "head", "10.213.0.1").hca_list == "=rocep1s0f1,roceP2p1s0f1"
    per_node = load_settings(
        env_file=str(env),
        environ={"DSPARK_NODE_FABRIC": "worker1:NCCL_IB_HCA==rocep1s0f0,roceP2p1s0f0 worker1:NCCL_IB_GID_INDEX=3"},
    )
    assert fabric_request(per_node, "worker1", "10.213.0.2").hca_list == "=rocep1s0f0,roceP2p1s0f0"
    with pytest.raises(ConfigError, match="DSPARK_NODE_FABRIC="):
        load_settings(env_file=str(env), environ={"DSPARK_NODE_FABRIC": "worker1:NCCL_IB_HCA==a,,b"})


def test_nccls_exclude_form_checks_the_devices_left(head_tree):
    found = fabric_env(request("head", "10.213.0.1", hca_list="^rocep1s0f0"), head_tree)
    assert found.hcas == ("roceP2p1s0f1", "rocep1s0f1") and dict(found.env)["NCCL_IB_HCA"] == "^rocep1s0f0"
    with pytest.raises(ConfigError, match="excludes every RDMA device there"):
        fabric_env(request("head", "10.213.0.1", hca_list="^roce"), head_tree)


def test_a_prefix_selects_every_matching_device_and_each_is_checked(head_tree):
    with pytest.raises(FabricError, match="rocep1s0f0 port 1"):  # `roce` matches all three, one without an IPv4 GID
        fabric_env(request("head", "10.213.0.1", hca_list="roce"), head_tree)


def test_nccls_device_port_form(head_tree):
    found = fabric_env(request("head", "10.213.0.1", hca_list="=rocep1s0f1:1"), head_tree)
    assert found.hcas == ("rocep1s0f1",) and dict(found.env)["NCCL_IB_HCA"] == "=rocep1s0f1:1"
    with pytest.raises(ConfigError) as caught:
        fabric_env(request("head", "10.213.0.1", hca_list="rocep1s0f1:2"), head_tree)
    assert str(caught.value) == "NCCL_IB_HCA=rocep1s0f1:2 for head: rocep1s0f1 has no port 2; allowed: 1"


def test_an_operator_listed_down_port_is_a_config_error(tmp_path):
    root = spark(tmp_path, state=DOWN)
    with pytest.raises(ConfigError) as caught:
        fabric_env(request("head", "10.213.0.1", hca_list="=rocep1s0f1,roceP2p1s0f1"), root)
    assert str(caught.value) == (
        "NCCL_IB_HCA==rocep1s0f1,roceP2p1s0f1 for head: roceP2p1s0f1 port 1 (enP2p1s0f1np1) "
        "is not ACTIVE (state 1: DOWN); allowed: ACTIVE Ethernet (RoCE) ports only"
    )


@pytest.mark.parametrize("value", ["=", "^", "a,,b", "a:x", "a b", "=^a"])
def test_malformed_hca_lists_are_config_errors(value):
    with pytest.raises(ConfigError, match=r"^NCCL_IB_HCA=.* from environment is not allowed; allowed: .*NCCL's form"):
        load_settings(env_file=str(REPO / ".env.dspark.example"), environ={"NCCL_IB_HCA": value})


def test_no_gid_for_the_fabric_ip_fails_closed_in_one_line(head_tree):
    with pytest.raises(FabricError) as caught:
        fabric_env(request("head", "10.213.0.9"), head_tree)
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 1
    assert message.startswith("head: no RoCE v2 GID carries the fabric IP 10.213.0.9 on rocep1s0f1")


def test_an_operator_hca_without_the_gid_fails_closed_too(head_tree):
    with pytest.raises(FabricError, match="on rocep1s0f0"):
        fabric_env(request("head", "10.213.0.1", hca_list="rocep1s0f0"), head_tree)


def test_an_operator_hca_that_does_not_exist_is_a_config_error(head_tree):
    with pytest.raises(ConfigError) as caught:
        fabric_env(request("head", "10.213.0.1", hca_list="mlx5_0"), head_tree)
    assert (
        "NCCL_IB_HCA=mlx5_0 for head: mlx5_0 is no RDMA device there; allowed: roceP2p1s0f1, rocep1s0f0, "
        "rocep1s0f1" == str(caught.value)
    )


def test_operator_values_are_used_as_given(head_tree):
    found = fabric_env(
        request(
            "head", "10.213.0.1", hca_list="rocep1s0f1", gid_index="3", socket_ifnames=(("GLOO_SOCKET_IFNAME", "eno1"),)
        ),
        head_tree,
    )
    env = dict(found.env)
    assert env["NCCL_IB_HCA"] == "rocep1s0f1" and env["NCCL_IB_GID_INDEX"] == "3"
    assert env["GLOO_SOCKET_IFNAME"] == "eno1" and env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"


def test_an_operator_gid_index_at_a_roce_v1_gid_fails_closed(head_tree):
    with pytest.raises(FabricError, match="has no RoCE v2 GID of the fabric IP 10.213.0.1 at index 2"):
        fabric_env(request("head", "10.213.0.1", hca_list="rocep1s0f1", gid_index="2"), head_tree)


def test_no_roce_device_says_what_is_missing_and_that_nccl_falls_back_to_tcp(head_tree):
    found = fabric_env(request("head", "10.213.0.1", ifname="eno1"), head_tree)
    env = dict(found.env)
    assert not found.roce and "NCCL_NET" not in env and "NCCL_IB_HCA" not in env
    assert env["NCCL_IB_DISABLE"] == "1"  # sockets straight away, no probe of IB devices
    assert found.missing == "no RDMA device behind eno1"
    assert found.warnings == (
        "head: no RDMA device behind eno1: NCCL falls back to TCP sockets (hazyumps measured "
        "~12 against 30+ tok/s); see docs/cluster.md",
    )


def test_per_node_settings_override_the_cluster_wide_ones():
    settings = load_settings(
        env_file=str(REPO / ".env.dspark.example"),
        environ={
            "NCCL_IB_HCA": "rocep1s0f1",
            "DSPARK_NODE_FABRIC": "worker1:NCCL_IB_HCA=mlx5_1,mlx5_3 worker1:NCCL_IB_GID_INDEX=5 worker1:DSPARK_FABRIC_IFNAME=enp1s0f0np0",
        },
    )
    head, worker = fabric_request(settings, "head", "10.213.0.1"), fabric_request(settings, "worker1", "10.213.0.2")
    assert (head.hca_list, head.gid_index, head.ifname) == ("rocep1s0f1", "", "enp1s0f1np1")
    assert (worker.hca_list, worker.gid_index, worker.ifname) == ("mlx5_1,mlx5_3", "5", "enp1s0f0np0")


@pytest.mark.parametrize(
    "value",
    ["worker1:NCCL_IB_GID_INDEX=x", "node7:NCCL_IB_HCA=a", "worker1:NCCL_DEBUG=INFO", "worker1:NCCL_IB_HCA=a;b"],
)
def test_bad_per_node_values_are_config_errors(value):
    with pytest.raises(ConfigError, match=r"^DSPARK_NODE_FABRIC=.* from environment is not allowed; allowed: "):
        load_settings(env_file=str(REPO / ".env.dspark.example"), environ={"DSPARK_NODE_FABRIC": value})


_COPY_PROBE = r"""
import json, os
from vllm.ray.ray_env import get_env_vars_to_copy
from vllm.v1.executor.ray_env_utils import get_driver_env_vars
from vllm.v1.executor.ray_utils import WORKER_SPECIFIC_ENV_VARS
legacy = {n: os.environ[n] for n in get_env_vars_to_copy(exclude_vars=WORKER_SPECIFIC_ENV_VARS) if n in os.environ}
v2 = get_driver_env_vars(worker_specific_vars=WORKER_SPECIFIC_ENV_VARS)
print("COPIED " + json.dumps({"legacy": legacy, "v2": v2}))
"""


def copied_by_vllm(config_root: Path) -> dict[str, dict[str, str]]:
    """What the installed vLLM's own helpers copy from a head driver's environment to its Ray workers."""
    head_env = {
        "PATH": os.environ["PATH"],
        "HOME": str(config_root),
        "VLLM_CONFIG_ROOT": str(config_root),
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_NET": "IB",
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "NCCL_DEBUG": "WARN",
        "VLLM_HOST_IP": "10.213.0.1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _COPY_PROBE], env=head_env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("COPIED "))[7:])


def test_vllm_copies_the_heads_nccl_values_unless_named_in_its_non_carry_over_file(tmp_path):
    without = copied_by_vllm(tmp_path / "plain")
    for path in ("legacy", "v2"):  # RayDistributedExecutor and RayExecutorV2 (the 0.32 default)
        assert {"NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME"} <= set(without[path])
        assert "VLLM_HOST_IP" not in without[path]  # vLLM's own per-worker exclusion
    written = write_non_carry_over(tmp_path / "dspark")
    assert json.loads(written.read_text()) == sorted(NON_CARRY_OVER)
    excluded = copied_by_vllm(tmp_path / "dspark")
    for path in ("legacy", "v2"):
        assert not set(NON_CARRY_OVER) & set(excluded[path]), path
        assert "NCCL_DEBUG" in excluded[path]  # the same for every node: still copied


# What a worker does with the driver's variables, by vLLM's own code: RayExecutorV2's
# RayWorkerProc.initialize_worker (setdefault), the legacy executor's update_environment_variables (overwrite).
_APPLY_PROBE = r"""
import json, os, sys
from vllm.v1.executor.ray_executor_v2 import RayWorkerProc
from vllm.utils.system_utils import update_environment_variables
copied = json.loads(sys.stdin.read())
names = ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_NET", "NCCL_DEBUG", "VLLM_CONFIG_ROOT")
own = dict(os.environ)
worker = object.__new__(RayWorkerProc)
worker._init_kwargs = {}
try:
    RayWorkerProc.initialize_worker(worker, 0, {}, "tcp://127.0.0.1:1", driver_env_vars=copied["v2"])
except Exception:
    pass  # it fails building the real worker, after it applied the variables
v2 = {n: os.environ.get(n) for n in names}
os.environ.clear(); os.environ.update(own)
update_environment_variables(copied["legacy"])
print("SEEN " + json.dumps({"v2": v2, "legacy": {n: os.environ.get(n) for n in names}}))
"""


def seen_by_worker(copied: dict[str, dict[str, str]]) -> dict[str, dict[str, str | None]]:
    """A worker node's process (its raylet gave it its own RoCE values, and no NCCL_NET) after vLLM's copy."""
    worker_env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "NCCL_IB_HCA": "mlx5_1",
        "NCCL_IB_GID_INDEX": "5",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _APPLY_PROBE],
        env=worker_env,
        input=json.dumps(copied),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("SEEN "))[5:])


def test_with_the_file_each_worker_keeps_its_own_values_in_both_executors(tmp_path):
    write_non_carry_over(tmp_path / "dspark")
    seen = seen_by_worker(copied_by_vllm(tmp_path / "dspark"))
    for path in ("v2", "legacy"):
        assert seen[path] == {
            "NCCL_IB_HCA": "mlx5_1",
            "NCCL_IB_GID_INDEX": "5",
            "NCCL_NET": None,
            "NCCL_DEBUG": "WARN",
            "VLLM_CONFIG_ROOT": None,
        }, path


def test_without_it_the_heads_values_leak_into_the_worker(tmp_path):
    seen = seen_by_worker(copied_by_vllm(tmp_path / "plain"))
    assert seen["v2"]["NCCL_IB_HCA"] == "mlx5_1" and seen["v2"]["NCCL_NET"] == "IB"  # setdefault: fills gaps
    assert seen["legacy"]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"  # overwrite: the head's device
    assert seen["legacy"]["NCCL_IB_GID_INDEX"] == "3"


def test_every_variable_set_has_its_reason_in_the_docs():
    from dspark_launch.node.fabric import ROCE_ENV
    from dspark_launch.profiles.catalog import PROFILES

    docs = (REPO / "docs" / "deepseek-v4-flash.md").read_text()
    from dspark_launch.node.fabric import CGRAPH_ENV

    for name, value in (*FIXED_ENV, *ROCE_ENV, *CGRAPH_ENV, *((v.name, v.value) for p in PROFILES for v in p.env)):
        assert f"`{name}={value}`" in docs, name
    for name in NON_CARRY_OVER:
        assert f"`{name}" in docs, name


def test_node_side_modules_import_neither_config_nor_vllm():
    probe = (
        "import sys, dspark_launch.node.fabric, dspark_launch.node.vllm_offer; "
        "print(sorted(m for m in sys.modules if m.startswith(('vllm', 'ray', 'torch', 'dotenv', "
        "'dspark_launch.config'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
