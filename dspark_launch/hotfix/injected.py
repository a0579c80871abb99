"""The code the issue-27 hotfix injects into vLLM's `scheduler.py`.

Everything below the `INJECTED BODY` marker is copied, as text, into the
patched scheduler module (by `dspark_launch.hotfix.layout`), after a block of
`_DSPARK_HOTFIX_*` constants rendered from `contract.injected_constants()`. There
the helpers are module-level functions of vLLM's scheduler module: they use its
`logger` and nothing outside the standard library. The header above the marker
gives this module the same names so that the helpers can be linted and tested
here directly.
"""

import logging

from dspark_launch.hotfix import contract

logger = logging.getLogger("vllm.v1.core.sched.scheduler")

_DSPARK_HOTFIX_PATCH_VERSION = contract.PATCH_VERSION
_DSPARK_HOTFIX_LIVE = contract.injected_constants()["_DSPARK_HOTFIX_LIVE"]
_DSPARK_HOTFIX_MAX_SKIPS = contract.MAX_SKIPS
_DSPARK_HOTFIX_SHORT_ROOM_SHARE = contract.SHORT_ROOM_SHARE
_DSPARK_HOTFIX_ACTIVE_LOG = contract.ACTIVE_LOG_FORMAT
_DSPARK_HOTFIX_AGING_MAX_WAIT = contract.AGING_MAX_WAIT_STEPS
_DSPARK_HOTFIX_CONTROL_ENV = contract.ENV_CONTROL
_DSPARK_HOTFIX_LIVE_PERIOD_S = contract.LIVE_CHECK_PERIOD_S
_DSPARK_HOTFIX_CONTROL_MAX_BYTES = contract.CONTROL_MAX_BYTES
_DSPARK_HOTFIX_LIVE_LOG = contract.LIVE_LOG_FORMAT
_DSPARK_HOTFIX_LIVE_WARNING = contract.LIVE_WARNING_FORMAT
_DSPARK_HOTFIX_FIT_WINDOW = contract.TIME_FIT_WINDOW
_DSPARK_HOTFIX_FIT_MIN = contract.TIME_FIT_MIN_SAMPLES
_DSPARK_HOTFIX_FIT_FIRST = contract.TIME_FIT_FIRST_SAMPLES
_DSPARK_HOTFIX_FIT_MAX_TOKEN_MS = contract.TIME_FIT_MAX_TOKEN_MS
_DSPARK_HOTFIX_FIT_MAX_ERROR = contract.TIME_FIT_MAX_ERROR
_DSPARK_HOTFIX_FIT_MIN_CHUNK_MS = contract.TIME_FIT_MIN_CHUNK_MS

# ---- INJECTED BODY (everything below goes into scheduler.py) ----

import os as _dspark_hotfix_os  # noqa: E402
import stat as _dspark_hotfix_stat  # noqa: E402
import time as _dspark_hotfix_time  # noqa: E402


def _dspark_hotfix_parse(setting, raw, default=None):
    """Return (value, bad) for a raw value of a live setting (a row of _DSPARK_HOTFIX_LIVE: name, kind,
    default, minimum, maximum, label, attribute, config default).

    Unset or blank gives `default` (the row's own when None). "count": an ASCII base-10 integer with an
    optional sign; <= 0 gives the default, above the maximum the maximum. "choice": a base-10 integer in
    minimum..maximum. "decimal": digits with at most one '.' (a leading '+' allowed) in minimum..maximum.
    "switch": on for 1/true/yes/on in any case, off for anything else (never bad). Anything else is `bad`
    (the caller warns) and gives the default; nothing here raises on a value.
    """
    kind, low, high = setting[1], setting[3], setting[4]
    if default is None:
        default = setting[2]
    if kind == "count":
        default = min(max(int(default), low), high)
    if raw is None or not raw.strip():
        return default, False
    text = raw.strip()
    if kind == "switch":
        return text.lower() in ("1", "true", "yes", "on"), False
    if kind == "decimal":
        if text[0] == "+":
            text = text[1:]
        if not text or text.count(".") > 1 or any(c not in "0123456789." for c in text) or text == ".":
            return default, True
        value = float(text)
        return (value, False) if low <= value <= high else (default, True)
    digits = text[1:] if text[0] in "+-" else text
    if not digits or any(c not in "0123456789" for c in digits):
        return default, True
    value = int(text)
    if kind == "count":
        return (default, False) if value <= 0 else (min(value, high), False)
    return (value, False) if low <= value <= high else (default, True)


def _dspark_hotfix_expected(setting):
    """What a live setting accepts, for a warning."""
    kind, low, high = setting[1], setting[3], setting[4]
    if kind == "count":
        return "a base-10 integer"
    if kind == "choice":
        return "one of %s" % "/".join(str(v) for v in range(int(low), int(high) + 1))
    if kind == "decimal":
        return "a decimal in %g..%g" % (low, high)
    return "1/true/yes/on or anything else for off"


def _dspark_hotfix_defaults(sched):
    """Each live setting's default by name: the row's, or the scheduler config's value of its `config
    default` where this vLLM has one (a count is clamped to its bounds when parsed)."""
    defaults = {}
    for setting in _DSPARK_HOTFIX_LIVE:
        configured = getattr(sched.scheduler_config, setting[7], None) if setting[7] else None
        defaults[setting[0]] = configured or setting[2]
    return defaults


def _dspark_hotfix_init(sched):
    # The environment is read here, once per scheduler, never in schedule().
    defaults = _dspark_hotfix_defaults(sched)
    values = {}
    for setting in _DSPARK_HOTFIX_LIVE:
        raw = _dspark_hotfix_os.environ.get(setting[0])
        values[setting[0]], bad = _dspark_hotfix_parse(setting, raw, defaults[setting[0]])
        if bad:
            logger.warning(
                "dspark-issue27: ignoring %s=%r (expected %s); using %s",
                setting[0],
                raw,
                _dspark_hotfix_expected(setting),
                values[setting[0]],
            )
    _dspark_hotfix_set(sched, values)
    sched._dspark_diag_step = 0
    sched._dspark_diag_last = None
    logger.info(
        _DSPARK_HOTFIX_ACTIVE_LOG,
        _DSPARK_HOTFIX_PATCH_VERSION,
        sched._dspark_max_inflight_prefills,
        sched._dspark_gate_mode,
        sched._dspark_step_bound or "none",
    )
    _dspark_hotfix_init_srpt(sched)
    _dspark_hotfix_live_init(sched, values, defaults)


