"""Ray's temp folders on a node, where only this user can write (agent operation, stdlib only).

Ray creates its folders with `os.makedirs` and chmods each to 0777, following links, and
does so again whenever one of its processes (a driver, a worker) starts. So every Ray temp
folder lives in one private folder of this user, `/tmp/dspark-<uid>` (0700: nobody else
can enter it, plant a link there, write Ray's folders or reach its sockets), made here
with mkdir and checked without following links; a folder there that is a link, of another
user or open to others is refused with one line, never repaired. Short on purpose: Ray's Unix socket paths (`TEMP/session_<date>_<pid>/sockets/plasma_store`)
must stay under 108 bytes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dspark_launch.cluster import protocol as p
from dspark_launch.cluster.safe_path import PRIVATE, UnsafePath, make_dir

ROOT_PARENT = "/tmp"
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,40}")
# Longest tail Ray adds below the temp folder: "/session_2026-12-01_05-15-37_123456_1234567/sockets/plasma_store"
SOCKET_TAIL = 64
SOCKET_PATH_MAX = 107


def private_root() -> Path:
    return Path(ROOT_PARENT, f"dspark-{os.geteuid()}")


def ray_temp_dir(req: p.RayTempDir, report: p.Report) -> p.RayTempDirAnswer:
    if not NAME.fullmatch(req.name):
        raise p.OperationFailed(p.Failure("ray temp folder", f"refusing folder name {req.name!r}"))
    folder = private_root() / req.name
    if len(str(folder)) + SOCKET_TAIL > SOCKET_PATH_MAX:
        raise p.OperationFailed(p.Failure("ray temp folder", f"{folder} is too long for Ray's socket paths"))
    try:
        make_dir(private_root(), PRIVATE)
        make_dir(folder, forbidden=0)  # inside a private folder: only this user can have set its mode
    except UnsafePath as exc:
        raise p.OperationFailed(p.Failure("ray temp folder", f"{exc}; refusing to start Ray there "
                                          "(remove it if nobody should have put it there)")) from None
    except OSError as exc:
        raise p.OperationFailed(p.Failure("ray temp folder", f"{folder}: cannot create it ({exc.strerror})")) from None
    try:  # `ray start --head` refuses to start when a stale record there names its address
        (folder / "ray_current_cluster").unlink()
    except FileNotFoundError:
        pass
    return p.RayTempDirAnswer(str(folder))
