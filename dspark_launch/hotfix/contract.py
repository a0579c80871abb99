"""The issue-27 hotfix's contract: every fact the patcher, the injected code,
the launcher (serve spec, log scanner), the benchmark and the knob registry
must agree on, defined once.

Standard library only and no package imports: the standalone patch script
(`patches/hotfix-dsv4-issue27-partial-prefill-concurrency.py`) is built from
this module's text (see `tools.hotfix_bundle`).
"""

from __future__ import annotations

import dataclasses
import re

#: Bumped whenever the injected text changes; a file patched by an older
#: version reports `outdated` and `apply` re-patches it from its stored original.
PATCH_VERSION = 9

#: Patch v5 (`dspark reload`): the path of the control file a patched scheduler reads
#: while it runs, given in the server's environment (unset: no live changes).
#: Lines `NAME=VALUE` of LIVE_NAMES, parsed as the environment is at start; a
#: name the file does not set keeps its start value, no file = start values.
ENV_CONTROL = "DSPARK_SCHEDULER_CONTROL_FILE"
#: At most one stat of the control file per this many seconds (monotonic clock,
#: checked at the top of each `schedule()`).
LIVE_CHECK_PERIOD_S = 1.0
#: A larger control file is refused (the current values kept).
CONTROL_MAX_BYTES = 4096


@dataclasses.dataclass(frozen=True, kw_only=True)
class LiveSetting:
    """A setting the patched scheduler reads from its environment in `__init__` and takes live from the
    control file. Everything else is derived from these rows: the injected parsers and constants, the
    live log line and its parser (`LiveLine`), the launcher's knob declaration (config/knobs.py: bounds and
    default), the server's environment (serve/serve_spec.py) and what `reload` expects in force."""

    name: str  # the environment variable (and the knob's name)
    key: str  # the short name: LiveLine / InForce attribute
    kind: str  # "count" | "choice" | "decimal" | "switch" (how a raw value parses: `parse_rule`)
    default: int | float | bool
    minimum: int | float
    maximum: int | float
    label: str  # how the live log line names it
    attribute: str  # the scheduler's attribute that holds it
    #: A count: the scheduler_config attribute whose value stands in for the default where vLLM has it
    #: (0.25/0.26's `max_num_partial_prefills`).
    config_default: str = ""


#: The live settings, in the order the live log line shows them. Kinds: "count" an ASCII base-10 integer,
#: blank or <= 0 the default, above the maximum clamped to it; "choice" a base-10 integer in
#: minimum..maximum; "decimal" a plain decimal in minimum..maximum; "switch" on for 1/true/yes/on (any case).
#: Anything else keeps the default (at start, with a warning) or every current value (live, with a warning).
LIVE_SETTINGS = (
    LiveSetting(
        name="DSPARK_MAX_INFLIGHT_PREFILLS",
        key="cap",
        kind="count",
        default=1,
        minimum=1,
        maximum=3,
        label="cap",
        attribute="_dspark_max_inflight_prefills",
        config_default="max_num_partial_prefills",
    ),
    #: 0 the plain count of patch v1; 1 the count plus a per-step prefill token bound (patch v2); 2 (patch
    #: v3) mode 1 judged after the prefix-cache lookup by the tokens a prompt still has to compute, prompts
    #: that finish in the step given extra room, requests holding KV blocks never starved of budget; 3
    #: (patch v5) the step's prefill room, running prompts' chunks included, goes to the least uncached work
    #: left first, with aging; 4 (patch v7) mode 3 with the room sized in time: while requests decode, the
    #: prefill tokens whose predicted step time (per-token costs fitted online from the engine's own step
    #: times) stays within DSPARK_TARGET_STEP_MS, mode 3's bound until the fit holds.
    LiveSetting(
        name="DSPARK_PREFILL_GATE_MODE",
        key="gate_mode",
        kind="choice",
        default=3,
        minimum=0,
        maximum=4,
        label="gate mode",
        attribute="_dspark_gate_mode",
    ),
    #: Mode 3's aging knob k: a prompt that has waited more than k times its own solo prefill time (its
    #: uncached tokens in threshold-sized steps) goes first (0: every request is aged at once, i.e. oldest
    #: first inside the bound); the default is picked in docs/hotfix.md.
    LiveSetting(
        name="DSPARK_PREFILL_AGING",
        key="aging",
        kind="decimal",
        default=2.0,
        minimum=0.0,
        maximum=64.0,
        label="aging",
        attribute="_dspark_aging",
    ),
    LiveSetting(
        name="DSPARK_ISSUE43_SCHED_DIAG",
        key="diagnostics",
        kind="switch",
        default=False,
        minimum=0,
        maximum=1,
        label="diagnostics",
        attribute="_dspark_diag",
    ),
    #: Gate mode 4's target: the predicted time of a step that carries prefill beside decoding requests, in
    #: milliseconds. Default 75: the point of the measured frontier at the recipe's scale with MTP that halves
    #: stock vLLM's p99 inter-token time on 0.32 and 0.34 (bench/results/frontier-recipe*.json, modelled GB10 step
    #: cost; short prompts and cached turns start sooner than stock's, cold documents later: docs/hotfix.md);
    #: 20 (a decode step with MTP is 12 to 31 ms on two GB10s) to 5000 (a whole 8192-token step at 400K context
    #: is about 4.5 s).
    LiveSetting(
        name="DSPARK_TARGET_STEP_MS",
        key="target_ms",
        kind="decimal",
        default=75.0,
        minimum=20.0,
        maximum=5000.0,
        label="target step ms",
        attribute="_dspark_target_ms",
    ),
    #: Admission of new prompts closed (the supervisor's memory guard, serve/memory_guard.py, or an operator's
    #: `dspark reload`): the waiting loop admits no request that holds no KV blocks and was not preempted (a
    #: resumed stream still comes back), so running streams go on decoding and new prompts wait in vLLM's queue.
    LiveSetting(
        name="DSPARK_ADMISSION_CLOSED",
        key="admission_closed",
        kind="switch",
        default=False,
        minimum=0,
        maximum=1,
        label="admission closed",
        attribute="_dspark_admission_closed",
    ),
)
LIVE = {setting.name: setting for setting in LIVE_SETTINGS}
LIVE_NAMES = tuple(LIVE)

