"""What the server log says: the start phase, the KV cache size, the hotfix's cap."""

from __future__ import annotations

import re

from dspark_launch.hotfix.contract import ACTIVE_LOG_RE

# Ordered: the last one seen is the phase the start is in.
PHASES = (
    ("non-default args:", "parsing arguments"),
    ("Starting to load model", "loading weights"),
    ("Loading weights took", "weights loaded"),
    ("Warming up model", "compiling"),
    ("Capturing CUDA graphs", "capturing graphs"),
    ("KV cache size:", "KV cache allocated"),
    ("init engine (profile, create kv cache, warmup model) took", "engine ready"),
    ("Starting vLLM server on", "API starting"),
)
KV_CACHE = re.compile(r"(\w+) KV cache size: ([\d,]+) tokens")
# vLLM's own bar (model_loader/weight_utils.py _BAR_FORMAT): "Loading safetensors checkpoint shards: 45% Completed |
# 19/41"
SHARDS = re.compile(r"Loading safetensors checkpoint shards[^:\n]*:\s*\d+% Completed \| (\d+)/(\d+)")
HOTFIX_ACTIVE = ACTIVE_LOG_RE  # groups: patch version, cap, gate mode, step bound


def phase(text: str) -> str:
    best, where = "starting", -1
    for needle, name in PHASES:
        position = text.rfind(needle)
        if position > where:
            best, where = name, position
    return best


def shards_loaded(text: str) -> tuple[int, int] | None:
    """(loaded, total) from vLLM's last "Loading safetensors checkpoint shards" line; None before it."""
    found = SHARDS.findall(text)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def kv_cache_tokens(text: str) -> int | None:
    match = KV_CACHE.search(text)
    return int(match.group(2).replace(",", "")) if match else None


def hotfix_cap(text: str) -> int | None:
    """The cap the EngineCore's patched scheduler reported, None if it never did (unpatched)."""
    found = HOTFIX_ACTIVE.findall(text)
    return int(found[-1][1]) if found else None


# The first error of a dying engine names the cause; later ones (EngineDeadError, the
# API server's shutdown) only repeat that it died.
_ERROR_LINE = re.compile(r"(?:^|\] |\s)((?:[A-Za-z_][\w.]*)(?:Error|Exception|Died)\b(?::[^\n]*)?)$")
_ECHOES = ("EngineDeadError", "EngineGenerateError", "CancelledError", "KeyboardInterrupt")


def failure(text: str) -> str:
    """One short phrase for why the server stopped, from its log."""
    causes = []
    for line in text.splitlines():
        match = _ERROR_LINE.search(line.rstrip())
        if match and not any(echo in match.group(1) for echo in _ECHOES):
            causes.append(match.group(1).strip())
    if "Executor failed" in text or "EngineDeadError" in text:
        cause = next((c for c in causes if "Executor failed" in c), causes[0] if causes else "EngineDeadError")
        return f"the engine failed ({cause[:120]})"
    if causes:
        return f"it exited after {causes[-1][:120]}"
    return "it exited (no error in its log)"
