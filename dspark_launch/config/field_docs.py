"""The docstring under each field of a settings class, read from its source (as vLLM's config classes do).

A setting is declared once, as a dataclass field with a docstring right below it:

    health_timeout_s: int = knob(5, ge=1, le=600, group="serving")
    \"\"\"seconds one health or status probe may take\"\"\"

The docstring is the setting's description wherever one is shown (`config show`, the
docs table, the bash registry, the example file).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from pathlib import Path


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring, one line} for the fields `cls` declares itself."""
    module = ast.parse(Path(inspect.getfile(cls)).read_text(encoding="utf-8"))
    body = next(node.body for node in module.body if isinstance(node, ast.ClassDef) and node.name == cls.__name__)
    docs: dict[str, str] = {}
    for node, following in zip(body, body[1:]):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
    return docs


def declared_docs(cls: type) -> dict[str, str]:
    """`field_docs` for `cls` and the dataclasses it extends (a subclass's own docstring wins)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    return docs
