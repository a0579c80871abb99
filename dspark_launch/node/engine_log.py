"""The lines vLLM's EngineCore itself wrote to the server log, found by its logger's prefix and position.

`dspark reload` waits for the patched scheduler's `(live)` line and the head's agent reads the EngineCore's
drain lines while `stop` drains; with request logging on, a client's prompt lands in the same log, so a line matched anywhere could
be forged. vLLM's logger writes `[VLLM_LOGGING_PREFIX](PROCESS pid=N) LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE`,
and continues a multi-line message with the same prefix; only a line that starts with the EngineCore's
prefix and the expected source file counts, and only its message from its start.
"""

from __future__ import annotations

import re

_ENGINE_LINE = re.compile(r"[^(]*\(EngineCore[\w-]* pid=\d+\) (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                          r"\d\d-\d\d \d\d:\d\d:\d\d \[(?:[^\]\s]*/)?(?P<file>[\w.-]+):\d+\] (?P<message>.*)")


def engine_message(line: str, source_file: str) -> str | None:
    """The message of one log line when the EngineCore logged it from `source_file`, else None."""
    match = _ENGINE_LINE.fullmatch(line)
    return match.group("message") if match and match.group("file") == source_file else None


def engine_messages(text: str, source_file: str) -> list[str]:
    """The messages, in order, that the EngineCore logged from `source_file` (`scheduler.py`, `core.py`)."""
    return [message for line in text.splitlines() if (message := engine_message(line, source_file)) is not None]


def engine_text(text: str, source_file: str) -> str:
    """Those messages one a line, for the patterns that read them."""
    return "".join(f"{message}\n" for message in engine_messages(text, source_file))
