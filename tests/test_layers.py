"""Every import in dspark_launch follows the layer table of docs/architecture.md, and no two packages import
each other (read with `ast`: module-level, lazy and type-only imports, and module names written as strings)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.paths import REPO

PACKAGE = REPO / "dspark_launch"
MODULE_STRING = re.compile(r"dspark_launch(\.\w+)+(:\w+)?")


def layer_table() -> list[str]:
    """The first column of the "## Layers" table, lowest layer first."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w_]+)/?` \|", section, re.MULTILINE)


def layer_of(path: Path) -> str:
    """The package a file belongs to; a module directly in dspark_launch/ is its own (`errors`, `__main__`),
    and dspark_launch/__init__.py (the version) counts with `errors`, the bottom row."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if len(parts) > 1:
        return parts[0]
    return "errors" if parts[0] == "__init__" else parts[0]


def imported_modules(source: str, module: str) -> set[str]:
    """Every dspark_launch module that `source` (the text of module `module`, "dspark_launch.x.y") names in an
    import (at any depth) or as a whole string constant."""
    package = tuple(module.split(".")[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join((*anchor, base) if base else anchor)
            found |= {f"{base}.{alias.name}" for alias in node.names} if base == "dspark_launch" else {base}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
            found.add(node.value.split(":")[0])
    return {name for name in found if name == "dspark_launch" or name.startswith("dspark_launch.")}


def target_layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__version__":
        return "errors"
    return parts[1]


def package_imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the files that import across."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = layer_of(path)
        name = ".".join(("dspark_launch", *path.relative_to(PACKAGE).with_suffix("").parts))
        for module in imported_modules(path.read_text(), name):
            target = target_layer(module)
            if target != source:
                edges.setdefault((source, target), []).append(str(path.relative_to(REPO)))
    return edges


def test_the_layer_table_names_every_package_once():
    table = layer_table()
    packages = {layer_of(path) for path in PACKAGE.rglob("*.py")}
    assert len(table) == len(set(table)), table
    assert packages <= set(table), f"not in docs/architecture.md's layer table: {sorted(packages - set(table))}"


def test_every_import_goes_down_the_layer_table():
    order = {name: index for index, name in enumerate(layer_table())}
    against = [
        f"{source} -> {target} ({', '.join(sorted(set(files)))})"
        for (source, target), files in package_imports().items()
        if order[target] > order[source]
    ]
    assert not against, "imports against the layer table (docs/architecture.md):\n" + "\n".join(against)


def test_no_two_packages_import_each_other():
    graph: dict[str, set[str]] = {}
    for source, target in package_imports():
        graph.setdefault(source, set()).add(target)
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in trail:
                cycles.append(" -> ".join(trail[trail.index(nxt) :] + [nxt]))
            elif len(trail) < len(graph) + 1:
                visit(nxt, trail + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert not cycles, "package cycles:\n" + "\n".join(sorted(set(cycles)))


def test_the_checker_sees_lazy_relative_and_string_imports():
    """The reader itself: an import inside a function, a relative one, and a "module:function" string count."""
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dspark_launch.config import settings\n"
        "def f():\n    from ..serve import plan\n    from dspark_launch import hotfix\n"
        "    return 'dspark_launch.cli.main:app'\n"
    )
    found = {target_layer(name) for name in imported_modules(source, "dspark_launch.cluster.probe")}
    assert found == {"config", "serve", "hotfix", "cli"}


def test_config_modules_import_one_another_at_top_level_and_without_a_cycle():
    """Within config (the declarations and the tables derived from them) no import is deferred into a function to
    dodge a cycle: each module imports alone, and the module graph has no cycle."""
    graph: dict[str, set[str]] = {}
    deferred = []
    for path in sorted((PACKAGE / "config").glob("*.py")):
        name = f"dspark_launch.config.{path.stem}"
        tree = ast.parse(path.read_text())
        graph[name] = {m for m in imported_modules(path.read_text(), name) if m.startswith("dspark_launch.config.")}
        for func in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(func):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dspark_launch.config"):
                    deferred.append(f"{path.name}:{node.lineno} {node.module}")
    assert not deferred, "config imports inside functions:\n" + "\n".join(deferred)

    def reaches(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert not [name for name in graph if name in reaches(name)]
