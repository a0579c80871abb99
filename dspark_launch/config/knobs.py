"""Every numeric knob, declared once: name, type, bounds, default, group and meaning.

Each field is one knob; its environment name is the field name in capitals
(`health_timeout_s` is `HEALTH_TIMEOUT_S`) and the docstring under it is its
description. `python -m tools.generate` writes from this class
the bash registry `dspark-numeric-knobs.sh` (sourced by the start script, parsed
by `config/registry.py`), the knob lines of `.env.dspark.example` and the tables
of docs/configuration.md; the tests fail while any of them is stale.

Types: `int`, `float`, or `bool` for a 0/1 switch (an `int` 0..1 in the bash
registry). `soft=True`: a value below the minimum warns and uses the default, one
above the maximum warns and uses the maximum; otherwise out of range is an error.
Fields are grouped (and rendered) in the order written here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dspark_launch.config import numbers
from dspark_launch.config.field_docs import declared_docs
from dspark_launch.config.levels import Level, ServeFlag, nature_metadata, owned
from dspark_launch.hotfix.contract import LIVE


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One numeric knob as the registry holds it: canonical strings, as bash and config/numbers.py read them."""

    name: str
    type: str  # "int" or "float"
    default: str
    minimum: str
    maximum: str
    range_policy: str  # "hard": out of range is an error; "soft": warn and fall back
    description: str
    group: str


@dataclass(frozen=True)
class KnobRule:
    group: str
    minimum: int | float
    maximum: int | float
    soft: bool = False
    alias: str = ""


def knob(
    default: int | float | bool,
    *,
    ge: int | float,
    le: int | float,
    group: str,
    soft: bool = False,
    alias: str = "",
    level: Level = "cluster",
    flag: str | ServeFlag | None = None,
) -> Any:
    """A numeric knob field: its default, its bounds (inclusive) and how out-of-range values are treated;
    `level` and `flag`: what its change needs and the `vllm serve` flag it sets (config/levels.py)."""
    return dataclasses.field(
        default=default, metadata={"knob": KnobRule(group, ge, le, soft, alias), **nature_metadata(level, flag)}
    )


def switch(default: bool, *, group: str, level: Level = "cluster", flag: str | ServeFlag | None = None) -> Any:
    """A 0/1 knob, typed `bool` here and `int 0..1` in the bash registry."""
    return knob(default, ge=0, le=1, group=group, level=level, flag=flag)


def live(name: str, *, alias: str = "") -> Any:
    """A setting the patched scheduler takes live: default and bounds are its row of the hotfix's table
    (`hotfix.contract.LIVE_SETTINGS`), the one place they are written; a count is soft (above the
    maximum: the maximum, as the scheduler clamps it)."""
    setting = LIVE[name]
    return knob(
        setting.default,
        ge=setting.minimum,
        le=setting.maximum,
        group="hotfix",
        soft=setting.kind == "count",
        alias=alias,
        level="live",
    )