def _dspark_hotfix_set(sched, values):
    """The live values (by name) onto the scheduler, and what follows from them: at start and at each
    live change."""
    for setting in _DSPARK_HOTFIX_LIVE:
        setattr(sched, setting[6], values[setting[0]])
    cap, mode = sched._dspark_max_inflight_prefills, sched._dspark_gate_mode
    # Mode 1 bounds the prefill tokens of a step at (cap + 1/2) chunks. It
    # needs a chunk size (long_prefill_token_threshold > 0) and chunked
    # prefill (without it a prompt longer than the bound could never start).
    threshold = getattr(sched.scheduler_config, "long_prefill_token_threshold", 0) or 0
    chunked = bool(getattr(sched.scheduler_config, "enable_chunked_prefill", False))
    if mode >= 1 and threshold > 0 and chunked:
        sched._dspark_chunk = threshold
        sched._dspark_step_bound = cap * threshold + threshold // 2
    else:
        sched._dspark_chunk = 0
        sched._dspark_step_bound = 0
    # Mode 2: room beyond the step bound for prompts with no prefix-cache hit
    # that finish in the step.
    sched._dspark_short_room = int(_DSPARK_HOTFIX_SHORT_ROOM_SHARE * sched._dspark_chunk)
    # Mode 4: an interval that spans a change of mode is no step time.
    sched._dspark_last_call = None
    sched._dspark_carried = []


def _dspark_hotfix_stays_partial(request, num_scheduled):
    """Whether `request` is still prefilling after this step.

    Same predicate as vLLM's own `is_prefill_chunk`, which
    `_update_after_schedule` sets after the step; a request that got no
    tokens this step keeps the flag of its last step.
    """
    if not num_scheduled:
        return request.is_prefill_chunk
    return request.num_computed_tokens + num_scheduled < (request.num_tokens + request.num_output_placeholders)


def _dspark_hotfix_running_partials(sched, num_scheduled_tokens):
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
            left = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
            if not scheduled or scheduled < left:
                count += 1
            if chunk:
                spent += max(scheduled, min(left, chunk))
    return count, spent


def _dspark_hotfix_gated(sched, request, token_budget):
    """Whether the gate holds `request` back once the count reached the cap.

    Requests holding KV blocks never are. Mode 0 holds back every other one;
    mode 1 only those that would still be prefilling after this step (a
    prompt that finishes within the step's room passes).
    """
    if _dspark_hotfix_holds_kv(request):
        return False
    if not sched._dspark_gate_mode:
        return True
    return _dspark_hotfix_stays_partial_if_admitted(sched, request, token_budget)


def _dspark_hotfix_stays_partial_if_admitted(sched, request, token_budget):
    """Whether `request` would still be prefilling after a first chunk now.

    An upper bound on its tokens (prefix-cache hits are not known yet): a
    prompt that may finish within this step's room counts as short.
    """
    need = request.num_tokens - request.num_computed_tokens
    threshold = sched._dspark_chunk
    room = min(token_budget, threshold) if threshold else token_budget
    return need > room


def _dspark_hotfix_admit(sched, request, computed, token_budget, partial, spent):
    """Mode 2: -1 holds `request` back; 0 admits it as vLLM would; n > 0 admits
    it with a first chunk of at most n tokens.

    Called once per request per step, after admission's own prefix-cache
    lookup: `computed` is the hit (local + external), so a mostly cached prompt
    is judged by what it still has to compute. `partial` and `spent` are the
    step's partial prefills and prefill tokens so far, requests that bypass
    the gate included. A prompt that finishes within this step passes while
    the step's prefill stays within the bound, plus the short-prompt room for
    a prompt with no prefix hit; any other needs a free in-flight slot and
    gets what is left of the bound.
    """
    if _dspark_hotfix_holds_kv(request):
        return 0
    need = request.num_tokens - computed
    chunk = sched._dspark_chunk
    if not chunk:  # no threshold or no chunked prefill: the count gate, judged on `need`
        if partial < sched._dspark_max_inflight_prefills or need <= token_budget:
            return 0
        return -1
    bound = sched._dspark_step_bound
    # The room beyond the bound is for prompts computed from their first
    # token: a cached turn's tail attends over its whole cached prefix, so
    # its tokens cost more per token and get only what is left of the bound.
    extra = 0 if computed else sched._dspark_short_room
    if need <= min(chunk, token_budget) and spent + need <= bound + extra:
        return 0
    room = bound - spent
    if partial >= sched._dspark_max_inflight_prefills or room <= 0:
        return -1
    return room


def _dspark_hotfix_new_prompt(request):
    """A waiting request that admission closed (DSPARK_ADMISSION_CLOSED) holds back: one that holds no KV blocks
    and that vLLM did not preempt (a preempted stream resumes: it was running when admission closed)."""
    return not _dspark_hotfix_holds_kv(request) and getattr(request.status, "name", "") != "PREEMPTED"


def _dspark_hotfix_holds_kv(request):
    # Requests that already hold KV blocks (finished async KV loads, paused
    # streaming sessions) bypass the gate: holding them back would pin their
    # blocks without progress, and the queue that drains them first could
    # otherwise wait on prefills that need those very blocks.
    return request.num_computed_tokens > 0 or (getattr(request.status, "name", "") == "WAITING_FOR_REMOTE_KVS")


