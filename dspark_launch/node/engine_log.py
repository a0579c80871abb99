"""The lines vLLM's EngineCore itself wrote to the server log, found by its logger's prefix and position.

`dspark reload` waits for the patched scheduler's `(live)` line and the head's agent reads the EngineCore's
drain lines while `stop` drains; with request logging on, a client's prompt lands in the same log, so a line matched anywhere could
be forged. vLLM's logger writes `[VLLM_LOGGING_PREFIX](PROCESS pid=N) LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE`,
and continues a multi-line message with the same prefix; only a line that starts with the EngineCore's
prefix and the expected source file counts, and only its message from its start.

With `--data-parallel-size N` vLLM runs N EngineCores, each logging as `EngineCore_DP<rank>`; a plain
`EngineCore` is rank 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ENGINE_LINE = re.compile(r"[^(]*\(EngineCore(?:_DP(?P<rank>\d+))?[\w-]* pid=\d+\) (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                          r"\d\d-\d\d \d\d:\d\d:\d\d \[(?:[^\]\s]*/)?(?P<file>[\w.-]+):\d+\] (?P<message>.*)")


@dataclass(frozen=True)
class EngineMessage:
    rank: int  # the data-parallel rank of the EngineCore that logged it (0 without data parallel)
    message: str


def engine_line(line: str, source_file: str) -> EngineMessage | None:
    """One log line as the EngineCore logged it from `source_file`, else None."""
    match = _ENGINE_LINE.fullmatch(line)
    if not match or match.group("file") != source_file:
        return None
    return EngineMessage(int(match.group("rank") or 0), match.group("message"))


def engine_lines(text: str, source_file: str) -> list[EngineMessage]:
    """The lines, in order, that the EngineCores logged from `source_file`, with the rank of each."""
    return [said for line in text.splitlines() if (said := engine_line(line, source_file)) is not None]
