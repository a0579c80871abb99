"""Model folders and caches as trustworthy as the state folder (stdlib only: each node's agent runs it).

vLLM imports the model's Python (`--trust-remote-code`) and reads its JSON as the serving user (root
on a DGX Spark), so whoever can write the model folder or a cache runs code on every node. A model
folder is trusted when its root (the local folder, or a hub repo's cache folder) and everything in
it belongs to the serving user or root, nothing in it is writable by group or others, and every link
in it stays inside it; the folders above it as for the state folder (`safe_path.check_ancestors`).
The caches (DSPARK_MODEL_CACHE, DSPARK_CONTAINER_MODEL_CACHE) when they exist: a real folder of
the serving user or root, not group/other-writable, with safe folders above.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dspark_launch.node.safe_path import (
    CONTAINER_STATE_VAR,
    LogOwner,
    UnsafePath,
    check_ancestors,
    log_owner,
    this_user,
    within,
)

from .model_paths import model_root

WRITABLE_BY_OTHERS = 0o022


def trusted_owner() -> LogOwner:
    """This user; for a root agent in a launcher container, the mounted state folder's owner (the
    operator who launched: the caches are theirs on the host; the same rule as safe_path.log_owner)."""
    state = os.environ.get(CONTAINER_STATE_VAR, "")
    return log_owner(Path(state)) if state and os.path.isabs(state) else this_user()


def _problem(st: os.stat_result, owners: frozenset[int]) -> str | None:
    if st.st_uid not in owners:
        return f"is owned by uid {st.st_uid}, not by the serving user (uid {os.geteuid()}) or root"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & WRITABLE_BY_OTHERS:
        return f"has mode {stat.S_IMODE(st.st_mode):04o}: group or others can write it"
    return None


def _check_one(path: str, owners: frozenset[int], what: str) -> None:
    st = os.lstat(path)
    problem = _problem(st, owners)
    if problem:
        raise UnsafePath(f"{what} {path} {problem}")


def check_cache(folder: str, owner: LogOwner) -> None:
    """A cache folder (when it exists): a real folder of `owner` or root, closed to other writers,
    below safe folders. UnsafePath naming it."""
    if not folder or not os.path.lexists(folder):
        return
    check_ancestors(Path(folder), owner)
    if os.path.islink(folder) or not os.path.isdir(folder):
        raise UnsafePath(f"model cache {folder} is a symbolic link or not a folder")
    _check_one(folder, _owners(owner), "model cache")


def check_model_folder(folder: str, caches: tuple[str, ...] = ()) -> None:
    """The model's root and all it holds, and `caches` (UnsafePath naming the first problem)."""
    owner = trusted_owner()
    owners = _owners(owner)
    for cache in caches:
        check_cache(cache, owner)
    root = str(model_root(Path(folder)))
    if root != str(Path(folder)):
        check_cache(str(Path(root).parent), owner)  # the hub cache (DSPARK_MODEL_CACHE) holding the repo
    if not os.path.lexists(root):
        check_ancestors(Path(root), owner)
        return
    check_cache(root, owner)
    real_root = os.path.realpath(root)
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(parent, name)
            _check_one(path, owners, "model file")
            if os.path.islink(path) and not within(os.path.realpath(path), real_root):
                raise UnsafePath(f"model file {path} is a link to {os.path.realpath(path)}, outside {root}")


def _owners(owner: LogOwner) -> frozenset[int]:
    return frozenset({0, *owner.accepted})
