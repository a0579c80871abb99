"""Where and what the hotfix injects: anchors, the patched text, the marker block.

Pure text transformation, standard library only.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import zlib
from collections.abc import Callable

from dspark_launch.hotfix.contract import ENV_CAP, PATCH_VERSION, UPSTREAM_CAP_RE, injected_constants
from dspark_launch.hotfix.injected_source import injected_body

_BLOCK_BEGIN = "# >>> dspark-issue27 hotfix >>>"
_BLOCK_END = "# <<< dspark-issue27 hotfix <<<"
_MARKER_PREFIX = "# dspark-issue27-marker: "
_ORIG_BEGIN = "# dspark-issue27-original-begin"
_ORIG_END = "# dspark-issue27-original-end"
_INJECT_TAG = "# dspark-issue27"
_MARKER_RE = re.compile("^" + re.escape(_MARKER_PREFIX) + r"(\{.*\})$", re.M)


def helpers_source(patch_version: int = PATCH_VERSION) -> str:
    """The helper block appended to scheduler.py: constants, then injected.py's body."""
    constants = "".join(f"{name} = {value!r}\n" for name, value in injected_constants(patch_version).items())
    return constants + "\n\n" + injected_body()


#: What the gates take as the step's budget left: replaced, per layout, by
#: the tokens vLLM's own budget clamp will allow a waiting request.
_STEP_BUDGET = "<dspark-step-budget>"


def _step_budget(text: str) -> str:
    # 0.28+: the input budget also pays `draft_slots` per request (patch v6:
    # a prompt judged whole on the token budget alone could be cut short by it).
    return "min(token_budget, input_budget - draft_slots)" if _INPUT_BUDGET in text else "token_budget"


def _gate_code(skip: str, loads_only: bool = False) -> str:
    """The admission gate of modes 0 and 1, before the prefix-cache lookup;
    `skip` moves the peeked request out of this step's way in the layout's own
    manner (it keeps its place in the queue). `loads_only`: the layout's loop
    goes on past a full batch or an empty budget to start async KV loads only
    (0.34+), which take neither a seat nor budget: the gate stays out of it.
    First, with admission closed (DSPARK_ADMISSION_CLOSED), a new prompt is stepped over (async loads too)."""
    return (
        "                if self._dspark_admission_closed"
        " and _dspark_hotfix_new_prompt(request_queue.peek_request()):  " + _INJECT_TAG + "\n"
        "                    if _dspark_skips >= _DSPARK_HOTFIX_MAX_SKIPS:\n"
        "                        break\n"
        "                    _dspark_skips += 1\n" + skip + "                    continue\n"
        "                if (  "
        + _INJECT_TAG
        + "\n"
        + ("                    not loads_only\n                    and " if loads_only else "                    ")
        + "self._dspark_gate_mode < 2\n"
        "                    and _dspark_partial >= self._dspark_max_inflight_prefills\n"
        "                    and _dspark_hotfix_gated(self, request_queue.peek_request(), " + _STEP_BUDGET + ")\n"
        "                ):\n"
        "                    if not self._dspark_gate_mode or _dspark_skips >= _DSPARK_HOTFIX_MAX_SKIPS:\n"
        "                        break\n"
        "                    _dspark_skips += 1\n" + skip + "                    continue\n"
    )


def _admission_gate(condition: str, admit: str, skip: str) -> str:
    """An admission gate after admission's own prefix-cache lookup: under `condition`, `admit` decides;
    below 0 the request is skipped (at most _DSPARK_HOTFIX_MAX_SKIPS a step), else `_dspark_limit` is kept."""
    return (
        condition + "                    _dspark_limit = " + admit + "(\n"
        "                        self, request, num_computed_tokens, "
        + _STEP_BUDGET
        + ", _dspark_partial, _dspark_spent\n"
        "                    )\n"
        "                    if _dspark_limit < 0:\n"
        "                        if _dspark_skips >= _DSPARK_HOTFIX_MAX_SKIPS:\n"
        "                            break\n"
        "                        _dspark_skips += 1\n"
        + skip.replace("                    ", "                        ", 1)
        + "                        continue\n"
    )


