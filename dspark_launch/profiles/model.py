"""The shape of a model profile: what `vllm serve` needs for one model, as data.

A profile never says which vLLM build is installed; it says what it wants, in order
of preference where builds differ, and which wants are required. `resolve` checks
each one against the installed vLLM's own parser (`VllmOffer`) and, where a value
depends on the GPU, against what that build does on the nodes' compute capability
(`gpus`, `judge_kv`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.node.vllm_releases import release_key


@dataclass(frozen=True)
class Switch:
    """A flag without a value, such as `--async-scheduling`."""

    flag: str
    """The spelling passed to `vllm serve`."""
    why: str
    """What it does for this model, in one line (shown by `plan`, `start`, `status`)."""
    builds: str
    """Which vLLM builds offer it (checked, not guessed: see docs/deepseek-v4-flash.md)."""
    required: bool = False
    """True: a vLLM without it cannot serve this model as intended, so start refuses (exit 2)."""
    needs: str = ""
    """Another flag of the profile this one only works with (`--enable-auto-tool-choice` needs
    `--tool-call-parser`); when that one is omitted, so is this one."""
    releases: tuple[tuple[str, str], ...] = ()
    """(first vLLM release, why) where a release changes what the switch does beside vLLM's own default, oldest
    first; `why` holds below the first and when the installed version is not known."""

    def why_on(self, vllm_version: str) -> str:
        """The reason as it applies on vLLM `vllm_version`: the newest of `releases` that version has reached."""
        installed = release_key(vllm_version)
        reached = [
            why
            for release, why in self.releases
            if installed is not None and (key := release_key(release)) is not None and key <= installed
        ]
        return reached[-1] if reached else self.why


@dataclass(frozen=True, kw_only=True)
class Preference:
    """A flag with a value; several values in order of preference where vLLM builds differ."""

    flag: str
    """The spelling passed to `vllm serve`, e.g. `--kv-cache-dtype`."""
    values: tuple[str, ...]
    """Best first; the first value the installed vLLM offers is used. One value: fixed."""
    why: str
    """What it does for this model and why this order, in one line."""
    builds: str
    """Which vLLM builds offer which value."""
    required: bool = False
    """True: when no value is offered start refuses (exit 2); False: the flag is left out, with the reason."""
    source: str = ""
    """Which public recipe sets it (shown in the decision line)."""
    gpus: tuple[str, ...] = ()
    """Compute capabilities the setting is for (`"12"`: every 12.x, `"12.1"`: GB10 only); () any GPU.
    On another GPU it is left out; with no capability reported it is kept and the line says so."""
    needs_module: tuple[tuple[str, str], ...] = ()
    """(value, optional module): a value used only when the node's vLLM has that library installed
    (`--moe-backend b12x` needs the `b12x` package) on every node; see `node/versions.OPTIONAL_PACKAGES`."""
    judge_kv: bool = False
    """True: the values are KV cache dtypes, each judged by the installed vLLM's DeepSeek-V4 attention for
    the nodes' compute capability (`VllmOffer.kv_judgements`), not only by its parser."""
    judge: str = ""
    """"moe" or "linear": each value judged by the installed vLLM's dry boot for the nodes' compute capability
    (`VllmOffer.boot_judgements`: the MoE oracle of the checkpoint's quantization, the linear kernel selection);
    a value refused on every judged capability is never used, even when no capability is known."""


@dataclass(frozen=True)
class EnvVar:
    """A variable of the `vllm serve` environment that this model's recipe sets."""

    name: str
    value: str
    why: str
    """Why the recipe sets it, in one line (also in docs/deepseek-v4-flash.md)."""
    source: str = ""
    """Which public recipe sets it."""
    gpus: tuple[str, ...] = ()
    """As `Preference.gpus`."""
    read_by: str = ""
    """Who reads it, checked against the installed build: "vllm" (a name `vllm.envs` reads), an optional
    module (`cutlass`: NVIDIA's CuTe DSL), or "" (read by the process itself, e.g. torch's allocator)."""


@dataclass(frozen=True)
class ReleaseDefault:
    """A profile's value for a setting from one vLLM release on, where that release changes the value or its reason
    (`GPU_MEMORY_UTILIZATION`: a start-up gate up to 0.33, a cap from 0.34)."""

    release: str
    """The first vLLM release it applies to ("0.34.0")."""
    value: str | int | float
    """Typed as `SettingDefault.value`."""
    why: str


