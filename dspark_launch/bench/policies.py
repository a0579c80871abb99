"""The admission policies the scheduler benchmark compares, on the real vLLM scheduler.

Every policy is a real ``Scheduler`` / ``AsyncScheduler`` pair:

* ``stock``: the installed vLLM, untouched (with ``long_prefill_token_threshold``
  0, vLLM's default, or with the workload's threshold: ``stock+thr``).
* ``hotfix``: our issue-27 hotfix as shipped (a copy of ``scheduler.py``
  patched by ``patches/hotfix-...py``), at cap 1, 2, 3 and in each gate mode.
* ``community``: the community recipe's gate **as published**
  (``len(self._inflight_prefills) >= cap`` at the top of the admission loop),
  reproduced here, in the benchmark only, for comparison. It is never shipped.
* ``variant``: prototype gates written on top of our hotfix to test ideas from
  issue 6 (bench only; the one that won is shipped as a gate mode).

The variants replace the hotfix's gate text in a patched copy of the installed
``scheduler.py``; nothing installed is modified.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import pathlib
import shutil
import sys
import tempfile

from dspark_launch.bench import harness as h

#: Environment variable of the shipped gate mode (see the hotfix).
GATE_MODE_ENV = "DSPARK_PREFILL_GATE_MODE"


@dataclasses.dataclass(frozen=True)
class Policy:
    """One column of the benchmark.

    `kind`: stock | hotfix | community | variant. `threshold`: whether the
    workload's long_prefill_token_threshold is passed to vLLM (stock without it
    runs vLLM's default 0). `cap`: the in-flight cap of gated policies.
    `mode`: the hotfix gate mode (DSPARK_PREFILL_GATE_MODE) or the variant name.
    """

    name: str
    kind: str
    cap: int | None = None
    threshold: bool = True
    mode: str | int | None = None
    description: str = ""

    @property
    def gated(self) -> bool:
        return self.kind != "stock"

    def spec(self, **kw) -> h.SchedulerSpec:
        """The harness spec for this policy; `kw` carries the workload's settings."""
        if not self.threshold:
            kw["long_prefill_token_threshold"] = 0
        if self.kind == "stock":
            return h.SchedulerSpec(policy="stock", **kw)
        if self.kind == "hotfix":
            env = ((GATE_MODE_ENV, None if self.mode is None else str(self.mode)),)
            return h.SchedulerSpec(policy="patched", cap=self.cap, extra_env=env, **kw)
        if self.kind == "stock-copy":
            return h.SchedulerSpec(policy="bench-stock-copy", **kw)
        if self.kind == "community":
            return h.SchedulerSpec(policy="bench-community", cap=self.cap, **kw)
        if self.kind == "variant":
            return h.SchedulerSpec(policy=f"bench-variant-{self.mode}", cap=self.cap,
                                   extra_env=((GATE_MODE_ENV, "0"),), **kw)
        raise ValueError(f"unknown policy kind {self.kind!r}")


# ---------------------------------------------------------------------------
# Text of the comparison-only gates
# ---------------------------------------------------------------------------

# vLLM 0.31 .. 0.33 admission guard; the community gate goes right after it,
# where the published patch put it (on <= 0.30 it anchored on
# `max_num_running_reqs`, which is why it refuses to apply from 0.31).
_GUARD = (
    "                if num_running >= self.max_num_active_reqs:\n"
    "                    break\n"
)

COMMUNITY_GATE = (
    "                if (  # dspark-bench: community gate as published (comparison only)\n"
    "                    self._bench_cap > 0\n"
    "                    and len(self._inflight_prefills) >= self._bench_cap\n"
    "                ):\n"
    "                    break\n"
)

# Our hotfix's gate, as it appears in a patched copy (replaced by variants,
# which run the hotfix in mode 0 so that its own step bound is off).
_HOTFIX_GATE_PREFIX = "                if (  # dspark-issue27\n"
_HOTFIX_GATE_END = "                    continue\n"