def _dspark_hotfix_diag(sched, num_scheduled_tokens, inflight, spent=0):
    sched._dspark_diag_step += 1
    # Patch v8: the time since the previous line (the previous `schedule()` call's end): while the engine is busy,
    # one step's time, what gate mode 4's target bounds; the first line after a quiet spell shows the idle gap too.
    now = _dspark_hotfix_now()
    last = sched._dspark_diag_last
    sched._dspark_diag_last = now
    period = "-" if last is None else "%.1f" % ((now - last) * 1000.0)
    prefill_tokens = decode_tokens = decode_reqs = 0
    prefill_parts = []
    skipped = []
    for request in sched.running:
        rid = request.request_id
        n = num_scheduled_tokens.get(rid, 0)
        decoding = request.num_computed_tokens + 1 >= (request.num_tokens + request.num_output_placeholders)
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
                and not _dspark_hotfix_stays_partial(r, num_scheduled_tokens[r.request_id])
            )
        )
    logger.info(
        "dspark-issue27 step=%d cap=%d inflight=%d prefill_tokens=%d "
        "decode_tokens=%d decode_reqs=%d decode_skipped=%d legacy_inflight=%s "
        "mode=%d bound=%s claimed=%d prefill=[%s] skipped=[%s] room=%s target_ms=%s fit=[%s] period_ms=%s",
        sched._dspark_diag_step,
        sched._dspark_max_inflight_prefills,
        inflight,
        prefill_tokens,
        decode_tokens,
        decode_reqs,
        len(skipped),
        "-" if legacy_after is None else legacy_after,
        sched._dspark_gate_mode,
        sched._dspark_step_bound or "-",
        spent,
        ",".join(prefill_parts),
        ",".join(skipped),
        sched._dspark_room_now if sched._dspark_gate_mode >= 3 and sched._dspark_step_bound else "-",
        "%g" % sched._dspark_target_ms if sched._dspark_gate_mode == 4 else "-",
        sched._dspark_fit_note if sched._dspark_gate_mode == 4 else "-",
        period,
    )
    if legacy_after is not None and legacy_after != inflight:
        logger.warning(
            "dspark-issue27 step=%d: _inflight_prefills gives %d, the gate counts %d partial prefills in running (%s)",
            sched._dspark_diag_step,
            legacy_after,
            inflight,
            "under-count: a set-based gate would admit too many"
            if legacy_after < inflight
            else "over-count: the set also holds async KV loads",
        )


# ---- gate mode 3 (patch v5): shortest remaining work first, with aging ----


def _dspark_hotfix_init_srpt(sched):
    """Mode 3's state; set for every mode so that nothing depends on the order
    in which the other `__init__` helpers ran."""
    sched._dspark_srpt_step = 0
    sched._dspark_reserved = {}
    sched._dspark_reserved_total = 0
    sched._dspark_lent = None  # the waiting request the plan lent a slot to (it finishes within two steps)
    sched._dspark_cut = {}
    sched._dspark_room_now = 0
    sched._dspark_chunk_now = 0
    _dspark_hotfix_init_time(sched)


def _dspark_hotfix_srpt_ok(sched):
    # Mamba-aligned chunks cannot be cut to an arbitrary size: mode 3 then
    # leaves the running loop alone and gates like mode 2.
    return not getattr(sched, "need_mamba_block_aligned_split", False)


def _dspark_hotfix_arrived(sched, request):
    """At `add_request` (patch v6): aging counts from arrival, not from the
    step mode 3 first looked at the request."""
    request._dspark_seen = sched._dspark_srpt_step