def _cached_gate_code(skip: str, loads_only: bool = False) -> str:
    """The admission gate of mode 2, after admission's own prefix-cache lookup
    (`num_computed_tokens` holds the hit): the request is judged by what it
    still has to compute; `_dspark_limit` caps its first chunk (0: no cap)."""
    return (
        "                _dspark_limit = 0  "
        + _INJECT_TAG
        + "\n"
        + _admission_gate(
            "                if self._dspark_gate_mode == 2 and not load_kv_async" + _LOADS_ONLY[loads_only] + ":\n",
            "_dspark_hotfix_admit",
            skip,
        )
    )


#: The condition the admission gates add where the waiting loop can run in loads-only mode (0.34+).
_LOADS_ONLY = {False: "", True: " and not loads_only"}


# vLLM 0.31 .. 0.34: the waiting loop's own `skip_request` helper.
_SKIP_031 = "                    skip_request(request_queue)\n"
# vLLM 0.25 .. 0.30: what the loop itself does to skip a request.
_SKIP_025 = "                    step_skipped_waiting.prepend_request(request_queue.pop_request())\n"
#: Text that tells the layouts apart (0.31+ has the helper; 0.34+ goes on in loads-only mode).
_LAYOUT_031 = "            def skip_request(from_queue: RequestQueue) -> None:\n"
_LAYOUT_034 = "                loads_only = (\n"
_LAYOUT_025 = "                    step_skipped_waiting.prepend_request(request)\n"


@dataclasses.dataclass(frozen=True)
class _Site:
    """One place the patch edits: `anchor` must occur exactly once.

    `code` is one text for every anchor, or one per anchor alternative; each
    alternative may also `require` text elsewhere in the file (the names its
    code uses), which must occur at least once.
    """

    name: str
    anchors: tuple[str, ...]  # alternatives (per vLLM version); exactly one matches
    code: str | tuple[str, ...] | Callable[[str], str]  # a callable: the code for the original text
    before: bool = False  # insert before the anchor instead of after it
    requires: tuple[str, ...] = ()  # per anchor alternative ("" = nothing)


def _srpt_gate_code(skip: str, loads_only: bool = False) -> str:
    """Mode 3's admission gate, after admission's own prefix-cache lookup and
    mode 2's gate: `_dspark_limit` > 0 is the exact size of the first chunk."""
    return _admission_gate(
        "                if self._dspark_gate_mode >= 3 and not load_kv_async"
        + _LOADS_ONLY[loads_only]
        + ":  "
        + _INJECT_TAG
        + "\n",
        "_dspark_hotfix_admit_srpt",
        skip,
    )


#: The layouts (0.25+) that pad a waiting request with one token left to
#: 1 + num_spec_tokens rows (0.25 .. 0.28 one indent less: no assert, the
#: padding's draft placeholders are added at admission; 0.29+ assert the size
#: there). The flag is reset once per waiting request before the chunk.
_PADDED_RE = re.compile(r"^ +pad_spec_decode = True\n", re.M)
_PADDING_RESET_RE = re.compile(r"^ +pad_spec_decode = False\n", re.M)
#: The layouts (0.28+) with an input budget beside the token budget.
_INPUT_BUDGET = "        input_budget = self.scheduler_config.max_num_batched_tokens\n"


def _skip_of(text: str) -> str:
    """How this layout's waiting loop skips a request."""
    return _SKIP_031 if _LAYOUT_031 in text else _SKIP_025


def pads(text: str) -> bool:
    """Whether this scheduler pads a waiting request for speculative decoding."""
    return _PADDED_RE.search(text) is not None


def _unpadded(text: str) -> str:
    """The condition that keeps the hotfix off a request vLLM padded."""
    return " and not pad_spec_decode" if pads(text) else ""