_SPENT_HELPER = '''

def _bench_prefill_spent(sched, num_scheduled_tokens):
    """Prefill tokens the running prefills claim this step (bench variants):
    each its next chunk, min(threshold, remaining), whether or not the budget
    let the running loop schedule all of it."""
    thr = sched.scheduler_config.long_prefill_token_threshold
    spent = 0
    for request in sched.running:
        if request.is_prefill_chunk:
            left = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
            scheduled = num_scheduled_tokens.get(request.request_id, 0)
            spent += max(scheduled, min(left, thr)) if thr > 0 else scheduled
    return spent


def _bench_decoding(sched):
    return any(not request.is_prefill_chunk for request in sched.running)
'''

# Prototype gates (issue 6, "go beyond the plain cap"). Names used below:
# c = cap, T = long_prefill_token_threshold, K = a per-step prefill token
# bound. `_bench_need` is the peeked prompt's remaining tokens (an upper
# bound: prefix-cache hits are not known yet), `_bench_chunk` the chunk it
# would get, `_bench_partial_after` whether it stays mid-prefill.
_VARIANT_PREAMBLE = (
    "                _bench_req = request_queue.peek_request()\n"
    "                _bench_thr = self.scheduler_config.long_prefill_token_threshold\n"
    "                _bench_need = _bench_req.num_tokens - _bench_req.num_computed_tokens\n"
    "                _bench_chunk = min(_bench_need, _bench_thr if _bench_thr > 0 else token_budget)\n"
    "                _bench_partial_after = _bench_chunk < _bench_need\n"
    "                _bench_free = _dspark_i27_holds_kv(_bench_req)\n"
)

VARIANT_GATES: dict[str, tuple[str, str]] = {
    # Count cap c for prompts that stay mid-prefill; prompts that finish
    # within the step pass while the step's prefill tokens stay <= (c+1) * T;
    # a blocked long head is stepped over (at most 8 per step) so that a short
    # prompt queued behind it is not held back.
    "lane-skip": (
        "count gate for prompts that stay partial, prompts finishing in the step pass while prefill tokens <= (cap+1) x threshold, up to 8 blocked long prompts per step stepped over",
        _VARIANT_PREAMBLE
        + "                if not _bench_free and (\n"
        "                    (_bench_partial_after and _dspark_partial >= self._dspark_max_inflight_prefills)\n"
        "                    or (_bench_thr > 0 and _bench_spent and _bench_spent + _bench_chunk\n"
        "                        > (self._dspark_max_inflight_prefills + 1) * _bench_thr)\n"
        "                ):\n"
        "                    if _bench_skips >= 8 or not (_bench_partial_after and _dspark_partial >= self._dspark_max_inflight_prefills):\n"
        "                        break\n"
        "                    _bench_skips += 1\n"
        "                    skip_request(request_queue)\n"
        "                    continue\n",
    ),
    # The hotfix's count gate, and the waiting section gets only the prefill
    # tokens left under K = c * T: a new prompt's first chunk fills what the
    # previous prompt's last chunk left (the step never exceeds K).
    "budget": (
        "count gate + the waiting section's token budget cut to cap x threshold minus running prefills' chunks",
        _VARIANT_PREAMBLE
        + "                if (\n"
        "                    _dspark_partial >= self._dspark_max_inflight_prefills\n"
        "                    and not _bench_free\n"
        "                ):\n"
        "                    break\n",
    ),
    # Mode-0 count gate for prompts that stay partial (blocked ones stepped
    # over, 8 per step); prompts that finish within the step pass while the
    # step's prefill tokens stay <= (cap + 1/2) x threshold.
    "shortlane": (
        "count gate for prompts that stay partial (blocked ones stepped over, 8 per step); prompts finishing within the step pass while prefill tokens <= (cap + 1/2) x threshold",
        _VARIANT_PREAMBLE
        + "                if not _bench_free:\n"
        "                    if _bench_partial_after:\n"
        "                        if _dspark_partial >= self._dspark_max_inflight_prefills:\n"
        "                            if _bench_skips >= 8:\n"
        "                                break\n"
        "                            _bench_skips += 1\n"
        "                            skip_request(request_queue)\n"
        "                            continue\n"
        "                    elif _bench_thr > 0 and _bench_spent and (\n"
        "                        _bench_spent + _bench_chunk > (self._dspark_max_inflight_prefills + 0.5) * _bench_thr\n"
        "                    ):\n"
        "                        break\n",
    ),
    # Gate only while a decode-active request runs (idle: admit like stock).
    "decode-aware": (
        "cap applies only while a decode-active request is running",
        _VARIANT_PREAMBLE
        + "                if (\n"
        "                    _bench_decoding_now\n"
        "                    and _dspark_partial >= self._dspark_max_inflight_prefills\n"
        "                    and not _bench_free\n"
        "                ):\n"
        "                    break\n",
    ),
}


