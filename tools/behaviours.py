"""The behaviours the suite asserts, one line per test function: its module, its name read as a sentence (what
fails it), and its docstring's first line when it has one. Read from the source (no import, no collection).

    python -m tools.behaviours                 # the checkout's list
    python -m tools.behaviours --at REF        # the list at git REF
    python -m tools.behaviours --diff REF      # tests at git REF that are gone now, and the new ones

A test moved to another module counts as kept when its name is unchanged; a renamed or folded test shows as
gone, for the change's note to map to where its assertion went.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def behaviours(sources: dict[str, str]) -> dict[str, str]:
    """test name -> 'module: sentence (docstring)' for every test function (a name in two modules: both, joined)."""
    found: dict[str, str] = {}
    for module, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                doc = (ast.get_docstring(node) or "").strip().splitlines()
                sentence = node.name.removeprefix("test_").replace("_", " ")
                line = f"{module}: {sentence}" + (f" ({doc[0]})" if doc else "")
                found[node.name] = f"{found[node.name]}; {line}" if node.name in found else line
    return found


def _sources_now() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ROOT / "tests").glob("test_*.py"))}


def _sources_at(ref: str) -> dict[str, str]:
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{ref}:tests"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    return {
        name: subprocess.run(
            ["git", "show", f"{ref}:tests/{name}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        for name in names
        if name.startswith("test_") and name.endswith(".py")
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--diff", metavar="REF", help="compare with the tests at this git ref")
    parser.add_argument("--at", metavar="REF", help="list the tests at this git ref instead of the checkout's")
    args = parser.parse_args(argv)
    now = behaviours(_sources_at(args.at) if args.at else _sources_now())
    if not args.diff:
        print("\n".join(now.values()))
        print(f"{len(now)} tests", file=sys.stderr)
        return 0
    before = behaviours(_sources_at(args.diff))
    gone = [before[name] for name in before if name not in now]
    new = [now[name] for name in now if name not in before]
    print(f"{len(before)} tests at {args.diff}, {len(now)} now: {len(gone)} gone, {len(new)} new")
    for line in gone:
        print(f"- {line}")
    for line in new:
        print(f"+ {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
