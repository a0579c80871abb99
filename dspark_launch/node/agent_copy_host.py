"""The worker host's half of shipping the launcher's package in container mode (stdlib only).

In container mode a worker's host runs no agent: `container_engine.ship_package` sends this module's
source, after `safe_path`'s (the same folder rules as host mode's pre-flight), to the host's
`python3 -c`, with the expected content (a sha256 per file) and the archive on stdin. Here:
the state folder is made 0700 or checked (a real folder of this user that group and others
cannot write, under folders only root or this user can replace); an existing
`agent-<digest>/` is used only when its content is exactly the expected one (every file's
hash, no other file, no link, nothing another user owns or can write), else it is removed and
shipped again; a new copy is unpacked into a fresh private folder, checked the same way, then
renamed into place. The name is never trusted: the content decides.

Exit codes: 0 with the copy's path on stdout; 3 the state folder is not safe (stderr: why);
1 anything else (stderr: why).
"""

import base64
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import tarfile
import tempfile

try:  # on the node's host this source follows safe_path's (there is no package there)
    from dspark_launch.node.safe_path import UnsafePath, make_dir
except ImportError:
    pass

UNSAFE_EXIT = 3
PREFIX = "agent-"


def content_problem(folder: str, expected: dict):
    """Why `folder` is not exactly the expected copy (None when it is): checked without following links."""
    uid = os.geteuid()
    seen = {}
    for top, dirs, files in os.walk(folder):
        for name in [top, *(os.path.join(top, d) for d in dirs), *(os.path.join(top, f) for f in files)]:
            st = os.lstat(name)
            if stat.S_ISLNK(st.st_mode) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                return f"{name} is a link or not a plain file or folder"
            if st.st_uid != uid or st.st_mode & 0o022:
                return f"{name} is owned by uid {st.st_uid} or writable by group or others"
            if stat.S_ISREG(st.st_mode) and st.st_nlink != 1:
                return f"{name} has {st.st_nlink} names (a hard link)"
        for name in files:
            path = os.path.join(top, name)
            with open(path, "rb") as handle:
                seen[os.path.relpath(path, folder)] = hashlib.sha256(handle.read()).hexdigest()
    for path in sorted(set(seen) | set(expected)):
        if seen.get(path) != expected.get(path):
            what = "missing" if path not in seen else ("not expected" if path not in expected else "changed")
            return f"{os.path.join(folder, path)}: {what}"
    return None


def _unpack(archive: bytes, dest_root: str, digest: str, expected: dict) -> str:
    fresh = tempfile.mkdtemp(prefix=f".{PREFIX}{digest}.", dir=dest_root)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(fresh, **extra)
    problem = content_problem(fresh, expected)
    if problem:
        shutil.rmtree(fresh)
        raise RuntimeError(f"the unpacked copy is not what was sent: {problem}")
    return fresh


def _discard(path: str) -> None:
    """Move `path` aside (a rename never follows a link) and remove it."""
    aside = tempfile.mkdtemp(prefix=f".{PREFIX}discarded.", dir=os.path.dirname(path))
    os.rename(path, os.path.join(aside, "x"))
    shutil.rmtree(aside)


def ship(dest_root: str, digest: str, stdin) -> str:
    expected = json.loads(stdin.readline())
    final = os.path.join(dest_root, PREFIX + digest)
    make_dir(dest_root)
    if os.path.lexists(final):
        problem = content_problem(final, expected) if not os.path.islink(final) else f"{final} is a link"
        if problem is None:
            return final
        print(f"dspark: {final} is not the launcher's package ({problem}); shipped again", file=sys.stderr)
        _discard(final)
    fresh = _unpack(base64.b64decode(stdin.read()), dest_root, digest, expected)
    try:
        os.rename(fresh, final)
    except OSError:  # another launcher placed it meanwhile: its content decides
        shutil.rmtree(fresh)
        problem = content_problem(final, expected)
        if problem:
            raise RuntimeError(problem) from None
    return final


def main(argv) -> int:
    try:
        print(ship(argv[1], argv[2], sys.stdin))
    except UnsafePath as exc:
        print(f"state folder: {exc}", file=sys.stderr)
        return UNSAFE_EXIT
    except (OSError, RuntimeError, ValueError, tarfile.TarError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
