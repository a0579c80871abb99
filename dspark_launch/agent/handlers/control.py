"""The node agent's `scheduler_control` operation (stdlib only): the patched scheduler's control file
(`dspark reload`) written atomically and privately, or removed, on the node where the scheduler runs."""

from __future__ import annotations

import os
from pathlib import Path

from dspark_launch.agent import protocol as p
from dspark_launch.hotfix.contract import CONTROL_MAX_BYTES
from dspark_launch.node.safe_path import UnsafePath, check_ancestors, check_dir, log_owner, write_private

STEP = "scheduler control file"


def _refuse(detail: str) -> p.OperationFailed:
    return p.OperationFailed(p.Failure(STEP, f"{detail}; nothing was written"))


def scheduler_control(req: p.SchedulerControl, report: p.Report) -> p.SchedulerControlAnswer:
    """The file lives in a folder only the serving user (or, in a rootful node container, the state
    folder's owner) can write: a new 0600 file renamed over the old one, never a link followed."""
    path = Path(req.path)
    if not path.is_absolute() or path.name in ("", ".", ".."):
        raise _refuse(f"{req.path!r} is not an absolute file path")
    if len(req.text.encode("utf-8")) > CONTROL_MAX_BYTES:
        raise _refuse(f"{len(req.text)} characters: the scheduler reads at most {CONTROL_MAX_BYTES} bytes")
    try:
        owner = log_owner(path.parent)
        check_ancestors(path.parent, owner)
        check_dir(path.parent, owner=owner)
    except UnsafePath as exc:
        raise _refuse(f"{exc}: whoever can write there could set the scheduler's values") from None
    existed = os.path.lexists(path)
    try:
        if req.remove:
            if existed:
                path.unlink()
        else:
            write_private(path, req.text)
    except OSError as exc:
        raise p.OperationFailed(p.Failure(STEP, f"{path}: {exc.strerror}")) from None
    return p.SchedulerControlAnswer(str(path), existed)
