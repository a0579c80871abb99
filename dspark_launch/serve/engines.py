"""How many EngineCores one `vllm serve` runs: one, or `--data-parallel-size` of them.

Every one runs on the head (config/serve_flags.py refuses the flags that would place an engine on
another node or behind another API server), reads the same scheduler control file and logs into the
same server log as `EngineCore_DP<rank>`: `reload` waits for each rank's line and `stop` for each
engine's drain.
"""

from __future__ import annotations

import shlex

_SPELLINGS = ("--data-parallel-size", "-dp")


def engine_count(extra_args: str) -> int:
    """The data-parallel size VLLM_EXTRA_ARGS gives `vllm serve` (vLLM takes the last one), else 1."""
    try:
        words = shlex.split(extra_args)
    except ValueError:
        words = extra_args.split()
    count = 1
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        if name.replace("_", "-") not in _SPELLINGS:
            continue
        if not equals:
            value = words[index + 1] if index + 1 < len(words) else ""
        if value.isdigit() and int(value) > 0:
            count = int(value)
    return count
