"""The issue-27 hotfix tool: status, check, apply and revert on vLLM's scheduler.py.

Run standalone as `patches/hotfix-dsv4-issue27-partial-prefill-concurrency.py`
(a bundle of this module, `contract`, `locate` and `layout`; see
`tools.hotfix_bundle`), or imported by the launcher.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import stat
import sys
import tempfile

from dspark_launch.hotfix.contract import (
    EXIT_ERROR,
    EXIT_NOT_APPLIED,
    EXIT_OK,
    EXIT_OUTDATED,
    EXIT_UNSUPPORTED,
    PATCH_VERSION,
    SUPPORTED_RANGE,
)
from dspark_launch.hotfix.layout import LayoutError, Marker, read_marker, render_patched, unmarked_patch
from dspark_launch.hotfix.locate import find_target, version_supported, vllm_version

__all__ = ["Result", "apply", "check", "find_target", "main", "revert", "status", "vllm_version"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result:
    action: str
    code: int
    state: str  # applied | not-applied | outdated | unsupported | foreign | damaged | modified | missing | error
    message: str
    target: str
    vllm_version: str
    patch_version: int
    applied_patch_version: int | None = None
    sha256_before: str | None = None
    sha256_after: str | None = None
    original_sha256: str | None = None
    changed: bool = False

    @property
    def ok(self) -> bool:
        return self.code == EXIT_OK

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class _Inspection:
    """What a target file is, before any action."""

    state: str
    data: bytes | None
    marker: Marker | None = None
    original: bytes | None = None  # the unpatched bytes, when known
    patched: bytes | None = None  # what `apply` would write (current version)
    problem: str = ""


def _inspect(target: pathlib.Path, version: str) -> _Inspection:
    try:
        data = target.read_bytes()
    except FileNotFoundError:
        return _Inspection("missing", None, problem="file not found")
    except OSError as exc:
        return _Inspection("error", None, problem=f"cannot read: {exc}")
    marker = read_marker(data)
    if marker is not None and marker.original is None:
        return _Inspection(
            "damaged", data, marker, problem="patch marker present but the stored original is missing or damaged"
        )
    original = data if marker is None else marker.original
    supported = version_supported(version)
    if supported is False:
        lo, hi = (f"{a}.{b}" for a, b in SUPPORTED_RANGE)
        problem = f"vLLM {version} is outside the supported range {lo} .. {hi}.x"
        return _Inspection("unsupported", data, marker, original, problem=problem)
    try:
        patched = render_patched(original)
        compile(patched, str(target), "exec")
    except LayoutError as exc:
        state = exc.anchor if exc.anchor in ("foreign", "damaged") else "unsupported"
        return _Inspection(state, data, marker, original, problem=str(exc))
    except SyntaxError as exc:
        return _Inspection("unsupported", data, marker, original, problem=f"patched text does not compile: {exc}")
    if marker is None:
        return _Inspection("not-applied", data, None, original, patched)
    if marker.patch_version < PATCH_VERSION:
        return _Inspection("outdated", data, marker, original, patched)
    if marker.patch_version > PATCH_VERSION:
        return _Inspection(
            "unsupported",
            data,
            marker,
            original,
            patched,
            problem=f"patched by a newer patch version {marker.patch_version}",
        )
    if data != patched:
        return _Inspection(
            "modified", data, marker, original, patched, problem="patched file was edited after patching"
        )
    return _Inspection("applied", data, marker, original, patched)


def _result(
    action: str,
    target: pathlib.Path,
    version: str,
    insp: _Inspection,
    code: int,
    state: str,
    message: str,
    after: bytes | None = None,
    changed: bool = False,
) -> Result:
    return Result(
        action=action,
        code=code,
        state=state,
        message=message,
        target=str(target),
        vllm_version=version,
        patch_version=PATCH_VERSION,
        applied_patch_version=None if insp.marker is None else insp.marker.patch_version,
        sha256_before=_sha(insp.data),
        sha256_after=_sha(insp.data if after is None else after),
        original_sha256=_sha(insp.original),
        changed=changed,
    )


def _refusal(action: str, target: pathlib.Path, version: str, insp: _Inspection) -> Result:
    return _result(
        action,
        target,
        version,
        insp,
        EXIT_UNSUPPORTED,
        insp.state,
        f"cannot {action} on vLLM {version}: {insp.problem}; file left unchanged",
    )


def _atomic_write(target: pathlib.Path, data: bytes) -> None:
    """Replace `target` by `data` atomically, keeping its permission bits."""
    st = target.stat()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".dspark-tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except OSError:
            pass
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def stale_bytecode(target: pathlib.Path) -> list[pathlib.Path]:
    """Cached bytecode of `target` (any interpreter tag / optimization level)."""
    cache = target.parent / "__pycache__"
    return sorted(cache.glob(f"{target.stem}.*.pyc"))


def _drop_bytecode(target: pathlib.Path) -> list[str]:
    """Remove `target`'s cached bytecode; the problems, one per file left behind."""
    problems = []
    for pyc in stale_bytecode(target):
        try:
            pyc.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"{pyc}: {exc.strerror or exc}")
    return problems


def _write(
    action: str, target: pathlib.Path, version: str, insp: _Inspection, data: bytes, state: str, message: str
) -> Result:
    try:
        _atomic_write(target, data)
    except OSError as exc:
        return _result(action, target, version, insp, EXIT_ERROR, "error", f"write failed, file left as it was: {exc}")
    # The new text is in place from here on; a failed clean-up does not undo that.
    left = _drop_bytecode(target)
    if left:
        return _result(
            action,
            target,
            version,
            insp,
            EXIT_ERROR,
            state,
            f"{message}; the file changed, but its stale bytecode could not be removed "
            f"({'; '.join(left)}): remove it by hand before the next start",
            after=data,
            changed=True,
        )
    return _result(action, target, version, insp, EXIT_OK, state, message, after=data, changed=True)


