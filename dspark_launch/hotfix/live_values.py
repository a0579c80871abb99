"""A live setting's raw value as the patched scheduler parses it: its own injected parser, for the launcher
(`reload` waits for what the scheduler will hold, not for what the launcher would have parsed)."""

from __future__ import annotations

from dspark_launch.hotfix.contract import LiveSetting, live_row
from dspark_launch.hotfix.injected import _dspark_hotfix_parse


def scheduler_value(setting: LiveSetting, raw: str | None) -> int | float | bool:
    value: int | float | bool = _dspark_hotfix_parse(live_row(setting), raw)[0]
    return value