@dataclass(frozen=True, kw_only=True)
class NumericKnobs:
    """The numeric settings, each typed as the code uses it."""

    # ---- hotfix
    dspark_max_inflight_prefills: int = live("DSPARK_MAX_INFLIGHT_PREFILLS", alias="DSPARKMAXINFLIGHTPREFILLS")
    """Prompts allowed mid-prefill (partial prefill) at once, capped at 3; 1 keeps decode steps smallest"""
    dspark_prefill_gate_mode: int = live("DSPARK_PREFILL_GATE_MODE")
    """Hotfix gate: 0 the cap alone; 1 also bounds a step's prefill at (cap + 1/2) x threshold tokens; 2 as 1, on
    uncached tokens; 3 least uncached work first within the bound; 4 as 3, the bound in time (docs/hotfix.md)"""
    dspark_prefill_aging: float = live("DSPARK_PREFILL_AGING")
    """Gate modes 3 and 4: a prompt waiting over this many times its solo prefill goes first, so none starves
    (0: oldest first)"""
    dspark_issue43_sched_diag: bool = live("DSPARK_ISSUE43_SCHED_DIAG")
    """1 logs one scheduler diagnostics line per step"""
    dspark_target_step_ms: float = live("DSPARK_TARGET_STEP_MS")
    """Gate mode 4: the step time in ms prefill beside decoding is sized to, from per-token costs fitted to the
    engine's step times"""
    dspark_admission_closed: bool = live("DSPARK_ADMISSION_CLOSED")
    """1 holds new prompts in vLLM's queue while running streams decode; the memory guard
    (DSPARK_MEMORY_GUARD=pause) sets it while memory is short"""

    # ---- serving
    max_num_seqs: int = knob(6, ge=1, le=1024, group="serving", level="serve", flag="--max-num-seqs")
    """vllm --max-num-seqs: requests running at once"""
    max_num_batched_tokens: int = knob(
        8192, ge=16, le=1048576, group="serving", level="serve", flag="--max-num-batched-tokens"
    )
    """vllm --max-num-batched-tokens: token budget of one scheduler step"""
    long_prefill_token_threshold: int = knob(
        1024, ge=0, le=1048576, group="serving", level="serve", flag="--long-prefill-token-threshold"
    )
    """vllm --long-prefill-token-threshold: most prompt tokens one request gets per step (0 = no limit)"""
    max_model_len: int = knob(1048576, ge=16, le=4194304, group="serving", level="serve", flag="--max-model-len")
    """vllm --max-model-len: longest context in tokens"""
    gpu_memory_utilization: float = knob(
        0.835,
        ge=0.05,
        le=0.95,
        group="serving",
        level="serve",
        flag=ServeFlag(("--gpu-memory-utilization", "--device-memory-utilization")),
    )
    """vllm --gpu-memory-utilization: share of (unified) memory vLLM may take"""
    enable_prefix_caching: bool = switch(
        True,
        group="serving",
        level="serve",
        flag=owned("--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-prefix-caching"),
    )
    """1 passes --enable-prefix-caching to vllm serve"""
    hf_hub_offline: bool = switch(False, group="serving")
    """1 forbids hub downloads (the model must be cached or a path)"""
    vllm_port: int = knob(8888, ge=1, le=65535, group="serving", level="serve", flag=owned("--port"))
    """TCP port of the OpenAI-compatible API"""
    start_timeout_s: int = knob(1800, ge=10, le=86400, group="serving", level="serve")
    """seconds vllm serve may take to answer after launch"""
    health_timeout_s: int = knob(5, ge=1, le=600, group="serving", level="serve")
    """seconds one health or status probe may take"""
    dspark_drain_timeout_s: int = knob(
        60, ge=0, le=3600, group="serving", level="serve", flag=owned("--shutdown-timeout")
    )
    """seconds stop and restart let in-flight requests finish (vllm --shutdown-timeout); 0 aborts them"""

    # ---- supervision
    dspark_stall_timeout_s: int = knob(600, ge=0, le=86400, group="supervision")
    """seconds running requests may show no progress (tokens, KV cache use) before start --foreground restarts
    vllm serve; 0: never; 600 outlasts a mid-serving DeepSeek-V4 JIT compile (over 300 s)"""
    dspark_recovery_limit: int = knob(3, ge=0, le=60, group="supervision")
    """recoveries start --foreground makes per hour (vllm serve after a stall or exit, all after a lost node); the
    next failure exits 4; 0: exit 1 at the first"""
    dspark_recovery_backoff_s: int = knob(30, ge=0, le=3600, group="supervision")
    """seconds before the hour's first recovery, doubled for each next one"""
    dspark_memory_floor_mib: int = knob(1024, ge=256, le=1048576, group="supervision")
    """DSPARK_MEMORY_GUARD=pause: admission closes below this many MiB of a node's MemAvailable, opens above
    1.5x it (a serving GB10 keeps 1.2 to 5.2 GiB)"""
    dspark_memory_pressure_pct: float = knob(10.0, ge=1.0, le=100.0, group="supervision")
    """DSPARK_MEMORY_GUARD=pause: admission also closes at this memory pressure (PSI some avg10, %), opens below
    half of it"""

    # ---- cluster
    ray_port: int = knob(6379, ge=1, le=65535, group="cluster")
    """TCP port of the Ray head (GCS) on the fabric IP"""
    ray_object_store_mb: int = knob(2048, ge=80, le=1048576, group="cluster")
    """Ray object store per node, MiB (else Ray claims 30% of RAM)"""
    gpus_per_node: int = knob(
        1,
        ge=1,
        le=8,
        group="cluster",
        flag=owned("--tensor-parallel-size", "-tp", why="the launcher passes GPUS_PER_NODE x the number of nodes"),
    )
    """GPUs each node must advertise to Ray (1 on a GB10)"""
    ssh_port: int = knob(22, ge=1, le=65535, group="cluster")
    """SSH port of the worker nodes"""
    ssh_connect_timeout_s: int = knob(10, ge=1, le=300, group="cluster")
    """seconds before an SSH connection attempt fails"""
    cluster_join_timeout_s: int = knob(120, ge=5, le=3600, group="cluster")
    """seconds to wait for every node to join Ray"""
    dspark_allow_tcp_fabric: bool = switch(False, group="cluster")
    """1 lets start go on with a warning when a node lacks usable RoCE: NCCL over TCP, about 12 against 30+ tok/s"""

    # ---- security
    dspark_trusted_network: bool = switch(False, group="security", level="serve")
    """1 allows a non-loopback VLLM_HOST without an API key"""
    dspark_hub_token_to_endpoint: bool = switch(False, group="security")
    """1 sends the hub token to an HF_ENDPOINT other than https://huggingface.co (https only)"""
    dspark_hub_proxy: bool = switch(False, group="security")
    """1 lets model pull use the environment's proxy (it sees the token); 0 connects directly"""


def _canonical(kind: str, value: int | float | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    text = numbers.canonical(kind, repr(value))
    if text is None:
        raise ValueError(f"{value!r} is not a {kind}")
    return text


def declared_knobs(cls: type = NumericKnobs) -> tuple[Knob, ...]:
    """The knobs as the registry holds them (canonical strings), in declaration order; `cls`: NumericKnobs or a
    declaration class extending it (the tests' fake settings)."""
    docs = declared_docs(cls)
    knobs = []
    for field in dataclasses.fields(cls):
        if "knob" not in field.metadata:
            if "text" in field.metadata:
                continue  # declared by the other kind, in a class that declares both
            raise ValueError(f"{cls.__name__}.{field.name} is not declared with knob() or switch()")
        rule: KnobRule = field.metadata["knob"]
        kind = "float" if field.type == "float" else "int"
        if field.name not in docs:
            raise ValueError(f"{cls.__name__}.{field.name} has no docstring")
        if field.default is dataclasses.MISSING:
            raise ValueError(f"{cls.__name__}.{field.name} has no default")
        knobs.append(
            Knob(
                name=field.name.upper(),
                type=kind,
                default=_canonical(kind, field.default),
                minimum=_canonical(kind, rule.minimum),
                maximum=_canonical(kind, rule.maximum),
                range_policy="soft" if rule.soft else "hard",
                description=docs[field.name],
                group=rule.group,
            )
        )
    return tuple(knobs)


def declared_aliases() -> dict[str, str]:
    """alias -> knob name."""
    return {
        field.metadata["knob"].alias: field.name.upper()
        for field in dataclasses.fields(NumericKnobs)
        if field.metadata["knob"].alias
    }
