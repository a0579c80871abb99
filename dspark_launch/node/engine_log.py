"""The lines vLLM's EngineCore itself wrote to the server log, found by its logger's prefix at the line's start.

`dspark reload` waits for the patched scheduler's `(live)` line and the head's agent reads the EngineCore's
drain lines while `stop` drains. Other text lands in the same log: a client's prompt (request logging), and,
were it on, uvicorn's access log, whose lines carry no vLLM prefix and the client address a client on
127.0.0.1 sets with `X-Forwarded-For` (the launcher turns that log off: `--disable-uvicorn-access-log`,
serve/serve_spec.py). So only a line that *starts* with the EngineCore's own prefix counts:

    (EngineCore pid=N) LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE          (vLLM 0.32 to 0.34, vllm/logger.py
    (EngineCore_DP<rank> pid=N) ...                                       `_FORMAT`, VLLM_LOGGING_PREFIX "")

the process name exactly vLLM's (`EngineCore`, or `EngineCore_DP<rank>` with data parallel: the name vLLM
gives the process it starts, vllm/v1/engine/utils.py), from the expected source file, and, where the reader
knows the run's processes (the head's agent while it drains), from one of their pids. vLLM continues a
multi-line message with the same record's prefix, so a prompt logged by the API server cannot start such a
line. Lines are split on "\\n" only: `str.splitlines` also splits on U+0085, U+2028 and the like, which a
logged request id or prompt may hold unescaped.

`VLLM_LOGGING_PREFIX`, the logging config and the log level are not forwarded (config/forward_env.py): the
prefix is vLLM's default, empty.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

_ENGINE_LINE = re.compile(
    r"\(EngineCore(?:_DP(?P<rank>\d+))? pid=(?P<pid>\d+)\) (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[(?:[^\]\s]*/)?(?P<file>[\w.-]+):\d+\] (?P<message>.*)",
    re.ASCII,
)


@dataclass(frozen=True)
class EngineMessage:
    rank: int  # the data-parallel rank of the EngineCore that logged it (0 without data parallel)
    message: str
    pid: int = field(default=0, compare=False)  # the process that logged it, as its prefix says


def engine_line(line: str, source_file: str, pids: Collection[int] | None = None) -> EngineMessage | None:
    """One log line (without its "\\n") as the EngineCore logged it from `source_file` (and, given `pids`, from
    one of them), else None. The prefix must start the line."""
    match = _ENGINE_LINE.fullmatch(line)  # a "\n" inside: not one line
    if not match or match.group("file") != source_file:
        return None
    pid = int(match.group("pid"))
    if pids is not None and pid not in pids:
        return None
    return EngineMessage(int(match.group("rank") or 0), match.group("message"), pid)


def log_lines(text: str) -> list[str]:
    """`text` split into the log's lines: at "\\n" only (a "\\r" before it dropped)."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def engine_lines(text: str, source_file: str, pids: Collection[int] | None = None) -> list[EngineMessage]:
    """The lines, in order, that the EngineCores logged from `source_file`, with the rank of each."""
    return [said for line in log_lines(text) if (said := engine_line(line, source_file, pids)) is not None]
