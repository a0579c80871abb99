"""DSPARK_FORWARD_ENV never replaces a value the launcher sets on a node (docs/security.md
point 8): every such name is refused when the settings are read, and the cluster layer applies the
forwarded values first, so even a name that slipped through loses to the launcher's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dspark_launch.cluster.ray_cluster import node_env
from dspark_launch.cluster.spec import cluster_spec
from dspark_launch.config.forward_env import refusal
from dspark_launch.config.profile_resolve import resolve as resolve_profile
from dspark_launch.config.settings import resolve
from dspark_launch.node import fabric
from dspark_launch.node.fabric import FabricEnv
from dspark_launch.node.vllm_offer import VllmOffer
from dspark_launch.profiles.catalog import PROFILES
from dspark_launch.serve.serve_spec import build_serve_spec
from tests.support.paths import DATA

FORWARDED_VALUE = "from-the-operators-shell"
# What the model pre-flight adds to every node's environment (model/onnodes.ready_to_serve).
MODEL_ENV = (("HF_HUB_OFFLINE", "1"), ("HF_HUB_CACHE", "/srv/hub"))
PLUGIN_AND_CACHE_NAMES = (
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "VLLM_PLUGINS",
    "NCCL_CONF_FILE",
    "TRITON_CACHE_DIR",
    "TRITON_PTXAS_PATH",
    "HF_MODULES_CACHE",
    "HF_HOME",
    "VLLM_CACHE_ROOT",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCH_EXTENSIONS_DIR",
    "CUDA_CACHE_PATH",
    "CUDA_INJECTION64_PATH",
    "XDG_CACHE_HOME",
    "LD_PRELOAD",
    "PYTHONPATH",
)
STILL_ALLOWED = (
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_RPC_BASE_PATH",
    "DSPARK_TEST_RAY_CPU_PLATFORM",
    "DSPARK_TEST_SYSFS_ROOT",
    "OMP_NUM_THREADS",
)


def _every_launcher_env(tmp_path: Path, forwarded: tuple[str, ...], profile) -> list[dict[str, str]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    env_file = tmp_path / "dspark.env"
    env_file.write_text(
        "DSPARK_HEAD_IP=10.9.0.1\nDSPARK_WORKER_HOSTS=root@10.9.0.2\nDSPARK_FABRIC_IFNAME=fab0\n"
        f"DSPARK_STATE_DIR={tmp_path / 'state'}\nDSPARK_PROFILE={profile.name}\n"
    )
    settings = resolve(env_file=str(env_file), environ={})
    spec = cluster_spec(settings)
    spec = dataclasses.replace(
        spec, node_env=spec.node_env + MODEL_ENV, forwarded=tuple((name, FORWARDED_VALUE) for name in forwarded)
    )
    own_fabric = FabricEnv(
        "head",
        tuple((n, "node-value") for n in fabric.NON_CARRY_OVER if n != "VLLM_CONFIG_ROOT")
        + fabric.ROCE_ENV
        + fabric.FIXED_ENV
        + fabric.CGRAPH_ENV,
        ("mlx5_0",),
        "3",
        True,
        (),
        (),
    )
    token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t" * 32}
    offer = VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text())
    serve_spec = build_serve_spec(settings, spec, token, resolve_profile(profile, offer, settings), own_fabric)
    return [node_env(spec, node, token, own_fabric) for node in spec.nodes] + [dict(serve_spec.env)]


def _launcher_names(tmp_path: Path) -> set[str]:
    names: set[str] = set()
    for profile in PROFILES:
        for env in _every_launcher_env(tmp_path / profile.name, (), profile):
            names.update(env)
    return names


def test_every_name_the_launcher_sets_on_a_node_is_refused(tmp_path):
    names = _launcher_names(tmp_path)
    assert {"NCCL_IB_HCA", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "VLLM_HOST_IP", "DSPARK_MAX_INFLIGHT_PREFILLS"} <= names
    allowed = sorted(name for name in names if refusal(name) is None)
    assert not allowed, f"names the launcher sets that DSPARK_FORWARD_ENV would accept: {allowed}"


@pytest.mark.parametrize("name", PLUGIN_AND_CACHE_NAMES)
def test_plugin_library_and_code_cache_names_are_refused(name):
    assert refusal(name), name


def test_the_container_jit_cache_names_are_refused():
    """A node container points these at its JIT cache folder (compiled code it loads): never forwarded."""
    from dspark_launch.cluster.container_engine import JIT_CACHE_VARS

    allowed = [var for var, _ in JIT_CACHE_VARS if refusal(var) is None]
    assert not allowed, f"JIT cache names DSPARK_FORWARD_ENV would accept: {allowed}"


@pytest.mark.parametrize("name", STILL_ALLOWED)
def test_tuning_and_test_names_stay_allowed(name):
    assert refusal(name) is None, name


def test_a_forwarded_name_never_overrides_a_launcher_value(tmp_path):
    names = _launcher_names(tmp_path / "names")
    for profile in PROFILES:
        own = _every_launcher_env(tmp_path / profile.name, (), profile)
        with_forwarded = _every_launcher_env(tmp_path / profile.name, tuple(sorted(names)), profile)
        for launcher, env in zip(own, with_forwarded):
            overridden = sorted(name for name in launcher if env[name] != launcher[name])
            assert not overridden, f"{profile.name}: forwarded values replaced the launcher's: {overridden}"
            assert {name for name in env if env[name] == FORWARDED_VALUE} == set(names) - set(launcher)
