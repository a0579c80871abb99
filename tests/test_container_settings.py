"""Container settings and the node container's run command (no container started here).

The real containers run in tests/test_container_runtime.py (podman on the testbed).
"""

from __future__ import annotations

import pytest

from dspark_launch.cluster.container_engine import (
    AGENT_MOUNT,
    ContainerSpec,
    ImageIdentity,
    ImageMismatch,
    check_same_image,
    check_spec,
    container_name,
    hardware_args,
    run_argv,
)
from dspark_launch.errors import ConfigError
from tests.support.launcher_env import run_dspark

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def _spec(**changes) -> ContainerSpec:
    base = dict(
        runtime="podman",
        image="nvcr.io/nvidia/vllm:25.11-py3",
        marker="dspark-0123abcd-node",
        agent_package="/opt/launcher/dspark_launch",
        state_dir="/var/lib/dspark",
        model_cache="/data/hf",
        hardware_args=hardware_args("podman", {}),
    )
    return ContainerSpec(**{**base, **changes})


@pytest.mark.parametrize(
    "name,value,allowed",
    [
        ("DSPARK_RUNTIME", "lxc", "one of host, docker, podman"),
        ("DSPARK_IMAGE", "Not An Image", "an image reference"),
        ("DSPARK_CONTAINER_ARGS", "--privileged --network=bridge", "other than --network"),
        ("DSPARK_CONTAINER_ARGS", "--pid host", "other than --pid"),
        ("DSPARK_CONTAINER_ARGS", "--shm-size 8g", "other than --shm-size"),
        ("DSPARK_CONTAINER_ARGS", "-v '/a:/b", "split like a shell would"),
    ],
)
def test_bad_container_settings_exit_2_naming_the_setting(name, value, allowed):
    proc = run_dspark(["config", "check"], env={name: value})
    assert proc.returncode == 2
    shown = name if "split" in allowed else f"{name}={value}"  # an unsplittable value is not echoed (may hold a key)
    assert shown in proc.stderr and allowed in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_good_container_settings_pass():
    env = {
        "DSPARK_RUNTIME": "podman",
        "DSPARK_IMAGE": f"nvcr.io/nvidia/vllm@{DIGEST_A}",
        "DSPARK_CONTAINER_ARGS": "--privileged --cap-add SYS_NICE -v /scratch:/scratch --env NCCL_DEBUG=INFO",
    }
    assert run_dspark(["config", "check"], env=env).returncode == 0


def test_production_run_command_has_what_gpu_serving_needs():
    argv = run_argv(_spec(runtime="docker", hardware_args=hardware_args("docker", {})))
    joined = " ".join(argv)
    assert argv[:2] == ["docker", "run"] and "--detach" in argv
    assert "--network host" in joined and "--ipc host" in joined and "--init" in argv
    assert "--gpus all" in joined and "--device /dev/infiniband" in joined and "--ulimit memlock=-1:-1" in joined
    assert "--name dspark-0123abcd-node" in joined and "--label dspark.owner=dspark-0123abcd-node" in joined
    assert f"/opt/launcher/dspark_launch:{AGENT_MOUNT}/dspark_launch:ro" in argv
    # The weights read-only, and no HF_HOME pointing at the host's (issue 30: the hub token lives there).
    assert "/var/lib/dspark:/var/lib/dspark" in argv and "/data/hf:/data/hf:ro" in argv
    assert not any(word.startswith("HF_HOME=") for word in argv)
    assert argv[-3:] == ["sleep", "nvcr.io/nvidia/vllm:25.11-py3", "infinity"]  # --entrypoint sleep IMAGE infinity
    # The agent inside learns the mounted state folder: its logs are kept there for that folder's owner.
    marker = argv.index("DSPARK_CONTAINER_STATE_DIR=/var/lib/dspark")
    assert argv[marker - 1] == "--env" and marker < argv.index("--entrypoint")
    podman = " ".join(run_argv(_spec()))
    assert "--device nvidia.com/gpu=all" in podman and "--gpus" not in podman


TEST_PLATFORM = {"DSPARK_TEST_RAY_CPU_PLATFORM": "1"}  # the test platform's own switch (its plugin is installed here)


def test_the_test_hook_replaces_only_the_hardware_arguments():
    assert hardware_args("podman", {**TEST_PLATFORM, "DSPARK_TEST_CONTAINER_GPU_ARGS": ""}) == ()
    argv = run_argv(
        _spec(
            hardware_args=hardware_args(
                "podman", {**TEST_PLATFORM, "DSPARK_TEST_CONTAINER_GPU_ARGS": "--device /dev/null"}
            )
        )
    )
    assert "nvidia.com/gpu=all" not in argv and "/dev/infiniband" not in argv and "memlock=-1:-1" not in argv
    assert "--device" in argv and "/dev/null" in argv and "--network" in argv


