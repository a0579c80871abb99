"""The model operations of the node agent (stdlib only): agent.model_files behind the typed protocol."""

from __future__ import annotations

from dspark_launch.node.model_files import (
    HashProgress,
    NodePlacement,
    VerifyReport,
    fast_check,
    placement,
    verify_model,
)
from dspark_launch.node.model_folder import check_model_folder


def _trusted_folder(folder: str, caches: tuple[str, ...]) -> None:
    """The model folder and caches as safe as the state folder (agent.model_folder), else one failure line."""
    from dspark_launch.agent.protocol import Failure, OperationFailed
    from dspark_launch.node.safe_path import UnsafePath

    try:
        check_model_folder(folder, caches)
    except UnsafePath as exc:
        raise OperationFailed(
            Failure("model folder", f"{exc}; whoever can write it runs code as the serving user; nothing was started")
        ) from None


def model_verify(req, report) -> VerifyReport:
    _trusted_folder(req.folder, req.caches)
    if not req.full:
        return verify_model(req.folder, req.manifest, False)
    from dspark_launch.agent.protocol import Progress

    files = [f for f in req.manifest.files if req.only is None or f.path in set(req.only)]
    total = sum(f.size for f in files)
    report(Progress("phase", f"sha256 of {len(files)} files ({total / (1 << 30):.1f} GiB) in {req.folder}"))
    meter = HashProgress("sha256", total, lambda line: report(Progress("phase", line)))
    return verify_model(req.folder, req.manifest, True, only=req.only, on_bytes=meter)


def model_fast_check(req, report) -> VerifyReport:
    _trusted_folder(req.folder, req.caches)
    return fast_check(req.folder, req.stamp)


def model_placement_query(req, report) -> NodePlacement:
    _trusted_folder(req.folder, req.caches)
    return placement(req.folder, req.root, req.manifest)