def _dspark_hotfix_first_sight(sched, request):
    """Remember a request's uncached need the first time mode 3 sees it: one
    prefix-cache lookup per request, stopping at the first missed block (the
    cache's own walk); later admissions' lookups refresh it."""
    need = getattr(request, "_dspark_need", None)
    if need is not None:
        return need
    hit = 0
    if request.num_computed_tokens:
        hit = request.num_computed_tokens
    elif sched.cache_config.enable_prefix_caching and request.block_hashes:
        longest = _dspark_hotfix_readable_prefix(request)
        if longest:
            hit = sched.kv_cache_manager.coordinator.find_longest_cache_hit(request.block_hashes, longest)[1]
    need = max(1, request.num_tokens - hit)
    request._dspark_need = need
    if getattr(request, "_dspark_seen", None) is None:
        request._dspark_seen = sched._dspark_srpt_step
    request._dspark_solo = -(-need // sched._dspark_chunk)
    return need


def _dspark_hotfix_readable_prefix(request):
    """The longest prefix-cache hit admission may read for `request` (0: it reads none), as vLLM bounds it:
    from 0.34 the request's own `get_max_cache_hit_length` (its `prefix_cache_hit_limit`: 0 when it skips
    reading the cache, a prompt-logprobs start, or none); before, `skip_reading_prefix_cache` or the whole
    prompt but its last token (patch v7: v6 read `skip_reading_prefix_cache`, which 0.34 removed, as False).
    tests/test_scheduler_layouts.py checks that every supported release has the names read here."""
    bound = getattr(request, "get_max_cache_hit_length", None)
    if bound is not None:
        return 0 if request.prefix_cache_hit_limit == 0 else bound()
    return 0 if getattr(request, "skip_reading_prefix_cache", False) else request.num_tokens - 1  # < 0.25.x: no flag


def _dspark_hotfix_aged(sched, request, now):
    """Waited more than k times its solo prefill steps, or the step bound on
    any wait (whatever k the control file set): it goes first, oldest first."""
    waited = now - request._dspark_seen
    return waited > min(sched._dspark_aging * request._dspark_solo, _DSPARK_HOTFIX_AGING_MAX_WAIT)


def _dspark_hotfix_first_waiting(queue, count):
    """The first `count` requests of a waiting queue in its own order. A
    priority queue's heap is walked from its root (a frontier of at most
    `count` nodes), never copied; a FIFO queue is iterated."""
    heap = getattr(queue, "_heap", None)
    if heap is None:
        out = []
        for request in queue:
            if len(out) >= count:
                break
            out.append(request)
        return out
    import heapq as _heapq

    out = []
    frontier = [(heap[0], 0)] if heap else []
    while frontier and len(out) < count:
        request, index = _heapq.heappop(frontier)
        out.append(request)
        for child in (2 * index + 1, 2 * index + 2):
            if child < len(heap):
                _heapq.heappush(frontier, (heap[child], child))
    return out


def _dspark_hotfix_waiting_heads(sched):
    """The first requests of each queue admission takes new requests from: `waiting`, and from 0.34
    `async_kv_waiting` (requests a KV connector may load; admission takes whichever head goes first)."""
    out = _dspark_hotfix_first_waiting(sched.waiting, _DSPARK_HOTFIX_MAX_SKIPS)
    loads = getattr(sched, "async_kv_waiting", None)
    if loads:
        out = out + _dspark_hotfix_first_waiting(loads, _DSPARK_HOTFIX_MAX_SKIPS)
    return out


def _dspark_hotfix_free_tokens(sched):
    """Tokens the free KV blocks hold (None: not known on this layout)."""
    pool = getattr(sched.kv_cache_manager, "block_pool", None)
    if pool is None or not hasattr(pool, "get_num_free_blocks"):
        return None
    return pool.get_num_free_blocks() * sched.block_size


def _dspark_hotfix_admissible(sched, request):
    """Whether admission can take `request` this step as far as the plan can
    tell (its status ready, no LoRA cap in play): only then is room reserved."""
    status = getattr(request.status, "name", "")
    if status not in ("WAITING", "PREEMPTED"):
        return False
    if getattr(sched, "lora_config", None) and getattr(request, "lora_request", None):
        return False
    return not getattr(request, "num_stale_output_tokens", 0)


def _dspark_hotfix_plan(sched):
    """Mode 3: split this step's prefill room among running prompts
    mid-prefill and the first waiting requests, least uncached work left
    first; requests that waited past their aging bound go first, oldest
    first. Under the priority policy all of this is within a priority level:
    a lower value goes first, as the policy's own order has it.

    The room is the step bound while a decoding request is running; with none
    to protect it is the step's whole token budget and no chunk limit applies
    (a lone prompt or a batch without decoders runs at vLLM's own speed).

    Returns {request_id: tokens} for the running prompts mid-prefill (0:
    skipped this step; decoding requests are never in it), or None when mode
    3 is off. Room is reserved (`sched._dspark_reserved`) only for waiting
    requests admission can take: a free seat as admission counts seats, free
    KV blocks for the reserved tokens, a ready status.
    """
    sched._dspark_cut = {}
    sched._dspark_reserved = {}
    sched._dspark_reserved_total = 0
    sched._dspark_lent = None
    if sched._dspark_gate_mode < 3 or not sched._dspark_step_bound or not _dspark_hotfix_srpt_ok(sched):
        return None
    timed = sched._dspark_gate_mode == 4
    if timed:
        _dspark_hotfix_tick(sched)
    sched._dspark_srpt_step += 1
    now = sched._dspark_srpt_step
    decoders = 0
    for request in sched.running:
        if not request.is_prefill_chunk:
            decoders += 1
    protect = decoders > 0
    if protect:
        room = sched._dspark_step_bound
        chunk = sched._dspark_chunk
    else:
        room = chunk = sched.max_num_scheduled_tokens
    # Read here: `__init__` sets the policy after the hotfix's init site.
    by_priority = getattr(getattr(sched, "policy", None), "name", "") == "PRIORITY"
    candidates = []
    partials = 0
    for request in sched.running:
        if request.is_prefill_chunk:
            partials += 1
            _dspark_hotfix_first_sight(sched, request)
            left = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
            aged = _dspark_hotfix_aged(sched, request, now)
            rank = request.priority if by_priority else 0
            candidates.append(
                (
                    rank,
                    not aged,
                    request._dspark_seen if aged else left,
                    request._dspark_seen,
                    len(candidates),
                    True,
                    left,
                    request,
                )
            )
    active = getattr(sched, "max_num_active_reqs", sched.max_num_running_reqs)
    seats = active - len(sched.running) - getattr(sched, "num_waiting_for_streaming_input", 0)
    if seats > 0:
        for request in _dspark_hotfix_waiting_heads(sched):
            if _dspark_hotfix_holds_kv(request) or not _dspark_hotfix_admissible(sched, request):
                continue
            need = _dspark_hotfix_first_sight(sched, request)
            aged = _dspark_hotfix_aged(sched, request, now)
            rank = request.priority if by_priority else 0
            candidates.append(
                (
                    rank,
                    not aged,
                    request._dspark_seen if aged else need,
                    request._dspark_seen,
                    len(candidates),
                    False,
                    need,
                    request,
                )
            )
    slots = sched._dspark_max_inflight_prefills - partials
    free = _dspark_hotfix_free_tokens(sched)
    if free is not None:
        free -= getattr(sched, "num_lookahead_tokens", 0) * seats
    plan = {}
    reserved = {}
    candidates.sort()  # unique 5th field: requests are never compared
    if timed and protect:
        room, chunk = _dspark_hotfix_timed_room(sched, candidates, decoders, room)
    sched._dspark_room_now = room
    sched._dspark_chunk_now = chunk
    lent = None
    for index, candidate in enumerate(candidates):
        running, need, request = candidate[5], candidate[6], candidate[7]
        if running:
            give = min(need, chunk, room)
            plan[request.request_id] = give
            room -= give
        elif seats > 0 and room > 0:
            # Whole within the room, or a first chunk in a free slot, or (mode 4) in a slot lent by a longer
            # prompt mid-prefill (it goes after this one) when this one finishes within two steps' room: a time
            # room can be smaller than a prompt vLLM's own chunk takes whole, which the slot would otherwise
            # keep waiting until the longer prompt finishes.
            lend = False
            if need > room and slots <= 0:
                lend = (
                    timed
                    and slots == 0
                    and lent is None
                    and need <= 2 * room
                    and any(later[5] for later in candidates[index + 1 :])
                )
                if not lend:
                    continue
            give = need if need <= room else min(chunk, room)
            if free is not None:
                if give > free:
                    continue  # admission's KV allocation would refuse it: no room kept for it
                free -= give
            if lend:
                lent = request.request_id
            elif give < need:
                slots -= 1
            seats -= 1
            reserved[request.request_id] = give
            room -= give
    sched._dspark_reserved = reserved
    sched._dspark_reserved_total = sum(reserved.values())
    sched._dspark_lent = lent
    return plan


def _dspark_hotfix_planned_chunk(sched, request, num_new_tokens, plan):
    """The running loop's chunk for a prompt mid-prefill under mode 3's plan:
    never above vLLM's own chunk, except beyond its threshold when no decoding
    request runs (the plan's chunk is then the step budget); what the plan cut
    is remembered so that room admission leaves unused goes back to it."""
    give = plan[request.request_id]
    if sched._dspark_chunk_now != sched._dspark_chunk:
        left = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
        wanted = max(num_new_tokens, min(left, give))
    else:
        wanted = num_new_tokens
    if give < wanted:
        sched._dspark_cut[request.request_id] = wanted
        return give
    return wanted


def _dspark_hotfix_planned_spent(sched, num_scheduled_tokens):
    """Mode 3: the prefill tokens the running loop actually gave prompts
    mid-prefill (a prompt the plan skipped claims nothing)."""
    get = num_scheduled_tokens.get
    return sum(get(r.request_id, 0) for r in sched.running if r.is_prefill_chunk)


# ---- gate mode 4 (patch v7): mode 3's room sized in time, from the engine's own step times ----


def _dspark_hotfix_now():
    """The clock gate mode 4 reads, in seconds. The controller reads time through this one module-level function
    of the patched scheduler module and nothing else, so that a harness can drive it with a modelled clock by
    replacing it there (tools/scheduler_harness.py `ModelledClock`)."""
    return _dspark_hotfix_time.monotonic()


def _dspark_hotfix_init_time(sched):
    """Mode 4's state, set for every mode. `_dspark_lag`: how many `schedule()` calls back the step lies whose
    end a call waited for: 1 with sync scheduling, 2 with async (two steps in flight: the engine schedules the
    next step while one runs, then waits for the older one)."""
    asynchronous = bool(getattr(sched.scheduler_config, "async_scheduling", False))
    sched._dspark_lag = 2 if asynchronous or type(sched).__name__ == "AsyncScheduler" else 1
    sched._dspark_last_call = None
    sched._dspark_carried = []  # features of the last steps scheduled, oldest first
    sched._dspark_samples = []  # (features, ms), oldest first, at most _DSPARK_HOTFIX_FIT_WINDOW
    sched._dspark_sums = None  # (X'X, X'y, y'y) over the samples
    sched._dspark_sums_age = 0
    sched._dspark_fit = None  # ms per unit of each feature, or None: mode 3's bound
    sched._dspark_fit_dirty = False
    sched._dspark_fit_note = "warming 0/%d" % _DSPARK_HOTFIX_FIT_FIRST
    sched._dspark_fit_text = "none"  # the last fit computed, as the diagnostics line shows it
    sched._dspark_time_room = None
    sched._dspark_fit_top = 0.0  # the most prefill tokens a step of the window carried


def _dspark_hotfix_carried(sched, num_scheduled_tokens):
    """Mode 4, at the end of `schedule()`: what the step carries, as the fit's features (1, prefill tokens /
    1000, prefill token-context products / 1e7, decode and draft tokens / 10, requests). A step that schedules
    nothing ends the chain: the engine then finishes every step in flight before the next call."""
    if not num_scheduled_tokens:
        sched._dspark_carried = []
        return
    prefill = context = decode = 0
    requests = sched.requests
    for rid, n in num_scheduled_tokens.items():
        request = requests.get(rid)
        if request is not None and _dspark_hotfix_prefilling(request):
            prefill += n
            context += n * (request.num_computed_tokens + n * 0.5)
        else:
            decode += n
    carried = sched._dspark_carried
    carried.append((1.0, prefill * 1e-3, context * 1e-7, decode * 0.1, float(len(num_scheduled_tokens))))
    if len(carried) > sched._dspark_lag:
        del carried[0]


def _dspark_hotfix_tick(sched):
    """Mode 4, at the top of `schedule()`: the time since the previous call is the step time of the step that
    call's engine loop waited for (`_dspark_lag` calls back); with what it carried it becomes a sample. No
    sample across a mode change, an empty step, or a gap far beyond the fit's prediction (an idle engine)."""
    now = _dspark_hotfix_now()
    last = sched._dspark_last_call
    sched._dspark_last_call = now
    carried = sched._dspark_carried
    lag = sched._dspark_lag
    if last is None or len(carried) < lag:
        return
    x = carried[-lag]
    del carried[: len(carried) - lag + 1]
    ms = (now - last) * 1000.0
    if ms <= 0.0:
        return
    fit = sched._dspark_fit
    if fit is not None and ms > 8.0 * max(1e-3, sum(a * b for a, b in zip(fit, x))):
        return
    _dspark_hotfix_sample(sched, x, ms)


def _dspark_hotfix_sample(sched, x, ms):
    """One (features, ms) sample into the window; the normal equations' sums follow it (rebuilt from the
    window once a window of samples went by, so that rounding never accumulates)."""
    samples = sched._dspark_samples
    samples.append((x, ms))
    old = samples.pop(0) if len(samples) > _DSPARK_HOTFIX_FIT_WINDOW else None
    sched._dspark_sums_age += 1
    if sched._dspark_sums is None or sched._dspark_sums_age >= _DSPARK_HOTFIX_FIT_WINDOW:
        size = len(x)
        xtx = [[0.0] * size for _ in range(size)]
        xty = [0.0] * size
        yy = 0.0
        for sx, sy in samples:
            for i in range(size):
                xi = sx[i]
                row = xtx[i]
                for j in range(size):
                    row[j] += xi * sx[j]
                xty[i] += xi * sy
            yy += sy * sy
        sched._dspark_sums = (xtx, xty, yy)
        sched._dspark_sums_age = 0
    else:
        xtx, xty, yy = sched._dspark_sums
        for sign, (sx, sy) in ((1.0, (x, ms)),) + (((-1.0, old),) if old is not None else ()):
            for i in range(len(sx)):
                xi = sign * sx[i]
                row = xtx[i]
                for j in range(len(sx)):
                    row[j] += xi * sx[j]
                xty[i] += xi * sy
            yy += sign * sy * sy
        sched._dspark_sums = (xtx, xty, yy)
    sched._dspark_fit_dirty = True


def _dspark_hotfix_fit(sched):
    """Least squares over the window (a ridge of 1e-5 of each feature's own square sum on every feature but the
    constant: decode tokens and requests move together): ms per unit of each feature, or None while there are too few
    samples or the fit is implausible (a prefill token costing nothing or more than the contract's maximum, a
    threshold's chunk costing less than its minimum, residuals above its share of the mean step time). From
    `_DSPARK_HOTFIX_FIT_FIRST` samples a first fit leaves the decode-token term out (its note: n=k/full); from
    `_DSPARK_HOTFIX_FIT_MIN` every term is fitted. A window without prefill, or with one prefill size only, keeps
    the last fit. `_dspark_fit_note` says which, for the diagnostics line."""
    if not sched._dspark_fit_dirty:
        return sched._dspark_fit
    sched._dspark_fit_dirty = False
    n = len(sched._dspark_samples)
    if n < _DSPARK_HOTFIX_FIT_FIRST:
        sched._dspark_fit = None
        sched._dspark_fit_note = "warming %d/%d" % (n, _DSPARK_HOTFIX_FIT_FIRST)
        return None
    top = 0.0
    for x, _ in sched._dspark_samples:
        if x[1] > top:
            top = x[1]
    if not top:  # no prefill in the window: its cost cannot be fitted; the last fit stands
        sched._dspark_fit_note = "kept (no prefill in the window) " + sched._dspark_fit_text
        return sched._dspark_fit
    sched._dspark_fit_top = top * 1000.0
    xtx, xty, yy = sched._dspark_sums
    if xtx[1][1] * n - xtx[0][1] ** 2 <= 1e-6 * xtx[1][1] * n:  # n^2 x the prefill feature's variance
        # Every step of the window carried the same prefill (a target below one block's cost): the prefill
        # cost cannot be told from the constant; the last fit stands.
        sched._dspark_fit_note = "kept (one prefill size in the window) " + sched._dspark_fit_text
        return sched._dspark_fit
    features = len(xty)
    # Below the full fit's samples, a first fit without the decode-token term (decode tokens and requests
    # move together): four terms from a few steps, so that the target holds from the first steps on.
    used = range(features) if n >= _DSPARK_HOTFIX_FIT_MIN else (0, 1, 2, 4)
    size = len(used)
    a = [[xtx[i][j] for j in used] + [xty[i]] for i in used]
    for k in range(1, size):  # relative: the features' scales differ by orders of magnitude between setups
        a[k][k] += 1e-5 * xtx[used[k]][used[k]] + 1e-12
    for col in range(size):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, size), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            sched._dspark_fit = None
            sched._dspark_fit_note = "singular n=%d" % n
            return None
        a[col], a[pivot] = a[pivot], a[col]
        head = a[col]
        inv = 1.0 / head[col]
        for r in range(size):
            if r != col and a[r][col]:
                f = a[r][col] * inv
                row = a[r]
                for c in range(col, size + 1):
                    row[c] -= f * head[c]
    beta = [0.0] * features
    for k, i in enumerate(used):
        beta[i] = a[k][size] / a[k][k]
    sse = (
        yy - 2.0 * sum(beta[i] * xty[i] for i in used) + sum(beta[i] * beta[j] * xtx[i][j] for i in used for j in used)
    )
    mean = xty[0] / n
    error = (max(sse, 0.0) / n) ** 0.5 / mean if mean > 0 else float("inf")
    per_token = beta[1] * 1e-3
    sched._dspark_fit_note = sched._dspark_fit_text = (
        "n=%s base=%.1fms prefill=%.4gms/tok context=%.3gms/Mtok^2 decode=%.3gms/tok req=%.3gms err=%.2f"
        % (
            n if size == features else "%d/%d" % (n, _DSPARK_HOTFIX_FIT_MIN),
            beta[0],
            per_token,
            beta[2] * 0.1,
            beta[3] * 0.1,
            beta[4],
            error,
        )
    )
    chunk = sched._dspark_chunk or sched.max_num_scheduled_tokens
    chunk_ms = per_token * chunk + max(beta[2], 0.0) * 1e-7 * chunk * chunk * 0.5
    if (
        not 0.0 < per_token <= _DSPARK_HOTFIX_FIT_MAX_TOKEN_MS
        or chunk_ms < _DSPARK_HOTFIX_FIT_MIN_CHUNK_MS
        or error > _DSPARK_HOTFIX_FIT_MAX_ERROR
    ):
        sched._dspark_fit = None
        sched._dspark_fit_note = sched._dspark_fit_text = "implausible " + sched._dspark_fit_text
        return None
    sched._dspark_fit = beta
    return beta


