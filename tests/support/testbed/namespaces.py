"""Which processes live in which namespaces (read from /proc through the product's procfs)."""

from __future__ import annotations

import os
from typing import Iterable, Mapping, Optional, Set, Tuple

from dspark_launch.node import procfs
from tests.support.processes import alive

NsId = Tuple[int, int]


def ns_id(pid, kind: str) -> Optional[NsId]:
    """The (device, inode) of /proc/PID/ns/KIND (pid may be "self")."""
    return file_ns_id(f"/proc/{pid}/ns/{kind}")


def file_ns_id(path: str) -> Optional[NsId]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def pids_in_namespaces(ns_ids: Mapping[str, Iterable[NsId]]) -> Set[int]:
    """Pids whose namespace of any given kind ("net", "mnt", "uts") is one of the ids."""
    wanted = {k: set(v) for k, v in ns_ids.items() if v}
    found = set()
    me = os.getpid()
    for pid in procfs.pids():
        if pid == me:
            continue
        for kind, ids in wanted.items():
            if ns_id(pid, kind) in ids:
                found.add(pid)
                break
    return {p for p in found if alive(p)}