ENV_CAP, ENV_GATE_MODE, ENV_AGING = "DSPARK_MAX_INFLIGHT_PREFILLS", "DSPARK_PREFILL_GATE_MODE", "DSPARK_PREFILL_AGING"
ENV_DIAG, ENV_TARGET_STEP_MS = "DSPARK_ISSUE43_SCHED_DIAG", "DSPARK_TARGET_STEP_MS"
ENV_ADMISSION = "DSPARK_ADMISSION_CLOSED"
CAP_MIN, CAP_MAX, DEFAULT_CAP = LIVE[ENV_CAP].minimum, LIVE[ENV_CAP].maximum, LIVE[ENV_CAP].default
GATE_MODES = tuple(range(int(LIVE[ENV_GATE_MODE].minimum), int(LIVE[ENV_GATE_MODE].maximum) + 1))
DEFAULT_GATE_MODE = LIVE[ENV_GATE_MODE].default
AGING_MIN, AGING_MAX, DEFAULT_AGING = LIVE[ENV_AGING].minimum, LIVE[ENV_AGING].maximum, LIVE[ENV_AGING].default
DEFAULT_TARGET_STEP_MS = LIVE[ENV_TARGET_STEP_MS].default
#: The gate modes whose step plan gives the room to the least uncached work first (3, and 4 in time).
PLANNED_MODES = (3, 4)
#: Gate mode 4 (time-bounded): the step-time fit. Samples: the time between consecutive `schedule()` calls,
#: given to the step that call's engine loop waited for (the one before with sync scheduling, the one two
#: before with async: two steps in flight), against what that step carried (prefill tokens, prefill
#: token-context products, decode and draft tokens, requests). Least squares over the last TIME_FIT_WINDOW
#: samples; no fit below TIME_FIT_MIN_SAMPLES, or when it is implausible: a prefill token costing nothing or
#: more than TIME_FIT_MAX_TOKEN_MS, a threshold's chunk predicted below TIME_FIT_MIN_CHUNK_MS (step times that
#: do not grow with prefill), a prediction of the step being planned without prefill <= 0, or residuals above
#: TIME_FIT_MAX_ERROR of the mean step time. Mode 3's bound applies then.
TIME_FIT_WINDOW = 64
TIME_FIT_MIN_SAMPLES = 16
TIME_FIT_FIRST_SAMPLES = 4
TIME_FIT_MAX_TOKEN_MS = 50.0
TIME_FIT_MAX_ERROR = 0.5
TIME_FIT_MIN_CHUNK_MS = 0.01

#: Mode 2: prefill tokens beyond the step bound that prompts finishing within
#: the step may use when they have no prefix-cache hit (a cached turn's tail
#: gets only what is left of the bound), as a share of the threshold
#: (docs/benchmarks.md compares 0, 1/8, 1/4, 1/2, 1 and the whole budget, for
#: every prompt and for uncached ones only: 1/4 for uncached prompts is what
#: keeps p99 inter-token time within 10 % of patch v2's on every workload).
SHORT_ROOM_SHARE = 0.25
#: Long prompts a gate steps over in one step, at most; mode 3 also looks at
#: no more than this many waiting requests per step when it plans the step.
MAX_SKIPS = 8
#: Patch v6: whatever k is, a request that has waited this many steps since
#: its arrival is aged (goes first, oldest first): at k = 64 a 1M-token prompt
#: (1,024 solo steps at threshold 1024) would otherwise wait 65,536 steps.
AGING_MAX_WAIT_STEPS = 512
#: Patch v6 steps aside (refuses to patch, exit 4) where the installed
#: scheduler enforces a partial-prefill cap of its own (vLLM PR #49075 reads
#: `max_num_partial_prefills` in the v1 scheduler; issue #57413 discusses a
#: `--max-concurrent-prefills` option).
UPSTREAM_CAP_RE = re.compile(r"scheduler_config\.max_num_partial_prefills|max_concurrent_prefills")

