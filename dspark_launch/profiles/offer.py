"""What the installed vLLM's `vllm serve` offers: its flags, their choices, its speculative methods.

`describe_installed_vllm()` runs on a node (the head, through its agent): it imports
vLLM lazily and reads its own serve parser, so the answer is what that build accepts,
not what a release note says. The result is a frozen, JSON-able `VllmOffer`;
`python -m dspark_launch.profiles.offer` prints it, for an agent that keeps vLLM out
of its own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class OfferedFlag:
    option_strings: tuple[str, ...]  # every spelling: "--tensor-parallel-size", "-tp"
    dest: str  # argparse destination, one per flag: "tensor_parallel_size"
    takes_value: bool  # False for switches ("--async-scheduling" / "--no-async-scheduling")
    choices: tuple[str, ...] = ()  # the values this build accepts; () when any value goes


@dataclass(frozen=True)
class VllmOffer:
    version: str
    flags: tuple[OfferedFlag, ...]
    speculative_methods: tuple[str, ...]  # values of "method" in --speculative-config
    source: str = "the installed vLLM's serve parser"

    def flag(self, option: str) -> OfferedFlag | None:
        """The flag `option` names ("--kv-cache-dtype", "--no-async-scheduling", "-tp"), if offered."""
        for flag in self.flags:
            if option in flag.option_strings:
                return flag
        return None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> VllmOffer:
        data = json.loads(text)
        flags = tuple(OfferedFlag(tuple(f["option_strings"]), f["dest"], bool(f["takes_value"]), tuple(f["choices"]))
                      for f in data["flags"])
        return cls(str(data["version"]), flags, tuple(data["speculative_methods"]),
                   data.get("source", "a recorded description"))


def _literal_values(annotation: object) -> list[str]:
    """Every string of a (nested) typing.Literal."""
    values: list[str] = []
    for arg in typing.get_args(annotation):
        values += [arg] if isinstance(arg, str) else _literal_values(arg)
    return values


def _registered(manager_module: str, manager: str) -> tuple[str, ...]:
    import importlib

    try:
        return tuple(sorted(getattr(importlib.import_module(manager_module), manager).list_registered()))
    except (ImportError, AttributeError):
        return ()


def describe_installed_vllm() -> VllmOffer:
    """Node side: the installed vLLM's serve parser as data (takes seconds: imports vLLM)."""
    import vllm
    from vllm.config.speculative import SpeculativeMethod

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # before 0.31
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser

    # The tool and reasoning parsers are registries, not argparse choices: ask the registries.
    registries = {
        "tool_call_parser": _registered("vllm.tool_parsers", "ToolParserManager")
        or _registered("vllm.entrypoints.openai.tool_parsers", "ToolParserManager"),
        "reasoning_parser": _registered("vllm.reasoning", "ReasoningParserManager"),
    }
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    flags = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        choices = tuple(str(c) for c in action.choices) if action.choices else registries.get(action.dest, ())
        flags.append(OfferedFlag(tuple(action.option_strings), action.dest, action.nargs != 0, choices))
    return VllmOffer(str(vllm.__version__), tuple(flags), tuple(sorted(set(_literal_values(SpeculativeMethod)))))


_MARK = "DSPARK-VLLM-OFFER "


def probe_installed_vllm(python: str = sys.executable, timeout_s: int = 300) -> VllmOffer:
    """Node side, for an agent that keeps vLLM out of its own process: runs the probe in `python`."""
    from dspark_launch.errors import DsparkError

    proc = subprocess.run([python, "-m", __name__], capture_output=True, text=True, timeout=timeout_s)
    answers = [line[len(_MARK):] for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not answers:
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DsparkError(f"cannot read the installed vLLM's serve flags with {python}: {detail}")
    return VllmOffer.from_json(answers[-1])


if __name__ == "__main__":
    sys.stdout.write(_MARK + describe_installed_vllm().to_json() + "\n")
