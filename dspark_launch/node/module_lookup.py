"""Whether this interpreter has a module, found without importing it or its packages (node side, stdlib only).

`importlib.util.find_spec("vllm.v1.executor.ray_executor")` imports `vllm`, `vllm.v1` and `vllm.v1.executor` first
(torch and vLLM's config: about 10 s on the build machine), in processes that must not pay that (the warm server
before its fork server starts) or must not import vLLM at all (the node agent). Here only the top-level name goes
through the import system's finders (which import nothing); each package's folder is then searched for the next
name by the path finder, as an import would search it, without running any package's `__init__`.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys


def installed(name: str) -> bool:
    """Whether `import name` would find a module (already imported counts); no package of it is imported."""
    if name in sys.modules:
        return True
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return False
    for depth in range(2, len(parts) + 1):
        if spec is None or not spec.submodule_search_locations:
            return False
        dotted = ".".join(parts[:depth])
        loaded = sys.modules.get(dotted)
        spec = (
            loaded.__spec__
            if loaded is not None
            else importlib.machinery.PathFinder.find_spec(dotted, list(spec.submodule_search_locations))
        )
    return spec is not None
