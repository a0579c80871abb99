"""Container mode's host folders: the JIT cache checked without following a
link, with the folders above it; the folders above the container model cache checked on the host (the
bind mount hides them from the container's agent); never the hub token's folder as the model cache."""

from __future__ import annotations

import os

import pytest

from dspark_launch.agent.host_shell import LocalHost
from dspark_launch.cluster.container_engine import ContainerError, check_host_folders, check_private_folder
from dspark_launch.cluster.spec import cluster_spec
from dspark_launch.config.settings import resolve
from dspark_launch.errors import ConfigError

NOBODY = 65534
SETTING = "DSPARK_CONTAINER_JIT_CACHE"


@pytest.fixture
def open_folder(tmp_path):
    """A world-writable sticky folder (like /tmp) in which another user planted things."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    tmp_path.chmod(0o755)
    return folder


def test_a_jit_cache_link_planted_by_another_user_is_refused_unfollowed(open_folder, tmp_path):
    victim = tmp_path / "victim-kernels"
    victim.mkdir(mode=0o700)  # ours and private: following the link, the old check passed
    link = open_folder / "jit"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)  # planted by another user
    with pytest.raises(ContainerError, match=rf"{link} \({SETTING}\) is a symbolic link \(never followed\)"):
        check_private_folder(LocalHost(), str(link), SETTING)
    # A real folder of ours in the sticky folder is fine: nobody else can rename or replace it there.
    ours = open_folder / "ours"
    check_private_folder(LocalHost(), str(ours), SETTING)
    assert ours.stat().st_mode & 0o777 == 0o700


def test_a_folder_above_that_another_user_owns_or_can_write_is_refused(tmp_path):
    tmp_path.chmod(0o755)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(ContainerError, match=rf"{theirs}, above {theirs}/jit \({SETTING}\), is owned by uid 65534"):
        check_private_folder(LocalHost(), str(theirs / "jit"), SETTING)
    open_above = tmp_path / "open"
    open_above.mkdir()
    open_above.chmod(0o777)  # writable by others, no sticky bit: the folder below can be swapped
    with pytest.raises(ContainerError, match=r"with mode 777; allowed: owned by root or uid 0"):
        check_private_folder(LocalHost(), str(open_above / "jit"), SETTING)
    with pytest.raises(ContainerError, match=r"DSPARK_CONTAINER_MODEL_CACHE\), is owned by uid 65534"):
        check_host_folders(LocalHost(), str(theirs / "hub"), "DSPARK_CONTAINER_MODEL_CACHE")
    good = tmp_path / "weights" / "hub"
    check_host_folders(LocalHost(), str(good), "DSPARK_CONTAINER_MODEL_CACHE")
    assert good.is_dir()


CLUSTER = {
    "DSPARK_HEAD_IP": "10.213.9.1",
    "DSPARK_WORKER_HOSTS": "root@10.213.9.2",
    "DSPARK_FABRIC_IFNAME": "lo",
    "DSPARK_RUNTIME": "podman",
    "DSPARK_IMAGE": "localhost/vllm@sha256:" + "a" * 64,
}


def test_the_default_model_cache_is_the_hub_cache_and_never_the_token_folder(clean_environ, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    settings = resolve(env_file="/dev/null", environ={**clean_environ, **CLUSTER})
    assert cluster_spec(settings).containers.model_cache == str(tmp_path / "hf" / "hub")
    for cache in (tmp_path / "hf", tmp_path):
        settings = resolve(
            env_file="/dev/null", environ={**clean_environ, **CLUSTER, "DSPARK_CONTAINER_MODEL_CACHE": str(cache)}
        )
        with pytest.raises(ConfigError) as err:
            cluster_spec(settings)
        message = str(err.value)
        assert err.value.exit_code == 2 and "\n" not in message
        assert f"DSPARK_CONTAINER_MODEL_CACHE={cache} (environment) holds the hub login token" in message
        assert f"allowed: the hub cache ({tmp_path / 'hf' / 'hub'})" in message
