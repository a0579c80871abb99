"""What the server log says: the start phase, the KV cache size, the hotfix's cap."""

from __future__ import annotations

import re

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
HOTFIX_ACTIVE = re.compile(r"dspark-issue27 hotfix v(\d+) active: cap=(\d+)")


def phase(text: str) -> str:
    best, where = "starting", -1
    for needle, name in PHASES:
        position = text.rfind(needle)
        if position > where:
            best, where = name, position
    return best


def kv_cache_tokens(text: str) -> int | None:
    match = KV_CACHE.search(text)
    return int(match.group(2).replace(",", "")) if match else None


def hotfix_cap(text: str) -> int | None:
    """The cap the EngineCore's patched scheduler reported, None if it never did (unpatched)."""
    found = HOTFIX_ACTIVE.findall(text)
    return int(found[-1][1]) if found else None
