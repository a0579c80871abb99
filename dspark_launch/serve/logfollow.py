"""A log on a node, read through its agent: all of it so far, or what was added since."""

from __future__ import annotations

from typing import Callable, Iterator

from dspark_launch.agent import protocol as p
from dspark_launch.agent.client import NodeAgent

END = 1 << 62  # an offset past any end: "from now on"


class LogReader:
    """Accumulates a node's log as it grows (the agent returns at most READ_CHUNK bytes per call)."""

    def __init__(self, agent: NodeAgent, path: str):
        self.agent, self.path = agent, path
        self.offset = 0
        self.text = ""

    def new_text(self) -> str:
        """What was written since the last call (everything, at first)."""
        added = []
        while True:
            answer = self.agent.call(p.ReadLog(self.path, self.offset))
            if answer.offset < self.offset:  # rotated or truncated: start over
                self.text, self.offset = "", 0
                continue
            read, self.offset = answer.offset - self.offset, answer.offset
            added.append(answer.text)
            if read < p.READ_CHUNK:
                break
        return "".join(added)

    def refresh(self) -> str:
        """The whole log so far."""
        self.text += self.new_text()
        return self.text


def follow(agent: NodeAgent, paths: list[str], sleep: Callable[[float], None], interval: float = 1.0) -> Iterator[str]:
    """New text of each log from now on, forever (`logs --follow`); the caller stops iterating."""
    readers = [LogReader(agent, path) for path in paths]
    for reader in readers:
        reader.offset = agent.call(p.ReadLog(reader.path, END)).offset
    while True:
        for reader in readers:
            text = reader.new_text()
            if text:
                yield text
        sleep(interval)
