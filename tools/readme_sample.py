"""The README's sample of what `dspark start` prints, taken from a real `make demo` run.

    python -m tools.readme_sample   # root: run the demo, rewrite the README's sample, take the demo down

The demo serves the tiny model on the two-namespace testbed with the real `dspark start`; the lines it
printed between `demo: dspark start` and `demo: dspark smoke` replace the block between the README's
markers. tests/test_readme_sample.py fails when a phase line a healthy start prints is missing from the
sample, so a new phase line means running this again.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys

from tests.support.paths import REPO

README = REPO / "README.md"
BEGIN = "<!-- start sample: written by `python -m tools.readme_sample` from a `make demo` run -->"
END = "<!-- end of start sample -->"
#: The demo's own lines around the start's output.
START_LINE = re.compile(r"^demo: dspark start ")
AFTER_START = re.compile(r"^demo: dspark smoke ")


def start_output(demo_output: str) -> list[str]:
    """The lines `dspark start` printed in a demo run (its progress on stderr and its summary on stdout)."""
    lines = demo_output.splitlines()
    first = next(i for i, line in enumerate(lines) if START_LINE.match(line)) + 1
    last = next(i for i, line in enumerate(lines) if i >= first and AFTER_START.match(line))
    return [line.rstrip() for line in lines[first:last] if line.strip()]


def sample_block(lines: list[str], day: datetime.date) -> str:
    return "\n".join([BEGIN, f"`make demo` on a 2-core machine, {day.isoformat()}:", "", "```", *lines, "```", END])


def sample_lines(readme: str) -> list[str]:
    """The sample's lines as the README holds them (empty when it has no generated sample)."""
    if BEGIN not in readme or END not in readme:
        return []
    block = readme[readme.index(BEGIN) : readme.index(END)]
    inside = block.split("```")
    return inside[1].strip("\n").splitlines() if len(inside) >= 3 else []


def rewrite(readme: str, block: str) -> str:
    if BEGIN in readme and END in readme:
        return readme[: readme.index(BEGIN)] + block + readme[readme.index(END) + len(END) :]
    raise SystemExit(f"{README}: the markers {BEGIN!r} ... {END!r} are missing")


def main() -> int:
    up = subprocess.run(
        [sys.executable, "-m", "demo", "up"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=3600,
    )
    try:
        if up.returncode != 0:
            print(up.stdout[-4000:], file=sys.stderr)
            print(f"readme_sample: make demo failed (exit {up.returncode}); the README is unchanged", file=sys.stderr)
            return 1
        lines = start_output(up.stdout)
    finally:
        subprocess.run([sys.executable, "-m", "demo", "down"], cwd=REPO, capture_output=True, timeout=600)
    README.write_text(rewrite(README.read_text(), sample_block(lines, datetime.date.today())))
    print(f"readme_sample: {len(lines)} lines of `dspark start` written into {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
