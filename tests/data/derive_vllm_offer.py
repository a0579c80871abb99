"""Derives a recorded `VllmOffer` from an unpacked vLLM wheel, statically (no import, no torch).

Used once to make the JSON files beside it; see README.md here for the commands.
Reads the Literal types (CacheDType, TokenizerMode, SpeculativeMethod), the tool and
reasoning parser registrations, and the dataclass fields of EngineArgs / FrontendArgs
(each field is a `--field-name` flag; bool fields also get `--no-field-name`).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path


def _literal_values(node: ast.AST, aliases: dict[str, ast.AST]) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in aliases:
        return _literal_values(aliases[node.id], aliases)
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal":
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return [v for item in items for v in _literal_values(item, aliases)]
    return []


def _assignments(files: list[Path]) -> dict[str, ast.AST]:
    found: dict[str, ast.AST] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, node.value)
    return found


def _registered_names(folder: Path, table: str) -> list[str]:
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "register_module" and node.args:
                arg = node.args[0]
                elts = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
                names.update(e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == table
                and isinstance(node.value, ast.Dict)
            ):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return sorted(names)


def _dataclass_flags(path: Path, classes: tuple[str, ...]) -> list[dict]:
    flags = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    dest = item.target.id
                    is_bool = "bool" in ast.unparse(item.annotation)
                    options = [f"--{dest.replace('_', '-')}"]
                    options += [f"--no-{dest.replace('_', '-')}"] if is_bool else []
                    flags.append({"option_strings": options, "dest": dest, "takes_value": not is_bool, "choices": []})
    return flags


def derive(root: Path) -> dict:
    vllm = root / "vllm"
    version = _assignments([vllm / "_version.py"])["__version__"]
    config_files = sorted((vllm / "config").rglob("*.py"))
    aliases = _assignments(config_files)
    cli = next(
        p
        for p in (
            vllm / "entrypoints/common/cli_args.py",
            vllm / "entrypoints/launchers/cli_args.py",
            vllm / "entrypoints/openai/cli_args.py",
        )
        if p.is_file()
    )
    flags = _dataclass_flags(vllm / "engine/arg_utils.py", ("EngineArgs", "AsyncEngineArgs"))
    flags += _dataclass_flags(cli, ("FrontendArgs", "BaseFrontendArgs"))
    tool_dirs = [p for p in (vllm / "tool_parsers", vllm / "entrypoints/openai/tool_parsers") if p.is_dir()]
    choices = {
        "kv_cache_dtype": _literal_values(aliases["CacheDType"], aliases),
        "tokenizer_mode": _literal_values(aliases["TokenizerMode"], aliases),
        "tool_call_parser": sorted({n for d in tool_dirs for n in _registered_names(d, "_TOOL_PARSERS_TO_REGISTER")}),
        "reasoning_parser": _registered_names(vllm / "reasoning", "_REASONING_PARSERS_TO_REGISTER"),
    }
    for flag in flags:
        flag["choices"] = choices.get(flag["dest"], [])
    return {
        "version": ast.literal_eval(version),
        "flags": flags,
        "speculative_methods": sorted(set(_literal_values(aliases["SpeculativeMethod"], aliases))),
        "source": f"derived statically from the vllm {ast.literal_eval(version)} wheel by tests/data/derive_vllm_offer.py",
    }


if __name__ == "__main__":
    print(json.dumps(derive(Path(sys.argv[1])), indent=1, sort_keys=True))
