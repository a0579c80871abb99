"""The CPU platform with a Ray device key (TEST-ONLY, see the package docstring)."""

from __future__ import annotations

import json
import os
import socket

from vllm.platforms.cpu import CpuPlatform

# Tests only: a folder where each worker records the NCCL_* (and VLLM_CONFIG_ROOT) values its own
# os.environ holds when its device communicator is built, after vLLM copied the driver's variables
# into it (which /proc/PID/environ cannot show).
ENV_RECORD_DIR = "DSPARK_TEST_ENV_RECORD_DIR"


def record_environment() -> None:
    folder = os.environ.get(ENV_RECORD_DIR)
    if not folder:
        return
    seen = {k: v for k, v in os.environ.items() if k.startswith("NCCL_") or k == "VLLM_CONFIG_ROOT"}
    path = os.path.join(folder, f"{socket.gethostname()}-{os.getpid()}.json")
    with open(path, "w") as handle:
        json.dump({"hostname": socket.gethostname(), "pid": os.getpid(), "env": seen}, handle)


class RayCpuPlatform(CpuPlatform):
    # Each vLLM worker actor asks Ray for one "GPU"; the Ray nodes advertise
    # fake GPUs with `ray start --num-gpus N`. A custom resource name does not
    # work (measured, see shared testbed notes).
    ray_device_key: str = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        record_environment()
        return "dspark_ray_cpu_platform.communicator.HostLocalCpuCommunicator"
