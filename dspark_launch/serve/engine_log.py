"""The lines vLLM's EngineCore itself wrote to the server log, found by its logger's prefix and position.

`dspark reload` waits for the patched scheduler's `(live)` line and `stop` reads the EngineCore's drain
line; with request logging on, a client's prompt lands in the same log, so a line matched anywhere could
be forged. vLLM's logger writes `[VLLM_LOGGING_PREFIX](PROCESS pid=N) LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE`,
and continues a multi-line message with the same prefix; only a line that starts with the EngineCore's
prefix and the expected source file counts, and only its message from its start.
"""

from __future__ import annotations

import re

_ENGINE_LINE = re.compile(r"[^(]*\(EngineCore[\w-]* pid=\d+\) (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                          r"\d\d-\d\d \d\d:\d\d:\d\d \[(?:[^\]\s]*/)?(?P<file>[\w.-]+):\d+\] (?P<message>.*)")


def engine_messages(text: str, source_file: str) -> list[str]:
    """The messages, in order, that the EngineCore logged from `source_file` (`scheduler.py`, `core.py`)."""
    found = []
    for line in text.splitlines():
        match = _ENGINE_LINE.fullmatch(line)
        if match and match.group("file") == source_file:
            found.append(match.group("message"))
    return found


def engine_text(text: str, source_file: str) -> str:
    """Those messages one a line, for the patterns that read them."""
    return "".join(f"{message}\n" for message in engine_messages(text, source_file))
