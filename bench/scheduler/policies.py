"""The admission policies `python -m bench.scheduler` compares, on the real vLLM scheduler.

Every policy is a real ``Scheduler`` / ``AsyncScheduler`` pair:

* ``stock``: the installed vLLM, untouched (with ``long_prefill_token_threshold``
  0, vLLM's default, or with the workload's threshold: ``stock+thr``).
* ``hotfix``: the issue-27 hotfix as shipped (a copy of ``scheduler.py``
  patched by the hotfix's own ``apply``), at the operator's cap and gate mode.
* ``community``: the community recipe's gate **as published**
  (``len(self._inflight_prefills) >= cap`` at the top of the admission loop),
  inserted into the *stock* text as a baseline; it does not touch, or depend
  on, the hotfix's text. Never shipped.
* ``stock-copy``: stock ``scheduler.py`` loaded from a copy the way the patched
  ones are (a control for the overhead measurement).

Prototype gates and the full experiment grid are in
``bench/scheduler_experiments.py``; they register further
policies through :data:`tools.scheduler_harness.POLICY_PROVIDERS`.
Nothing installed is modified.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

from dspark_launch.hotfix.contract import DEFAULT_CAP, DEFAULT_GATE_MODE, ENV_GATE_MODE
from tools import scheduler_harness as h


@dataclasses.dataclass(frozen=True)
class Policy:
    """One column of the benchmark.

    `kind`: stock | hotfix | community | stock-copy, or a provider registered
    by an experiment (`provider` names it). `threshold`: whether the
    workload's long_prefill_token_threshold is passed to vLLM (stock without
    it runs vLLM's default 0). `cap`: the in-flight cap of gated policies.
    `mode`: the hotfix gate mode (DSPARK_PREFILL_GATE_MODE) or a variant name.
    """

    name: str
    kind: str
    cap: int | None = None
    threshold: bool = True
    mode: str | int | None = None
    description: str = ""
    provider: str | None = None  # a POLICY_PROVIDERS key (kind "variant")
    env: tuple[tuple[str, str | None], ...] = ()  # further environment for the constructor

    def spec(self, **kw) -> h.SchedulerSpec:
        """The harness spec for this policy; `kw` carries the workload's settings."""
        if not self.threshold:
            kw["long_prefill_token_threshold"] = 0
        if self.kind == "stock":
            return h.SchedulerSpec(policy="stock", **kw)
        if self.kind == "hotfix":
            env = ((ENV_GATE_MODE, None if self.mode is None else str(self.mode)),)
            return h.SchedulerSpec(policy="patched", cap=self.cap, extra_env=env + self.env, **kw)
        if self.kind == "stock-copy":
            return h.SchedulerSpec(policy="bench-stock-copy", **kw)
        if self.kind == "community":
            return h.SchedulerSpec(policy="bench-community", cap=self.cap, **kw)
        if self.provider:
            return h.SchedulerSpec(policy=self.provider, cap=self.cap, extra_env=self.env, **kw)
        raise ValueError(f"unknown policy kind {self.kind!r}")


# vLLM 0.31 .. 0.33 admission guard; the community gate goes right after it,
# where the published patch put it (on <= 0.30 it anchored on
# `max_num_running_reqs`, which is why it refuses to apply from 0.31).
_GUARD = "                if num_running >= self.max_num_active_reqs:\n                    break\n"

COMMUNITY_GATE = (
    "                if (  # dspark-bench: community gate as published (comparison only)\n"
    "                    self._bench_cap > 0\n"
    "                    and len(self._inflight_prefills) >= self._bench_cap\n"
    "                ):\n"
    "                    break\n"
)


def community_text(original: str) -> str:
    """The installed scheduler.py with the community gate (comparison only)."""
    if original.count(_GUARD) != 1:
        raise RuntimeError("admission guard not found: this vLLM's layout is not the 0.31+ one")
    return original.replace(_GUARD, _GUARD + COMMUNITY_GATE, 1)


classes_from_text = h.classes_from_text


def installed_text() -> str:
    import vllm.v1.core.sched.scheduler as stock

    return pathlib.Path(stock.__file__).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def _with_cap(base: tuple[type, type], cap: int) -> tuple[type, type]:
    sync_cls, async_cls = base
    return (
        type(f"{sync_cls.__name__}Cap{cap}", (sync_cls,), {"_bench_cap": cap}),
        type(f"{async_cls.__name__}Cap{cap}", (async_cls,), {"_bench_cap": cap}),
    )


def _community_provider(spec: h.SchedulerSpec) -> tuple[type, type]:
    base = classes_from_text("dspark_bench_community_scheduler", community_text(installed_text()))
    return _with_cap(base, int(spec.cap or 1))


def _stock_copy_provider(spec: h.SchedulerSpec) -> tuple[type, type]:
    return classes_from_text("dspark_bench_stock_copy", installed_text())


def register() -> None:
    """Make the comparison-only policies buildable by the harness."""
    h.POLICY_PROVIDERS["bench-community"] = _community_provider
    h.POLICY_PROVIDERS["bench-stock-copy"] = _stock_copy_provider


def hotfix_name(cap: int, mode: int) -> str:
    return f"hotfix-m{mode}:{cap}"


#: The configuration the hotfix ships with (contract defaults).
SHIPPED = hotfix_name(DEFAULT_CAP, DEFAULT_GATE_MODE)
#: The reference every policy of the operator's comparison is compared with.
STOCK_THR = "stock+thr"


def hotfix(cap: int, mode: int, note: str = "") -> Policy:
    return Policy(
        hotfix_name(cap, mode),
        "hotfix",
        cap=cap,
        mode=mode,
        description=f"the shipped hotfix, gate mode {mode}, cap {cap}{note}",
    )


def stock_policies() -> list[Policy]:
    return [
        Policy(
            "stock",
            "stock",
            threshold=False,
            description="vLLM as installed, long_prefill_token_threshold 0 (its default)",
        ),
        Policy(STOCK_THR, "stock", description="vLLM as installed, with the workload's threshold"),
    ]


def community(cap: int) -> Policy:
    return Policy(
        f"community:{cap}",
        "community",
        cap=cap,
        description=f"community gate as published, len(self._inflight_prefills) >= {cap} (baseline)",
    )


#: Gate mode of patch v2 (the previous default), kept in v3 as mode 1.
V2_MODE = 1


def operator_policies(cap: int = DEFAULT_CAP, mode: int = DEFAULT_GATE_MODE) -> list[Policy]:
    """What `python -m bench.scheduler` compares: stock, the community gate at the
    same cap as a baseline, patch v2's gate (mode 1) and the hotfix at the
    operator's settings."""
    previous = [] if mode == V2_MODE else [hotfix(cap, V2_MODE, " (patch v2's gate)")]
    return stock_policies() + [community(cap)] + previous + [hotfix(cap, mode)]


def overhead_policies(cap: int = DEFAULT_CAP, mode: int = DEFAULT_GATE_MODE) -> list[Policy]:
    """Stock first (the baseline), then the controls, then the hotfix."""
    return [
        Policy(STOCK_THR, "stock", description="baseline"),
        Policy("stock (A/A)", "stock", description="control: a second stock scheduler"),
        Policy(
            "stock-copy",
            "stock-copy",
            description="control: stock scheduler.py loaded from a copy, as the patched ones are",
        ),
        hotfix(cap, mode),
    ]