#: vLLM (major, minor) range whose scheduler layout this patch knows.
SUPPORTED_RANGE = ((0, 25), (0, 34))

# Exit codes of the patch tool. They are the tool's own: the launcher never
# passes them through (a node whose hotfix is not `applied` fails `dspark
# start` with the launcher's exit 1, nothing served). "Cannot apply here" is 4
# so that it is never read as the launcher's 2 (bad configuration).
EXIT_OK = 0
EXIT_NOT_APPLIED = 1  # status: not applied
EXIT_ERROR = 1  # apply/revert/check: I/O error (the message says whether the file changed)
EXIT_OUTDATED = 3  # status: applied by an older patch version
EXIT_UNSUPPORTED = 4  # unsupported, foreign, modified, damaged, missing: file untouched

EXIT_MEANINGS = {
    EXIT_OK: "applied / done / nothing to do",
    EXIT_NOT_APPLIED: "status: not applied; other actions: I/O error",
    EXIT_OUTDATED: "status: applied by an older patch version (run apply)",
    EXIT_UNSUPPORTED: "cannot act here (unsupported layout or version, foreign patch, "
    "edited or damaged patched file, no scheduler.py); file untouched",
}

#: The INFO line a patched scheduler logs once, in `__init__` (%-style for vLLM's logger).
ACTIVE_LOG_FORMAT = (
    "dspark-issue27 hotfix v%d active: cap=%d in-flight partial prefills, gate mode %d, step bound %s prefill tokens"
)
ACTIVE_LOG_RE = re.compile(
    r"dspark-issue27 hotfix v(\d+) active: cap=(\d+) in-flight partial prefills, "
    r"gate mode (\d+), step bound (\d+|none) prefill tokens"
)


_SHOWN = {"count": "%d", "choice": "%d", "decimal": "%g", "switch": "%s"}
_SHOWN_RE = {"count": r"(\d+)", "choice": r"(\d+)", "decimal": r"([0-9.e+-]+)", "switch": r"(on|off)"}

#: The INFO line a patched scheduler logs each time it read a changed control
#: file with valid values: what changed (`cap 1 -> 2`, `gate mode 2 -> 1`,
#: `aging 2 -> 4`, `diagnostics off -> on`, or `no change`), then every live value now in
#: force (LIVE_SETTINGS' order) and the step bound that follows from them.
LIVE_LOG_FORMAT = (
    "dspark-issue27 hotfix v%d: %s (live); in force: "
    + ", ".join(f"{s.label} {_SHOWN[s.kind]}" for s in LIVE_SETTINGS)
    + "; step bound %s prefill tokens"
)
LIVE_LOG_RE = re.compile(
    r"dspark-issue27 hotfix v(\d+): (.*?) \(live\); in force: "
    + ", ".join(f"{re.escape(s.label)} {_SHOWN_RE[s.kind]}" for s in LIVE_SETTINGS)
    + r"; step bound (\d+|none) prefill tokens"
)
#: The WARNING a patched scheduler logs, once per bad content, when it keeps its
#: values because the control file is not one it accepts.
LIVE_WARNING_FORMAT = "dspark-issue27 hotfix v%d: ignoring the control file %s: %s; keeping %s"
#: group 1: the file and the problem ("PATH: why").
LIVE_WARNING_RE = re.compile(r"dspark-issue27 hotfix v\d+: ignoring the control file (.*?); keeping ")


def shown(setting: LiveSetting, value: int | float | bool) -> str:
    """A value as the live log line shows it."""
    if setting.kind == "switch":
        return "on" if value else "off"
    return _SHOWN[setting.kind] % value


def _value_of(setting: LiveSetting, text: str) -> int | float | bool:
    if setting.kind == "switch":
        return text == "on"
    return float(text) if setting.kind == "decimal" else int(text)


@dataclasses.dataclass(frozen=True)
class LiveLine:
    """What a patched scheduler said when it applied a control file: `values` by LiveSetting key, also
    read as attributes (`line.cap`, `line.gate_mode`, ...)."""

    patch_version: int
    changes: str  # "cap 1 -> 2, gate mode 2 -> 1" or "no change"
    values: dict[str, int | float | bool]
    step_bound: int | None

    def __getattr__(self, key: str) -> int | float | bool:
        values = self.__dict__.get("values", {})
        if key in values:
            return values[key]
        raise AttributeError(key)