def _padding_problem(text: str) -> str:
    """Why the padding of this scheduler is not one the hotfix can keep off ("" when it is, or there is none):
    `pad_spec_decode` mentioned without the assignment the guard reads, or set without being reset first."""
    if "pad_spec_decode" not in text:
        return ""
    set_at, reset_at = _PADDED_RE.search(text), _PADDING_RESET_RE.search(text)
    if set_at is None or reset_at is None or reset_at.start() > set_at.start():
        return (
            "this scheduler pads for speculative decoding (`pad_spec_decode`) in a form the hotfix does not "
            "know: it would size a padded request's chunk"
        )
    return ""


def _first_chunk_code(text: str) -> str:
    # Mode 2's limit and mode 3's chunk size the chunk vLLM computed; a padded
    # request keeps vLLM's 1 + num_spec_tokens (patch v6: v5's mode 3 reset it
    # to 1 and vLLM's assert at admission stopped the EngineCore).
    guard = _unpadded(text)
    return (
        "                    if _dspark_limit" + guard + ":  " + _INJECT_TAG + "\n"
        "                        num_new_tokens = min(num_new_tokens, _dspark_limit)\n"
    )


def _srpt_first_chunk_code(text: str) -> str:
    # Mode 3 sizes the first chunk itself, possibly the whole prompt beyond
    # the threshold; vLLM's budget clamp and its later rules follow.
    return (
        "                    if _dspark_limit > 0 and self._dspark_gate_mode >= 3"
        + _unpadded(text)
        + ":  "
        + _INJECT_TAG
        + "\n"
        "                        num_new_tokens = min(request.num_tokens - num_computed_tokens, _dspark_limit)\n"
    )


#: The layouts (0.33+) whose model runner skips drafting in a step where no scheduled request can use the
#: drafts, as `schedule()` decided request by request before the give-back.
_DRAFTS_NEEDED = "        drafts_needed = not self.can_skip_drafts\n"


def _give_back_code(text: str) -> str:
    budgets = "token_budget, input_budget" if _INPUT_BUDGET in text else "token_budget, _dspark_input"
    args = "token_budget, input_budget, draft_slots" if _INPUT_BUDGET in text else "token_budget, None, 0"
    # Patch v7: a chunk the give-back grew into a prompt's last chunk samples a token whose drafts are used.
    drafts = "            drafts_needed = drafts_needed or _dspark_drafts\n" if _DRAFTS_NEEDED in text else ""
    return (
        "        if _dspark_plan:  " + _INJECT_TAG + "\n"
        "            " + budgets + ", _dspark_drafts = _dspark_hotfix_give_back(\n"
        "                self, num_scheduled_tokens, req_to_new_blocks, scheduled_running_reqs, " + args + "\n"
        "            )\n" + drafts
    )


#: vLLM's own threshold clamp of a waiting request's first chunk (0.31 ..
#: 0.33, then 0.25 .. 0.30).
_FIRST_CHUNK_CLAMPS = (
    "                    if 0 < long_prefill_token_threshold < num_new_tokens:\n"
    "                        num_new_tokens = long_prefill_token_threshold\n",
    "                    threshold = self.scheduler_config.long_prefill_token_threshold\n"
    "                    if 0 < threshold < num_new_tokens:\n"
    "                        num_new_tokens = threshold\n",
)

