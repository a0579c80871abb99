"""Ray's temp folders on a node, where only this user can write (stdlib only; the agent's `ray_temp_dir` makes them).

Ray creates its folders with `os.makedirs` and chmods each to 0777, following links, and
does so again whenever one of its processes (a driver, a worker) starts. So every Ray temp
folder lives in one private folder of this user (0700: nobody else can enter it, plant a
link there, write Ray's folders or reach its sockets), made here with mkdir and checked
without following links; a folder there that is a link, of another user or open to others
is refused with one line, never repaired.

Where that private folder is (docs/security.md, "The nodes' files"): a place no other user can
create first, or else a name they cannot know. Root: `/run/dspark-0` (`/run` is root's and
closed to others). Any other user: `/tmp/dspark-<8 random hex>`, the random part kept in
`$XDG_STATE_HOME/dspark/private-tmp-name` (default `~/.local/state`, a private file); should a
folder of that name be there and not safe, a new name is drawn, so a planted folder never
blocks a start nor the kept vLLM flags. Not `$XDG_RUNTIME_DIR`: logind removes it when the
user's last session ends, and Ray outlives the SSH session that started it. Short on purpose:
Ray's Unix socket paths (`TEMP/session_<date>_<pid>/sockets/plasma_store`) must stay under 108 bytes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dspark_launch.node.safe_path import PRIVATE, UnsafePath, make_dir, read_private, write_private, write_temp

ROOT_PARENT = "/tmp"  # a non-root user's private folder, under a name nobody else can know
RUN_PARENT = "/run"  # root's: nobody else can create anything there
SUFFIX = re.compile(r"[0-9a-f]{8}")
SUFFIX_FILE = "private-tmp-name"
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,40}")
# Longest tail Ray adds below the temp folder: "/session_2026-12-01_05-15-37_123456_1234567/sockets/plasma_store"
SOCKET_TAIL = 64
SOCKET_PATH_MAX = 107


def _is_root() -> bool:
    return os.geteuid() == 0


def private_root() -> Path:
    """This user's private folder (not made here: see `make_private_root`)."""
    if _is_root():
        return Path(RUN_PARENT, "dspark-0")
    return Path(ROOT_PARENT, f"dspark-{_kept_suffix()}")


def shown_private_root() -> str:
    """The private folder as `dspark plan` shows it: never made, nor its name drawn."""
    if _is_root():
        return str(private_root())
    try:
        return str(Path(ROOT_PARENT, f"dspark-{read_private(_suffix_file(), PRIVATE, 64).decode().strip()}"))
    except (OSError, UnicodeDecodeError):
        return f"{ROOT_PARENT}/dspark-<random>"


def make_private_root() -> Path:
    """`private_root()` made 0700 or checked; for a non-root user, a folder another user made there first
    (they guessed the name) gets this user a new name instead of a refusal. UnsafePath / OSError else."""
    root = private_root()
    try:
        make_dir(root, PRIVATE)
    except UnsafePath:
        if _is_root():
            raise
        _kept_suffix(renew=True)
        root = private_root()
        make_dir(root, PRIVATE)
    return root


def _suffix_file() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base, "dspark", SUFFIX_FILE)


def _kept_suffix(renew: bool = False) -> str:
    """The random part of a non-root user's private folder name, kept in a private file of theirs
    (created once, atomically: concurrent agents agree; `renew` draws a new one)."""
    path = _suffix_file()
    if not renew:
        try:
            kept = read_private(path, PRIVATE, 64).decode("ascii", "replace").strip()
            if SUFFIX.fullmatch(kept):
                return kept
            renew = True  # garbled: replaced
        except FileNotFoundError:
            pass
        except OSError:
            renew = True  # a link or not a private file of this user: replaced, never followed
    import secrets  # here: drawn once per user, and it pulls hashlib and random into every Ray agent process

    make_dir(path.parent)
    drawn = secrets.token_hex(4) + "\n"
    if renew:
        write_private(path, drawn)
    else:
        tmp = write_temp(path, drawn)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another agent drew first: its name is the one
        finally:
            os.unlink(tmp)
    return read_private(path, PRIVATE, 64).decode("ascii", "replace").strip()