def live_line(patch_version: int, changes: str, values: dict[str, int | float | bool], step_bound: int | None) -> str:
    """The live log line for these values by key (the injected code logs the same text)."""
    shown_values = tuple(shown(s, values[s.key]) for s in LIVE_SETTINGS)
    return LIVE_LOG_FORMAT.replace("%d", "%s").replace("%g", "%s") % (
        patch_version,
        changes,
        *shown_values,
        step_bound or "none",
    )


def parse_live_lines(text: str) -> list[LiveLine]:
    """Every `(live)` line in a log, in order."""
    lines = []
    for found in LIVE_LOG_RE.finditer(text):
        groups = found.groups()
        values = {s.key: _value_of(s, groups[2 + i]) for i, s in enumerate(LIVE_SETTINGS)}
        bound = groups[-1]
        lines.append(LiveLine(int(groups[0]), groups[1], values, None if bound == "none" else int(bound)))
    return lines


def control_text(values: dict[str, str]) -> str:
    """The control file for `values` (by name, LIVE_NAMES only), one `NAME=VALUE` a line."""
    unknown = sorted(set(values) - set(LIVE_NAMES))
    if unknown:
        raise ValueError(f"not a live setting: {', '.join(unknown)}")
    return "".join(f"{name}={values[name]}\n" for name in LIVE_NAMES if name in values)


@dataclasses.dataclass(frozen=True)
class ActiveLine:
    """What a patched scheduler said about itself when it started."""

    patch_version: int
    cap: int
    gate_mode: int
    step_bound: int | None  # None: no per-step prefill bound


def active_line(patch_version: int, cap: int, gate_mode: int, step_bound: int | None) -> str:
    """The log line for these values (the injected code logs the same text)."""
    return ACTIVE_LOG_FORMAT % (patch_version, cap, gate_mode, step_bound or "none")


def parse_active_lines(text: str) -> list[ActiveLine]:
    """Every `hotfix vN active` line in a log, in order."""
    return [
        ActiveLine(int(v), int(c), int(m), None if b == "none" else int(b))
        for v, c, m, b in ACTIVE_LOG_RE.findall(text)
    ]


def live_row(setting: LiveSetting) -> tuple[object, ...]:
    """A live setting as the injected code holds it (a plain tuple: the patched module has no dataclasses)."""
    return (
        setting.name,
        setting.kind,
        setting.default,
        setting.minimum,
        setting.maximum,
        setting.label,
        setting.attribute,
        setting.config_default,
    )


def injected_constants(patch_version: int = PATCH_VERSION) -> dict[str, object]:
    """The `_DSPARK_HOTFIX_*` constants the injected helpers read, by name.

    `patch_version` differs from PATCH_VERSION only where tests build a file
    "patched by an older version".
    """
    return {
        "_DSPARK_HOTFIX_PATCH_VERSION": patch_version,
        "_DSPARK_HOTFIX_LIVE": tuple(live_row(s) for s in LIVE_SETTINGS),
        "_DSPARK_HOTFIX_MAX_SKIPS": MAX_SKIPS,
        "_DSPARK_HOTFIX_SHORT_ROOM_SHARE": SHORT_ROOM_SHARE,
        "_DSPARK_HOTFIX_ACTIVE_LOG": ACTIVE_LOG_FORMAT,
        "_DSPARK_HOTFIX_AGING_MAX_WAIT": AGING_MAX_WAIT_STEPS,
        "_DSPARK_HOTFIX_CONTROL_ENV": ENV_CONTROL,
        "_DSPARK_HOTFIX_LIVE_PERIOD_S": LIVE_CHECK_PERIOD_S,
        "_DSPARK_HOTFIX_CONTROL_MAX_BYTES": CONTROL_MAX_BYTES,
        "_DSPARK_HOTFIX_LIVE_LOG": LIVE_LOG_FORMAT,
        "_DSPARK_HOTFIX_LIVE_WARNING": LIVE_WARNING_FORMAT,
        "_DSPARK_HOTFIX_FIT_WINDOW": TIME_FIT_WINDOW,
        "_DSPARK_HOTFIX_FIT_MIN": TIME_FIT_MIN_SAMPLES,
        "_DSPARK_HOTFIX_FIT_FIRST": TIME_FIT_FIRST_SAMPLES,
        "_DSPARK_HOTFIX_FIT_MAX_TOKEN_MS": TIME_FIT_MAX_TOKEN_MS,
        "_DSPARK_HOTFIX_FIT_MAX_ERROR": TIME_FIT_MAX_ERROR,
        "_DSPARK_HOTFIX_FIT_MIN_CHUNK_MS": TIME_FIT_MIN_CHUNK_MS,
    }
