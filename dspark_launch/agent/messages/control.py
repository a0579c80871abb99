"""The scheduler's live values: its control file (handlers/control.py; `dspark reload`)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.agent.protocol import Request


@dataclass(frozen=True)
class SchedulerControl(Request["SchedulerControlAnswer"]):
    """Replace the patched scheduler's control file at `path` by `text` (a new 0600 file of the serving
    user renamed over it, in a folder only that user can write), or remove it (`remove`)."""

    path: str
    text: str = ""
    remove: bool = False


@dataclass(frozen=True)
class SchedulerControlAnswer:
    path: str
    existed: bool  # a file was there before