def _hotfix_text(original: str) -> str:
    from dspark_launch.hotfix import issue27_patch

    return issue27_patch.render_patched(original.encode("utf-8")).decode("utf-8")


def community_text(original: str) -> str:
    """The installed scheduler.py with the community gate (comparison only)."""
    if original.count(_GUARD) != 1:
        raise RuntimeError("admission guard not found: this vLLM's layout is not the 0.31+ one")
    return original.replace(_GUARD, _GUARD + COMMUNITY_GATE, 1)


def variant_text(original: str, name: str) -> str:
    """Our hotfix with its gate replaced by the prototype `name`."""
    text = _hotfix_text(original)
    start = text.index(_HOTFIX_GATE_PREFIX)
    end = text.index(_HOTFIX_GATE_END, start) + len(_HOTFIX_GATE_END)
    text = text[:start] + VARIANT_GATES[name][1] + text[end:]
    site = "        _dspark_partial, _dspark_spent = _dspark_i27_running_partials(  # dspark-issue27\n"
    assert text.count(site) == 1
    text = text.replace(
        site,
        "        _bench_spent = _bench_prefill_spent(self, num_scheduled_tokens)\n"
        "        _bench_decoding_now = _bench_decoding(self)\n"
        "        _bench_skips = 0\n" + site,
        1,
    )
    if name == "budget":
        share = "0.0"
        section = "        # Next, schedule the WAITING requests.\n"
        assert text.count(section) == 1
        text = text.replace(
            section,
            "        _bench_thr_cfg = self.scheduler_config.long_prefill_token_threshold\n"
            "        if _bench_thr_cfg > 0:\n"
            "            _bench_k = int((self._dspark_max_inflight_prefills + " + share + ") * _bench_thr_cfg)\n"
            "            token_budget = min(token_budget, max(0, _bench_k - _bench_spent))\n"
            + section,
            1,
        )
    admit = "                    _dspark_partial += 1\n"
    assert text.count(admit) == 1
    text = text.replace(admit, admit + "                _bench_spent += num_new_tokens\n", 1)
    block = "# >>> dspark-issue27 hotfix >>>\n"
    return text.replace(block, block + _SPENT_HELPER.lstrip("\n") + "\n", 1)


_WORKDIR: list[pathlib.Path] = []


def _workdir() -> pathlib.Path:
    if not _WORKDIR:
        path = pathlib.Path(tempfile.mkdtemp(prefix="dspark-bench-policies-"))
        atexit.register(shutil.rmtree, path, True)
        _WORKDIR.append(path)
    return _WORKDIR[0]