@pytest.mark.parametrize(
    "extra",
    [
        ("--network", "bridge"),
        ("--rm",),
        ("--name=x",),
        ("--label", "a=b"),
        ("-v", "/tmp:/var/lib/dspark"),
        ("--volume=/x:/data/hf/hub",),
        ("--mount", f"type=bind,src=/x,target={AGENT_MOUNT}"),
        ("-v", "/x:/var/lib"),
        ("-v", "/x:/:ro"),
    ],
)
def test_spec_refuses_what_defeats_the_launcher(extra):
    with pytest.raises(ConfigError, match="DSPARK_CONTAINER_ARGS") as info:
        check_spec(_spec(extra_args=extra))
    assert info.value.exit_code == 2


def test_spec_needs_an_image_and_a_container_runtime():
    with pytest.raises(ConfigError, match="DSPARK_IMAGE"):
        check_spec(_spec(image=""))
    with pytest.raises(ConfigError, match="DSPARK_RUNTIME"):
        check_spec(_spec(runtime="host"))
    check_spec(_spec(extra_args=("--privileged", "-v", "/scratch:/scratch")))


def test_container_names_come_only_from_our_markers():
    assert container_name("dspark-0123abcd-node") == "dspark-0123abcd-node"
    for bad in ("vllm", "dspark-$(x)", "dspark-" + "x" * 80):
        with pytest.raises(ValueError):
            container_name(bad)


def test_image_equality_check():
    same = [ImageIdentity("head", "img", DIGEST_A), ImageIdentity("worker1", "img", DIGEST_A)]
    assert check_same_image(same) == DIGEST_A
    with pytest.raises(ImageMismatch, match="differs between nodes: head sha256:aaaa.*worker1 sha256:bbbb"):
        check_same_image([same[0], ImageIdentity("worker1", "img", DIGEST_B)])
    with pytest.raises(ImageMismatch, match="not on worker1") as info:
        check_same_image([same[0], ImageIdentity("worker1", "img", "")])
    assert info.value.exit_code == 1


def test_the_spec_label_changes_exactly_when_the_container_would_be_made_differently():
    from dspark_launch.cluster.container_engine import JIT_CACHE_VARS, SPEC_LABEL, spec_digest

    base = _spec(image=DIGEST_A, jit_cache="/var/lib/dspark/jit-cache")
    argv = run_argv(base)
    assert f"{SPEC_LABEL}={spec_digest(base)}" in argv
    assert spec_digest(_spec(image=DIGEST_A, jit_cache="/var/lib/dspark/jit-cache")) == spec_digest(base)
    for changed in (
        _spec(image=DIGEST_B, jit_cache="/var/lib/dspark/jit-cache"),  # another image id
        _spec(image=DIGEST_A, jit_cache="/var/lib/dspark/jit-cache", extra_args=("--shm-size", "8g")),
        _spec(image=DIGEST_A, jit_cache="/var/lib/dspark/jit-cache", model_cache="/data/other"),
        _spec(image=DIGEST_A, jit_cache="/srv/jit"),
    ):
        assert spec_digest(changed) != spec_digest(base)
    # every JIT cache the recipes compile into lives in the mounted folder, at its host path
    assert "/var/lib/dspark/jit-cache:/var/lib/dspark/jit-cache" in argv
    for var, sub in JIT_CACHE_VARS:
        assert f"{var}=/var/lib/dspark/jit-cache/{sub}" in argv
    assert {
        "VLLM_CACHE_ROOT",
        "FLASHINFER_WORKSPACE_BASE",
        "TRITON_CACHE_DIR",
        "TILELANG_CACHE_DIR",
        "CUTE_DSL_CACHE_DIR",
    } <= {var for var, _ in JIT_CACHE_VARS}


def test_a_model_cache_outside_the_mounted_folder_exits_2_naming_both_settings(tmp_path):
    env = {
        "DSPARK_RUNTIME": "podman",
        "DSPARK_IMAGE": "nvcr.io/nvidia/vllm:26.01-py3",
        "DSPARK_HEAD_IP": "10.213.0.1",
        "DSPARK_WORKER_HOSTS": "10.213.0.2",
        "DSPARK_FABRIC_IFNAME": "fab0",
        "DSPARK_STATE_DIR": str(tmp_path / "state"),
        "DSPARK_MODEL": "org/m",
        "DSPARK_CONTAINER_MODEL_CACHE": str(tmp_path / "hf"),
        "DSPARK_MODEL_CACHE": str(tmp_path / "elsewhere"),
    }
    for command in (["model", "status"], ["start"]):
        proc = run_dspark(command, env=env)
        assert proc.returncode == 2, proc.stderr
        assert f"DSPARK_MODEL_CACHE={tmp_path / 'elsewhere'}" in proc.stderr
        assert f"DSPARK_CONTAINER_MODEL_CACHE={tmp_path / 'hf'}" in proc.stderr
    assert not (tmp_path / "state" / "state.json").exists()


