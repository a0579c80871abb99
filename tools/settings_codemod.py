#!/usr/bin/env python3
"""Rewrite string-key setting reads into typed attributes.

    settings.int("HEALTH_TIMEOUT_S")         -> settings.health_timeout_s
    settings.flag("ENABLE_PREFIX_CACHING")   -> settings.enable_prefix_caching        (bool)
    settings.int("DSPARK_HUB_PROXY") == 1    -> settings.dspark_hub_proxy             (bool)
    settings.words("VLLM_EXTRA_ARGS")        -> settings.vllm_extra_args              (tuple[str, ...])
    settings["VLLM_HOST"]                    -> settings.vllm_host                    (str)
    settings["VLLM_PORT"]                    -> str(settings.vllm_port)               (a number as text)

A receiver is a name ending in `settings` (`settings`, `self.settings`, `head_settings`), a call
(`settings_or_exit(env).int(...)`, method forms only) or one of --receiver (tests use `s`).
`settings.entries["NAME"]` (a setting's source and notes, by environment name) is left alone, and so is a
file that says `settings-codemod: skip` (tests/test_settings_declared.py: examples of the old reads).

Usage, from the repository root:

    python tools/settings_codemod.py dspark_launch tests bench          # rewrite in place
    python tools/settings_codemod.py --receiver s tests                  # tests name their settings `s`
    python tools/settings_codemod.py --check dspark_launch               # exit 1 while a read is left

A name that is not declared in config/knobs.py or config/text_settings.py stops the run (exit 2):
declare the setting there first (docs/architecture.md, "How to add a setting").
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark_launch.config.knobs import NumericKnobs  # noqa: E402
from dspark_launch.config.text_settings import TextSettings  # noqa: E402

FIELD_TYPES = {f.name.upper(): f.type for f in dataclasses.fields(NumericKnobs) + dataclasses.fields(TextSettings)}
NUMBER_TYPES = {"int", "float"}
SKIP_MARK = "settings-codemod: " + "skip"  # a file holding examples of the old reads (its own test)

# <receiver end>.<method>("NAME") with an optional `== 1` after it; either quote
_METHOD = re.compile(r"""(?P<end>\b\w+|\))\.(?P<method>int|float|flag|words|text|get)\((?P<q>["'])"""
                     r"""(?P<name>[A-Z][A-Z0-9_]*)(?P=q)\)(?P<eq1>\s*==\s*1\b)?""")
# <dotted receiver>["NAME"]
_SUBSCRIPT = re.compile(r"""(?P<recv>\b(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)\[(?P<q>["'])(?P<name>[A-Z][A-Z0-9_]*)(?P=q)\]""")


@dataclasses.dataclass
class Report:
    rewritten: int = 0
    left: list[str] = dataclasses.field(default_factory=list)
    unknown: list[str] = dataclasses.field(default_factory=list)


def _is_receiver(name: str, receivers: set[str]) -> bool:
    last = name.rsplit(".", 1)[-1]
    return last.endswith("settings") or last in receivers


def _method(match: re.Match, receivers: set[str], where: str, report: Report) -> str:
    end, method, name = match["end"], match["method"], match["name"]
    call_receiver = end == ")"
    if not (call_receiver and method not in ("get", "text")) and not _is_receiver(end, receivers):
        return match[0]
    kind = FIELD_TYPES.get(name)
    if kind is None:
        report.unknown.append(f"{where}: {name}")
        return match[0]
    attribute = f"{end}.{name.lower()}"
    eq1 = match["eq1"] or ""
    fits = {"int": kind in ("int", "bool"), "float": kind == "float", "flag": kind == "bool",
            "words": kind == "tuple[str, ...]", "text": kind == "str", "get": kind == "str"}[method]
    if not fits:
        report.left.append(f"{where}: {match[0].strip()} reads a {kind} setting with .{method}(): rewrite by hand")
        return match[0]
    report.rewritten += 1
    if kind == "bool" and method == "int" and not eq1:
        report.left.append(f"{where}: {name} is a bool now (was read with .int()): check the use")
    return attribute if kind == "bool" else attribute + eq1


def _subscript(match: re.Match, receivers: set[str], where: str, report: Report) -> str:
    receiver, name = match["recv"], match["name"]
    if receiver.endswith(".entries") or not _is_receiver(receiver, receivers):
        return match[0]
    kind = FIELD_TYPES.get(name)
    if kind is None:
        report.unknown.append(f"{where}: {name}")
        return match[0]
    attribute = f"{receiver}.{name.lower()}"
    report.rewritten += 1
    if kind in NUMBER_TYPES:
        return f"str({attribute})"
    if kind == "bool":
        return f"str(int({attribute}))"
    if kind == "tuple[str, ...]":
        report.left.append(f"{where}: {name} is a tuple of words now: shlex.join() added, import shlex")
        return f"shlex.join({attribute})"
    return attribute


def rewrite(text: str, path: str, receivers: set[str], report: Report) -> str:
    lines = text.splitlines(keepends=True)
    out = []
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        line = _METHOD.sub(lambda m: _method(m, receivers, where, report), line)
        line = _SUBSCRIPT.sub(lambda m: _subscript(m, receivers, where, report), line)
        out.append(line)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--receiver", action="append", default=[], help="another name that holds Settings")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 while a read is left")
    args = parser.parse_args(argv)
    receivers = set(args.receiver)
    files = sorted(p for root in args.paths for p in ([root] if root.is_file() else root.rglob("*.py")))
    report, changed = Report(), []
    for path in files:
        if path.resolve() == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        if SKIP_MARK in text:
            continue
        new = rewrite(text, str(path), receivers, report)
        if new != text:
            changed.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for line in report.unknown:
        print(f"unknown setting {line}: declare it in config/knobs.py or config/text_settings.py first",
              file=sys.stderr)
    for line in report.left:
        print(line, file=sys.stderr)
    verb = "to rewrite" if args.check else "rewritten"
    print(f"{report.rewritten} string-key read(s) {verb} in {len(changed)} file(s)")
    for path in changed:
        print(f"  {path}")
    if report.unknown:
        return 2
    return 1 if args.check and report.rewritten else 0


if __name__ == "__main__":
    sys.exit(main())
