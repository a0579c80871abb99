"""The CPU platform with a Ray device key (TEST-ONLY, see the package docstring)."""

from __future__ import annotations

from vllm.platforms.cpu import CpuPlatform


class RayCpuPlatform(CpuPlatform):
    # Each vLLM worker actor asks Ray for one "GPU"; the Ray nodes advertise
    # fake GPUs with `ray start --num-gpus N`. A custom resource name does not
    # work (measured, see shared testbed notes).
    ray_device_key: str = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "dspark_ray_cpu_platform.communicator.HostLocalCpuCommunicator"