def _dspark_hotfix_timed_room(sched, candidates, decoders, bound):
    """Mode 4 while requests decode: (room, chunk) of this step. The room is the prefill tokens whose predicted
    cost, beside the decoders' tokens and requests, keeps the step within the target, at the context of the
    work that takes the room (the plan's first candidates); never less than a block (a waiting prompt always
    progresses), never more than the budget, and never more than twice the most prefill a step of the fit's
    window carried, nor than the bound before that (the fit is not trusted far outside what it saw: the room
    grows by doublings). A chunk may then go past vLLM's threshold up to the room. No fit: mode 3's bound and
    chunk."""
    fit = _dspark_hotfix_fit(sched)
    if fit is None:
        sched._dspark_time_room = None
        return bound, sched._dspark_chunk
    spec = getattr(sched, "num_spec_tokens", 0) or 0
    base = fit[0] + fit[3] * 0.1 * decoders * (1 + spec) + fit[4] * (decoders + 1)
    left = sched._dspark_target_ms - base
    per_token = fit[1] * 1e-3
    per_context = max(fit[2] * 1e-7, 0.0)
    if base <= 0.0:
        sched._dspark_time_room = None
        sched._dspark_fit_note = "implausible base %.1fms " % base + sched._dspark_fit_note
        return bound, sched._dspark_chunk
    # The context the room's tokens attend over: the deepest among the candidates that take it.
    estimate = left / per_token if left > 0 else 0.0
    context = taken = 0
    for candidate in candidates:
        request, need = candidate[7], candidate[6]
        at = request.num_computed_tokens if candidate[5] else max(0, request.num_tokens - need)
        context = max(context, at)
        taken += need
        if taken >= estimate:
            break
    tokens = 0.0
    if left > 0:
        b = per_token + per_context * context
        if per_context > 0:
            tokens = (-b + (b * b + 2.0 * per_context * left) ** 0.5) / per_context
        else:
            tokens = left / b
    block = getattr(sched, "block_size", 16) or 16
    trusted = max(bound, 2.0 * sched._dspark_fit_top)
    room = int(max(block, min(tokens, trusted, sched.max_num_scheduled_tokens)))
    sched._dspark_time_room = room
    return room, max(room, sched._dspark_chunk)