def _resolve(target: pathlib.Path | str | None) -> pathlib.Path:
    path = find_target() if target is None else pathlib.Path(target)
    return path.resolve() if path.exists() else path


def status(target: pathlib.Path | str | None = None) -> Result:
    """Report the patch state; code 0/1/2/3 as in the module docstring."""
    target = _resolve(target)
    version = vllm_version(target)
    insp = _inspect(target, version)
    where = f"vLLM {version}, {target}"
    if insp.state == "applied":
        return _result("status", target, version, insp, EXIT_OK, "applied", f"patch v{PATCH_VERSION} applied ({where})")
    if insp.state == "not-applied":
        return _result(
            "status", target, version, insp, EXIT_NOT_APPLIED, "not-applied", f"not applied, can apply ({where})"
        )
    if insp.state == "outdated":
        old = insp.marker.patch_version if insp.marker else "?"
        return _result(
            "status",
            target,
            version,
            insp,
            EXIT_OUTDATED,
            "outdated",
            f"applied by older patch v{old}, current is v{PATCH_VERSION}; run apply ({where})",
        )
    if insp.state == "error":
        return _result("status", target, version, insp, EXIT_ERROR, "error", f"{insp.problem} ({where})")
    return _result(
        "status", target, version, insp, EXIT_UNSUPPORTED, insp.state, f"cannot apply here: {insp.problem} ({where})"
    )


def check(target: pathlib.Path | str | None = None) -> Result:
    """Dry run of apply: 0 if apply would succeed (or nothing to do), else 2."""
    target = _resolve(target)
    version = vllm_version(target)
    insp = _inspect(target, version)
    if insp.state in ("applied", "not-applied", "outdated"):
        verb = {"applied": "already applied", "not-applied": "can apply", "outdated": "can upgrade"}[insp.state]
        return _result(
            "check",
            target,
            version,
            insp,
            EXIT_OK,
            insp.state,
            f"{verb}: all anchors found, patched text compiles (vLLM {version}, {target})",
        )
    code = EXIT_ERROR if insp.state == "error" else EXIT_UNSUPPORTED
    return dataclasses.replace(_refusal("check", target, version, insp), code=code)


def apply(target: pathlib.Path | str | None = None) -> Result:
    """Patch `target` in place (atomic). Idempotent; upgrades older patches."""
    target = _resolve(target)
    version = vllm_version(target)
    insp = _inspect(target, version)
    if insp.state == "applied":
        return _result(
            "apply",
            target,
            version,
            insp,
            EXIT_OK,
            "applied",
            f"already applied (patch v{PATCH_VERSION}, vLLM {version}, {target})",
        )
    if insp.state not in ("not-applied", "outdated"):
        if insp.state == "error":
            return _result("apply", target, version, insp, EXIT_ERROR, "error", insp.problem)
        return _refusal("apply", target, version, insp)
    upgraded = " (re-applied over older patch from the stored original)" if insp.state == "outdated" else ""
    return _write(
        "apply",
        target,
        version,
        insp,
        insp.patched,
        "applied",
        f"applied patch v{PATCH_VERSION}{upgraded} (vLLM {version}, {target})",
    )


def revert(target: pathlib.Path | str | None = None) -> Result:
    """Restore the original bytes stored in the marker block."""
    target = _resolve(target)
    version = vllm_version(target)
    try:
        data = target.read_bytes()
    except OSError as exc:
        insp = _Inspection("missing", None, problem=str(exc))
        return _result("revert", target, version, insp, EXIT_UNSUPPORTED, "missing", f"cannot revert: {exc}")
    marker = read_marker(data)
    insp = _Inspection("applied" if marker else "not-applied", data, marker, marker.original if marker else data)
    if marker is None:
        unmarked = unmarked_patch(data.decode("utf-8", errors="replace"))
        if unmarked is not None:
            state, problem = unmarked
            return _result(
                "revert",
                target,
                version,
                insp,
                EXIT_UNSUPPORTED,
                state,
                f"cannot revert: {problem}; reinstall vLLM {version} ({target})",
            )
        return _result(
            "revert",
            target,
            version,
            insp,
            EXIT_OK,
            "not-applied",
            f"nothing to revert: not patched (vLLM {version}, {target})",
        )
    if marker.original is None:
        return _result(
            "revert",
            target,
            version,
            insp,
            EXIT_UNSUPPORTED,
            "damaged",
            f"cannot revert: the stored original is missing or damaged; reinstall vLLM {version}",
        )
    return _write(
        "revert",
        target,
        version,
        insp,
        marker.original,
        "not-applied",
        f"reverted to the original (sha256 {marker.original_sha256[:12]}, vLLM {version}, {target})",
    )


ACTIONS = {"apply": apply, "check": check, "status": status, "revert": revert}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hotfix-dsv4-issue27-partial-prefill-concurrency.py",
        description="Cap concurrent partial prefills in vLLM's v1 scheduler (issue 27).",
    )
    parser.add_argument("action", choices=sorted(ACTIONS))
    parser.add_argument("--target", help="scheduler.py to act on (default: the one this python imports)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = ACTIONS[args.action](args.target)
    except FileNotFoundError as exc:  # no vLLM for find_target()
        result = Result(
            action=args.action,
            code=EXIT_UNSUPPORTED,
            state="missing",
            message=str(exc),
            target=args.target or "",
            vllm_version="unknown",
            patch_version=PATCH_VERSION,
        )
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
    else:
        print(f"{result.state}: {result.message}")
    return result.code


if __name__ == "__main__":
    sys.exit(main())
