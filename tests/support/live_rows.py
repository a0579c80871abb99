"""A live setting's row as the injected code holds it (a row of `_DSPARK_HOTFIX_LIVE`, rendered from the table)."""

from __future__ import annotations

from dspark_launch.hotfix import contract


def live_row(name: str) -> tuple:
    return contract.live_row(contract.LIVE[name])