def _dspark_hotfix_admit_srpt(sched, request, computed, token_budget, partial, spent):
    """Mode 3's admission, after admission's own prefix-cache lookup: -1 holds
    `request` back; 0 admits it as vLLM would; n > 0 admits it with at most n
    tokens this step, past vLLM's threshold (its budget still applies):
    `request.num_tokens` when the whole prompt fits the step's room.

    The room is the step's (the bound, or the budget with no decoding request
    to protect) less what running prompts got and what the plan promised
    other waiting requests with less work left. A prompt that would stay
    mid-prefill needs a free in-flight slot, as in modes 0-2. The limit only
    sizes the chunk vLLM computes; the patched site never applies it to a
    request vLLM padded for speculative decoding.
    """
    if _dspark_hotfix_holds_kv(request):
        return 0
    if not sched._dspark_chunk or not _dspark_hotfix_srpt_ok(sched):
        return _dspark_hotfix_admit(sched, request, computed, token_budget, partial, spent)
    need = request.num_tokens - computed
    request._dspark_need = max(1, need)
    if getattr(request, "_dspark_seen", None) is None:
        request._dspark_seen = sched._dspark_srpt_step
    request._dspark_solo = -(-request._dspark_need // sched._dspark_chunk)
    mine = sched._dspark_reserved.pop(request.request_id, 0)
    sched._dspark_reserved_total -= mine
    room = min(sched._dspark_room_now - spent - sched._dspark_reserved_total, token_budget)
    if need <= room:
        # The whole prompt: a limit no chunk can reach, so that the first
        # chunk is everything left to compute (on layouts with bounded prefix
        # replay that includes the replayed window, which `need` does not).
        return request.num_tokens
    if room <= 0 or (partial >= sched._dspark_max_inflight_prefills and request.request_id != sched._dspark_lent):
        return -1
    return min(room, sched._dspark_chunk_now)


def _dspark_hotfix_give_back(
    sched, num_scheduled_tokens, req_to_new_blocks, scheduled_running_reqs, token_budget, input_budget, draft_slots
):
    """Mode 3, after admission (patch v6): room the plan cut from running
    prompts for waiting requests that admission did not take goes back to
    those prompts in the same step, in the plan's order, up to vLLM's own
    chunk and within the step's room; each extra chunk goes through vLLM's
    own rules (the model length, the MTP prefill lookahead) and a KV
    allocation of its own. Returns (token_budget, input_budget, drafts): `drafts` is True when a chunk it
    grew samples a token whose drafts will be used (patch v7: from 0.33 `schedule()` tells the model
    runner to skip drafting when no scheduled request can use them, decided before this give-back)."""
    cut = sched._dspark_cut
    drafts = False
    if not cut:
        return token_budget, input_budget, drafts
    requests = sched.requests
    spent = 0
    for rid, n in num_scheduled_tokens.items():
        request = requests.get(rid)
        if request is not None and _dspark_hotfix_prefilling(request):
            spent += n
    room = sched._dspark_room_now - spent
    for request in list(sched.running):
        rid = request.request_id
        wanted = cut.get(rid)
        if wanted is None or room <= 0 or token_budget <= 0:
            continue
        if input_budget is not None and input_budget <= draft_slots:
            break
        have = num_scheduled_tokens.get(rid, 0)
        total = min(wanted, have + room, have + token_budget)
        if input_budget is not None:
            total = min(total, have + input_budget - draft_slots)
        total = min(
            total, sched.max_model_len - request.num_computed_tokens - getattr(sched, "num_sampled_tokens_per_step", 1)
        )
        if getattr(sched, "num_prefill_lookahead", 0):
            total = sched._reserve_prefill_lookahead(request, request.num_computed_tokens, total)
        if total <= have or getattr(request, "has_encoder_inputs", False):
            continue
        new_blocks = sched.kv_cache_manager.allocate_slots(
            request, total, num_lookahead_tokens=getattr(sched, "num_lookahead_tokens", 0)
        )
        if new_blocks is None:
            continue
        extra = total - have
        if have:
            req_to_new_blocks[rid] = req_to_new_blocks[rid] + new_blocks
        else:
            req_to_new_blocks[rid] = new_blocks
            scheduled_running_reqs.append(request)
            if input_budget is not None:
                input_budget -= draft_slots
        num_scheduled_tokens[rid] = total
        unused = getattr(sched, "_drafts_unused", None)
        if unused is not None and not unused(request, request.num_computed_tokens, total):
            drafts = True
        token_budget -= extra
        if input_budget is not None:
            input_budget -= extra
        room -= extra
    sched._dspark_cut = {}
    return token_budget, input_budget, drafts


def _dspark_hotfix_prefilling(request):
    """Prefilling in the step being scheduled (its position is not yet moved)."""
    return request.num_computed_tokens + 1 < request.num_tokens + request.num_output_placeholders


# ---- live changes (patch v5): the control file of `dspark reload` ----


def _dspark_hotfix_live_init(sched, values, defaults):
    """Remember the start values; a control file already there is applied now."""
    sched._dspark_live_path = _dspark_hotfix_os.environ.get(_DSPARK_HOTFIX_CONTROL_ENV, "").strip()
    sched._dspark_live_start = dict(values)
    sched._dspark_live_defaults = defaults
    sched._dspark_live_seen = None  # (inode, size, mtime) of the file last read; None: no file
    sched._dspark_live_bad = None  # the problem last warned about (one warning per bad content)
    sched._dspark_live_next = 0.0
    _dspark_hotfix_live_check(sched)


def _dspark_hotfix_live_check(sched):
    """At the top of every `schedule()`: a monotonic-clock test; at most once a
    period one `stat` of the control file, read only when its inode, size or
    mtime changed."""
    path = sched._dspark_live_path
    if not path:
        return
    now = _dspark_hotfix_time.monotonic()
    if now < sched._dspark_live_next:
        return
    sched._dspark_live_next = now + _DSPARK_HOTFIX_LIVE_PERIOD_S
    try:
        st = _dspark_hotfix_os.stat(path, follow_symlinks=False)
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        seen = None
    except OSError as exc:
        seen = ("unreadable", str(exc))
    if seen == sched._dspark_live_seen:
        return
    sched._dspark_live_seen = seen
    _dspark_hotfix_live_apply(sched, path, seen is not None)


def _dspark_hotfix_shown(setting, value):
    """A value as the live log line's format takes it (a switch as on/off)."""
    return ("on" if value else "off") if setting[1] == "switch" else value


def _dspark_hotfix_text(setting, value):
    """A value as text, the way the live log line shows it."""
    if setting[1] == "decimal":
        return "%g" % value
    return str(_dspark_hotfix_shown(setting, value))


def _dspark_hotfix_live_apply(sched, path, exists):
    """The file's values through the start parsers, over the start values (no
    file: the start values); any bad value keeps every current one."""
    values, problem = _dspark_hotfix_live_read(path) if exists else ({}, None)
    wanted = dict(sched._dspark_live_start)
    for setting in _DSPARK_HOTFIX_LIVE:
        if problem is None and setting[0] in values:
            raw = values[setting[0]]
            wanted[setting[0]], bad = _dspark_hotfix_parse(setting, raw, sched._dspark_live_defaults[setting[0]])
            if bad:
                problem = "%s=%r (expected %s)" % (setting[0], raw, _dspark_hotfix_expected(setting))
    now = {setting[0]: getattr(sched, setting[6]) for setting in _DSPARK_HOTFIX_LIVE}
    if problem is not None:
        if problem != sched._dspark_live_bad:
            sched._dspark_live_bad = problem
            keeping = ", ".join("%s %s" % (s[5], _dspark_hotfix_text(s, now[s[0]])) for s in _DSPARK_HOTFIX_LIVE)
            logger.warning(_DSPARK_HOTFIX_LIVE_WARNING, _DSPARK_HOTFIX_PATCH_VERSION, path, problem, keeping)
        return
    sched._dspark_live_bad = None
    changes = []
    for setting in _DSPARK_HOTFIX_LIVE:
        before, after = now[setting[0]], wanted[setting[0]]
        if before != after:
            changes.append(
                "%s %s -> %s" % (setting[5], _dspark_hotfix_text(setting, before), _dspark_hotfix_text(setting, after))
            )
    _dspark_hotfix_set(sched, wanted)
    logger.info(
        _DSPARK_HOTFIX_LIVE_LOG,
        _DSPARK_HOTFIX_PATCH_VERSION,
        ", ".join(changes) or "no change",
        *[_dspark_hotfix_shown(s, wanted[s[0]]) for s in _DSPARK_HOTFIX_LIVE],
        sched._dspark_step_bound or "none",
    )


def _dspark_hotfix_live_read(path):
    """(values by name, problem): `NAME=VALUE` lines of the live names (blank
    lines and `#` comments skipped) from a small plain file of this user that
    only it can write, opened without following a link."""
    os_ = _dspark_hotfix_os
    try:
        fd = os_.open(path, os_.O_RDONLY | os_.O_NOFOLLOW | os_.O_NONBLOCK | os_.O_CLOEXEC)
    except OSError as exc:
        return {}, "cannot open it (%s)" % (exc.strerror or exc)
    try:
        st = os_.fstat(fd)
        if not _dspark_hotfix_stat.S_ISREG(st.st_mode) or st.st_uid != os_.geteuid() or st.st_mode & 0o022:
            return {}, "not a plain file of this user that only it can write (uid %d, mode %04o)" % (
                st.st_uid,
                _dspark_hotfix_stat.S_IMODE(st.st_mode),
            )
        data = os_.read(fd, _DSPARK_HOTFIX_CONTROL_MAX_BYTES + 1)
    except OSError as exc:
        return {}, "cannot read it (%s)" % (exc.strerror or exc)
    finally:
        try:
            os_.close(fd)
        except OSError:  # never into schedule(): the values read stand
            pass
    if len(data) > _DSPARK_HOTFIX_CONTROL_MAX_BYTES:
        return {}, "larger than %d bytes" % _DSPARK_HOTFIX_CONTROL_MAX_BYTES
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {}, "not UTF-8 text"
    names = tuple(setting[0] for setting in _DSPARK_HOTFIX_LIVE)
    values = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or name.strip() not in names:
            return {}, "line %d %r is not NAME=VALUE with NAME one of %s" % (number, line[:80], ", ".join(names))
        values[name.strip()] = value
    return values, None