_SITES: tuple[_Site, ...] = (
    _Site(
        "init",
        ("        self.scheduler_config = vllm_config.scheduler_config\n",),
        "        _dspark_hotfix_init(self)  " + _INJECT_TAG + "\n",
    ),
    _Site(
        "running-plan",
        ("        # First, schedule the RUNNING requests.\n",),
        "        _dspark_plan = _dspark_hotfix_plan(self)  " + _INJECT_TAG + "\n",
        before=True,
    ),
    _Site(
        "running-chunk",
        (
            # vLLM 0.31 .. 0.33: the running loop's (possibly adaptive) threshold.
            "\n            if 0 < long_prefill_token_threshold < num_new_tokens:\n"
            "                num_new_tokens = long_prefill_token_threshold\n",
            # vLLM 0.25 .. 0.30: the configured threshold.
            "\n            if 0 < self.scheduler_config.long_prefill_token_threshold < num_new_tokens:\n"
            "                num_new_tokens = self.scheduler_config.long_prefill_token_threshold\n",
        ),
        # Mode 3's plan may shrink a running prompt's chunk, or skip it this
        # step; decoding requests are never in the plan.
        "            if _dspark_plan and request.request_id in _dspark_plan:  " + _INJECT_TAG + "\n"
        "                num_new_tokens = _dspark_hotfix_planned_chunk(self, request, num_new_tokens, _dspark_plan)\n"
        "                if not num_new_tokens:\n"
        "                    req_index += 1\n"
        "                    continue\n",
    ),
    _Site(
        "live-control",  # patch v5: the control file, at the top of schedule()
        ("        num_scheduled_tokens: dict[str, int] = {}\n",),
        "        _dspark_hotfix_live_check(self)  " + _INJECT_TAG + "\n",
        before=True,
    ),
    _Site(
        "waiting-section",
        ("        # Next, schedule the WAITING requests.\n",),
        "        _dspark_partial, _dspark_spent = _dspark_hotfix_running_partials(  " + _INJECT_TAG + "\n"
        "            self, num_scheduled_tokens\n"
        "        )\n"
        "        if self._dspark_step_bound and self._dspark_gate_mode == 1:  " + _INJECT_TAG + "\n"
        "            token_budget = min(token_budget, max(0, self._dspark_step_bound - _dspark_spent))\n"
        "        _dspark_skips = 0  " + _INJECT_TAG + "\n"
        "        _dspark_limit = 0  " + _INJECT_TAG + "\n",
        before=True,
    ),
    _Site(
        "srpt-spent",
        ("        # Next, schedule the WAITING requests.\n",),
        "        if _dspark_plan is not None:  " + _INJECT_TAG + "\n"
        "            _dspark_spent = _dspark_hotfix_planned_spent(self, num_scheduled_tokens)\n",
        before=True,
    ),
    _Site(
        "admission-guard",
        (
            # vLLM 0.34: the loop goes on in loads-only mode; the guard is the empty queue or input budget.
            "                if not request_queue or (\n"
            "                    not loads_only and input_budget <= draft_slots\n"
            "                ):\n"
            "                    break\n",
            # vLLM 0.31 .. 0.33: queue picked before the guard.
            "                if num_running >= self.max_num_active_reqs:\n                    break\n",
            # vLLM 0.25 .. 0.30: queue picked right after the guard.
            "                if num_running >= self.max_num_running_reqs:\n"
            "                    break\n"
            "\n"
            "                request_queue = self._select_waiting_queue_for_scheduling()\n"
            "                assert request_queue is not None\n",
        ),
        (_gate_code(_SKIP_031, loads_only=True), _gate_code(_SKIP_031), _gate_code(_SKIP_025)),
        requires=(_LAYOUT_034, _LAYOUT_031, _LAYOUT_025),
    ),
    _Site(
        "cached-gate",
        ("                encoder_inputs_to_schedule = None\n",),
        lambda text: _cached_gate_code(_skip_of(text), _LAYOUT_034 in text),
        before=True,
    ),
    _Site(
        "srpt-gate",
        ("                encoder_inputs_to_schedule = None\n",),
        lambda text: _srpt_gate_code(_skip_of(text), _LAYOUT_034 in text),
        before=True,
    ),
    _Site(
        "first-chunk",
        (
            # vLLM 0.31 .. 0.33: the step's (possibly adaptive) threshold.
            "                    if 0 < long_prefill_token_threshold < num_new_tokens:\n"
            "                        num_new_tokens = long_prefill_token_threshold\n",
            # vLLM 0.25 .. 0.30: the configured threshold.
            "                    threshold = self.scheduler_config.long_prefill_token_threshold\n"
            "                    if 0 < threshold < num_new_tokens:\n"
            "                        num_new_tokens = threshold\n",
        ),
        _first_chunk_code,
    ),
    _Site(
        "srpt-first-chunk",
        _FIRST_CHUNK_CLAMPS,
        _srpt_first_chunk_code,
    ),
    _Site(
        "admission",
        (
            "                request.status = RequestStatus.RUNNING\n"
            "                request.num_computed_tokens = num_computed_tokens\n",
        ),
        # Every admission counts, requests that bypass the gate included.
        "                if num_computed_tokens + num_new_tokens < request.num_tokens:  " + _INJECT_TAG + "\n"
        "                    _dspark_partial += 1\n"
        "                _dspark_spent += num_new_tokens  " + _INJECT_TAG + "\n",
    ),
    _Site(
        "give-back",  # patch v6: room admission left unused goes back to the cut running prompts
        ("        # Check if the scheduling constraints are satisfied.\n",),
        _give_back_code,
        before=True,
    ),
    _Site(
        "arrival",  # patch v6: mode 3's aging counts from arrival
        ("            self.requests[request.request_id] = request\n",),
        "            _dspark_hotfix_arrived(self, request)  " + _INJECT_TAG + "\n",
    ),
    _Site(
        "constraints-check",
        ("        # Check if the scheduling constraints are satisfied.\n",),
        # Gate mode 4 (patch v7): what the step carries, for the step-time fit.
        "        if self._dspark_gate_mode == 4:  " + _INJECT_TAG + "\n"
        "            _dspark_hotfix_carried(self, num_scheduled_tokens)\n"
        "        if self._dspark_diag:  " + _INJECT_TAG + "\n"
        "            _dspark_hotfix_diag(self, num_scheduled_tokens, _dspark_partial, _dspark_spent)\n",
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


def unmarked_patch(text: str) -> tuple[str, str] | None:
    """(state, problem) for a file without a marker that already carries a patch.

    `damaged`: this patch's own injected code (it calls helpers that lived in
    the lost marker block); `foreign`: another patch of the same variable.
    """
    if _INJECT_TAG in text:
        return "damaged", "the file holds this hotfix's injected gate but no marker block (its helpers are gone)"
    if ENV_CAP in text or "_dspark_" in text:
        return "foreign", f"the file already references {ENV_CAP} without this patch's marker (another patch?)"
    return None


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
    foreign = unmarked_patch(text)
    if foreign is not None:
        raise LayoutError(foreign[0], foreign[1])
    for name, fact in _REQUIRED_FACTS:
        if text.count(fact) != 1:
            raise LayoutError(name, f"anchor '{name}' not found exactly once (found {text.count(fact)})")

    upstream = UPSTREAM_CAP_RE.search(text)
    if upstream is not None:
        raise LayoutError(
            "upstream",
            f"this vLLM enforces a partial-prefill cap of its own (`{upstream.group(0)}`"
            " in its scheduler): the hotfix steps aside, use vLLM's option",
        )
    padding = _padding_problem(text)
    if padding:
        raise LayoutError("padding", padding)
    original_text = text
    for site in _SITES:
        hits = [a for a in site.anchors if text.count(a) == 1]
        if len(hits) != 1 or any(text.count(a) > 1 for a in site.anchors):
            first = site.anchors[0].strip().splitlines()[0]
            raise LayoutError(site.name, f"anchor '{site.name}' not found exactly once (expected e.g. `{first}`)")
        anchor = hits[0]
        # Per-layout code: by anchor alternative, or by layout for one anchor.
        index = site.anchors.index(anchor) if len(site.anchors) > 1 else (0 if _LAYOUT_031 in text else 1)
        if callable(site.code):
            code = site.code(original_text)
        else:
            code = site.code if isinstance(site.code, str) else site.code[index]
        code = code.replace(_STEP_BUDGET, _step_budget(original_text))
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
    helpers = helpers_source(patch_version)
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
