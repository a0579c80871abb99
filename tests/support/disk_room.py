"""Room on disk for the suite, checked by `make test` before pytest starts: one line, exit 2 when too little.

Beyond the venv and the newest release's unpacked Python (both in place before this runs), a run writes the
container test image into its shared store (tests/support/containers.py) once per content key, and its own
files (testbed states, logs, models) under pytest's base temp folder. Measured on a fresh machine (2026-12-06):
the image 3.0 GiB kept and 4.9 GiB at the peak of `podman import` (the compressed stream and the unpacked layer
side by side), the run's own files 0.3 GiB. A disk that runs out mid-run fails far from the cause (ENOSPC in
whatever test writes next, `ray start` exiting); this fails first and names the numbers.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
#: The test image's peak while `podman import` builds it (4.86 GiB measured), rounded up: a check that refused a
#: run that would pass would be worse than none.
IMAGE_BUILD_BYTES = 5 * GIB
#: The run's own files under the temp folder (0.26 GiB measured), rounded up.
RUN_BYTES = GIB // 2


@dataclass(frozen=True)
class Need:
    what: str  # "the container test image in DSPARK_TEST_IMAGE_STORE"
    path: Path  # where it is written
    size: int  # bytes


def _existing(path: Path) -> Path:
    """`path`, or its nearest folder that exists (the store is made on first use)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def image_present(venv: Path, repo: Path) -> bool:
    """Whether the shared store already holds the test image of this venv's content key."""
    from tests.support.containers import PODMAN, ImageSources, image_tag, stored_image_id

    return os.path.exists(PODMAN) and bool(stored_image_id(image_tag(ImageSources.for_venv(venv, repo))))


def needs(venv: Path, repo: Path) -> list[Need]:
    from tests.support.containers import SHARED_STORE

    found = [Need("the run's own files in TMPDIR", Path(tempfile.gettempdir()), RUN_BYTES)]
    if not image_present(venv, repo):
        found.append(Need("the container test image in DSPARK_TEST_IMAGE_STORE", SHARED_STORE, IMAGE_BUILD_BYTES))
    return found


def shortfalls(wanted: list[Need]) -> tuple[list[str], list[str]]:
    """(problems, lines): per filesystem, what is free against what the run puts there."""
    by_device: dict[int, list[Need]] = {}
    for need in wanted:
        by_device.setdefault(os.stat(_existing(need.path)).st_dev, []).append(need)
    problems, lines = [], []
    for group in by_device.values():
        free = shutil.disk_usage(_existing(group[0].path)).free
        total = sum(n.size for n in group)
        where = " and ".join(str(n.path) for n in group)
        parts = ", ".join(f"{n.size / GIB:.1f} GiB for {n.what}" for n in group)
        line = f"{free / GIB:.1f} GiB free on the filesystem of {where}; the run needs about {total / GIB:.1f} GiB"
        line += f" there ({parts})"
        (problems if free < total else lines).append(line)
    return problems, lines


def main() -> int:
    repo = Path(__file__).resolve().parents[2]
    problems, lines = shortfalls(needs(Path(sys.prefix), repo))
    for line in problems:
        print(f"make test: too little disk: {line}; free some, or point those at a larger disk", file=sys.stderr)
    for line in lines:
        print(f"disk room: {line}")
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