@dataclass(frozen=True)
class SettingDefault:
    """A profile's value for a launcher setting (model, context length ...): a default the operator can override."""

    setting: str
    """The setting's name (`MAX_MODEL_LEN`); it is checked like any value of that setting."""
    value: str | int | float
    """Typed as the setting is declared (config/knobs.py, config/text_settings.py): `int` for an int setting
    (`MAX_MODEL_LEN`), `float` for a float one, `str` for text; the resolution refuses any other type."""
    why: str
    releases: tuple[ReleaseDefault, ...] = ()
    """Values for later vLLM releases, oldest first; `value` and `why` hold below the first and when the
    installed vLLM's version is not known."""

    def for_release(self, vllm_version: str) -> SettingDefault:
        """This default as it applies on vLLM `vllm_version`: the newest of `releases` that version has reached."""
        installed = release_key(vllm_version)
        reached = [
            r
            for r in self.releases
            if installed is not None and (key := release_key(r.release)) is not None and key <= installed
        ]
        if not reached:
            return self
        return SettingDefault(self.setting, reached[-1].value, reached[-1].why)


@dataclass(frozen=True)
class KvAnchor:
    """A measured KV cache size that calibrates the memory pre-flight's bytes-per-token model."""

    kv_cache_dtype: str
    context_tokens: int
    bytes_per_node: int
    """KV cache one node needs for `context_tokens` tokens of one sequence, as measured."""
    source: str
    """Who measured it, where."""


@dataclass(frozen=True)
class MeasuredMemory:
    """What one node of a recipe's cluster was measured to hold beside the KV cache, and what vLLM's
    start-up gate read: calibrates the memory pre-flight (profiles/memory_model.py)."""

    weights_per_node: int
    """Weights one node loads (used when the manifest is not at hand, e.g. `plan` before `model pull`)."""
    non_kv_bytes: int
    """Activations, non-torch memory, CUDA graphs, draft/indexer scratch: the budget's share that is not KV."""
    startup_free_dip: int
    """MemAvailable of an idle node minus the free memory vLLM's start-up gate read while weights loaded."""
    node_total: int
    """The node's total memory in that measurement (for the record; each node's own total is used)."""
    source: str


@dataclass(frozen=True)
class KvRow:
    """What one token stores per attention layer, in elements (the model's config.json gives it;
    a profile records it for when config.json is not at hand)."""

    nope_dim: int  # latent (MLA) or key+value width stored without rotary embedding
    rope_dim: int  # rotary part of the row (bf16 in the `*_ds_mla` layouts)
    mla: bool = True  # one latent row per token and layer, the same on every TP rank
    scale_block: int = 128  # fp8_ds_mla: one scale per this many latent values (V3.2 128, V4 64)
    scale_bytes: int = 4  # fp8_ds_mla: bytes per scale (V3.2 fp32, V4 ue8m0)
    scale_align: int = 1  # fp8_ds_mla: the scales padded to a multiple of this (V4: 7 + 1 pad = 8)
    fp8_is_ds_mla: bool = False  # any fp8 KV dtype is stored in the fp8_ds_mla layout (vLLM 0.32, DeepSeek-V4)


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Everything `vllm serve` needs for one model, beyond what the launcher owns (host, port, TP, Ray)."""

    name: str
    """What `DSPARK_PROFILE` names."""
    description: str
    settings: tuple[SettingDefault, ...] = ()
    """Values for launcher settings (`DSPARK_MODEL`, `MAX_MODEL_LEN` ...); an operator's value wins."""
    switches: tuple[Switch, ...] = ()
    preferences: tuple[Preference, ...] = ()
    speculative: Preference | None = None
    """`--speculative-config`: its values are speculative methods, best first (`dspark`: DeepSeek's
    multi-token-prediction head), checked against the methods the installed vLLM knows."""
    speculative_tokens: int = 0
    """Draft tokens per step; peers use 5 with `dspark` and accept 2.5 to 5.6 of them per step."""
    draft_sample_method: str = ""
    """`draft_sample_method` of the speculative config ("" leaves vLLM's default, greedy in 0.32)."""
    capture_from_lanes: bool = False
    """True: `--max-cudagraph-capture-size` = MAX_NUM_SEQS x (speculative_tokens + 1), the tokens of one
    decode step with every lane drafting, so decode stays on captured CUDA graphs."""
    capture_source: str = ""
    """Which recipe gives that rule."""
    env: tuple[EnvVar, ...] = ()
    chat: bool = False
    """True: the model answers chat (readiness and smoke use `/v1/chat/completions`)."""
    kv_anchor: KvAnchor | None = None
    kv_row: KvRow | None = None
    measured_memory: MeasuredMemory | None = None