def test_the_test_hook_is_refused_outside_the_test_platform(monkeypatch):
    for environ in (
        {"DSPARK_TEST_CONTAINER_GPU_ARGS": "--privileged"},
        {"DSPARK_TEST_CONTAINER_GPU_ARGS": "", "DSPARK_TEST_RAY_CPU_PLATFORM": "0"},
    ):
        with pytest.raises(ConfigError, match="DSPARK_TEST_CONTAINER_GPU_ARGS from the environment is a test hook"):
            hardware_args("podman", environ)
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "dspark_ray_cpu_platform" else real_find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match="test hook"):  # switched on, but the plugin is not installed
        hardware_args("podman", {**TEST_PLATFORM, "DSPARK_TEST_CONTAINER_GPU_ARGS": ""})


def test_plan_and_status_warn_when_the_image_is_a_tag(clean_environ):
    from dspark_launch.agent.codec import to_data
    from dspark_launch.config.settings import resolve
    from dspark_launch.serve.status import ServerView, ServiceStatus, image_warnings

    def warnings(**values):
        return image_warnings(resolve(env_file="/dev/null", environ={**clean_environ, **values}))

    tagged = warnings(DSPARK_RUNTIME="podman", DSPARK_IMAGE="nvcr.io/nvidia/vllm:25.11-py3")
    assert len(tagged) == 1 and "DSPARK_IMAGE=nvcr.io/nvidia/vllm:25.11-py3 (environment) is a tag" in tagged[0]
    assert warnings(DSPARK_RUNTIME="docker", DSPARK_IMAGE="nvcr.io/nvidia/vllm") != ()
    assert warnings(DSPARK_RUNTIME="podman", DSPARK_IMAGE=f"nvcr.io/nvidia/vllm:25.11-py3@{DIGEST_A}") == ()
    assert warnings(DSPARK_RUNTIME="host", DSPARK_IMAGE="nvcr.io/nvidia/vllm:25.11-py3") == ()
    view = ServiceStatus(
        state="down",
        ray_address="",
        config_digest=None,
        started_at=None,
        checked_at=0.0,
        problems=(),
        nodes=(),
        server=ServerView(state="down"),
        fabric_warnings=(),
        warnings=tagged,
    )
    assert to_data(view)["warnings"] == list(tagged)


def test_the_one_shot_model_container_gets_read_only_folders_and_nothing_else_of_the_nodes():
    """`dspark model ...` with no node container up: the worker's checks run in a `--rm` container that
    sees the package, the state folder (whose owner the folder check trusts, as in the node container)
    and the model cache, all read-only, with no network, GPU or operator arguments (docs/security.md)."""
    from dspark_launch.cluster.container_engine import oneshot_run_args
    from dspark_launch.node.safe_path import CONTAINER_STATE_VAR

    args = list(oneshot_run_args(_spec(extra_args=("--privileged",), jit_cache="/var/lib/dspark/jit-cache")))
    volumes = [args[i + 1] for i, word in enumerate(args) if word == "--volume"]
    assert volumes == [
        f"/opt/launcher/dspark_launch:{AGENT_MOUNT}/dspark_launch:ro",
        "/var/lib/dspark:/var/lib/dspark:ro",
        "/data/hf:/data/hf:ro",
    ]
    assert f"{CONTAINER_STATE_VAR}=/var/lib/dspark" in args
    assert args[args.index("--network") + 1] == "none"
    assert not {"--privileged", "--gpus", "--device", "--ipc"} & set(args)


def test_the_jit_cache_folder_must_be_ours_and_closed_to_other_writers(tmp_path):
    """What is loaded from the JIT cache is compiled code: created 0700, refused when group/other-writable."""
    from dspark_launch.agent.host_shell import LocalHost
    from dspark_launch.cluster.container_engine import ContainerError, check_private_folder

    folder = tmp_path / "jit-cache"
    check_private_folder(LocalHost(), str(folder), "DSPARK_CONTAINER_JIT_CACHE")
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o775)
    with pytest.raises(
        ContainerError, match=r"jit-cache \(DSPARK_CONTAINER_JIT_CACHE\) is owned by uid \d+ with mode 775"
    ):
        check_private_folder(LocalHost(), str(folder), "DSPARK_CONTAINER_JIT_CACHE")