@functools.lru_cache(maxsize=None)
def _classes_from_text(module_name: str, text: str) -> tuple[type, type]:
    """(Scheduler, AsyncScheduler) from a scheduler.py text, loaded as module
    `module_name`; AsyncScheduler's own source is loaded against it."""
    import vllm.v1.core.sched.async_scheduler as stock_async

    folder = _workdir() / module_name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scheduler.py"
    path.write_text(text, encoding="utf-8")
    module = h._load_module(module_name, path)
    async_path = folder / "async_scheduler.py"
    shutil.copyfile(stock_async.__file__, async_path)
    real = sys.modules["vllm.v1.core.sched.scheduler"]
    sys.modules["vllm.v1.core.sched.scheduler"] = module
    try:
        async_module = h._load_module(module_name + "_async", async_path)
    finally:
        sys.modules["vllm.v1.core.sched.scheduler"] = real
    assert issubclass(async_module.AsyncScheduler, module.Scheduler)
    return module.Scheduler, async_module.AsyncScheduler


def _installed_text() -> str:
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
    base = _classes_from_text("dspark_bench_community_scheduler", community_text(_installed_text()))
    return _with_cap(base, int(spec.cap or 1))


def _variant_provider(name: str):
    def provide(spec: h.SchedulerSpec) -> tuple[type, type]:
        module = "dspark_bench_variant_" + name.replace("-", "_")
        return _classes_from_text(module, variant_text(_installed_text(), name))

    return provide


def _stock_copy_provider(spec: h.SchedulerSpec) -> tuple[type, type]:
    """The installed scheduler.py unchanged, loaded from a copy the way the
    patched ones are (a control for the overhead measurement)."""
    return _classes_from_text("dspark_bench_stock_copy", _installed_text())


def register() -> None:
    """Make the comparison-only policies buildable by the harness."""
    h.POLICY_PROVIDERS["bench-community"] = _community_provider
    h.POLICY_PROVIDERS["bench-stock-copy"] = _stock_copy_provider
    for name in VARIANT_GATES:
        h.POLICY_PROVIDERS[f"bench-variant-{name}"] = _variant_provider(name)


#: The configuration the hotfix ships with (DSPARK_MAX_INFLIGHT_PREFILLS=1,
#: DSPARK_PREFILL_GATE_MODE=1) and the plain cap 1 it is judged against.
SHIPPED = "hotfix-m1:1"
CAP1 = "hotfix-m0:1"


def overhead_policies() -> list[Policy]:
    """Stock first (the baseline), then the controls, then the hotfix."""
    return [
        Policy("stock+thr", "stock", description="baseline"),
        Policy("stock (A/A)", "stock", description="control: a second stock scheduler"),
        Policy("stock-copy", "stock-copy", description="control: stock scheduler.py loaded from a copy, as the patched ones are"),
        Policy(CAP1, "hotfix", cap=1, mode=0, description="hotfix mode 0, cap 1"),
        Policy(SHIPPED, "hotfix", cap=1, mode=1, description="hotfix mode 1, cap 1 (shipped default)"),
    ]


def comparison_policies(variants: bool = False) -> list[Policy]:
    """Every policy of one benchmark run, in table order."""
    policies = [
        Policy("stock", "stock", threshold=False, description="vLLM as installed, long_prefill_token_threshold 0 (its default)"),
        Policy("stock+thr", "stock", description="vLLM as installed, with the workload's threshold"),
    ]
    policies += [
        Policy(f"community:{c}", "community", cap=c,
               description=f"community gate as published, len(self._inflight_prefills) >= {c}")
        for c in (1, 2, 3)
    ]
    policies += [
        Policy(f"hotfix-m0:{c}", "hotfix", cap=c, mode=0,
               description=f"our hotfix, mode 0 (count gate, patch v1 behaviour), cap {c}")
        for c in (1, 2, 3)
    ]
    policies += [
        Policy(f"hotfix-m1:{c}", "hotfix", cap=c, mode=1,
               description=f"our hotfix, mode 1 (count gate + step bound (cap+1/2) x threshold, "
                           f"short-prompt room, blocked long prompts stepped over), cap {c}")
        for c in (1, 2, 3)
    ]
    if variants:
        policies += [
            Policy(f"{name}:{c}", "variant", cap=c, mode=name, description=desc)
            for name, (desc, _) in VARIANT_GATES.items()
            for c in (1,)
        ]
    return policies
