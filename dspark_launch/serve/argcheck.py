"""Checks the generated `vllm serve` arguments with the installed vLLM's own parser.

Importing vLLM's CLI takes seconds, so it runs in a child interpreter; a flag the
installed version does not know (`--max-num-partial-prefills` since 0.27) or a
bad value fails here, before anything starts.
"""

from __future__ import annotations

import json
import subprocess
import sys

from dspark_launch.errors import ConfigError

_CHECK = r"""
import json, sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser

class Refused(Exception):
    pass

class Parser(FlexibleArgumentParser):
    def error(self, message):
        raise Refused(message)

argv = json.loads(sys.stdin.read())
try:
    validate_parsed_serve_args(make_arg_parser(Parser(prog="vllm serve")).parse_args(argv))
except (Refused, ValueError, TypeError) as exc:
    print("DSPARK-ARGCHECK " + json.dumps(str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
    sys.exit(2)
print("DSPARK-ARGCHECK ok")
"""


def check_serve_args(serve_args: list[str], extra_args_source: str, python: str = sys.executable) -> None:
    """ConfigError naming the refused argument; serve_args start with the model (as after `vllm serve`)."""
    proc = subprocess.run([python, "-c", _CHECK], input=json.dumps(["--model", *serve_args]), capture_output=True,
                          text=True, timeout=300)
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith("DSPARK-ARGCHECK ")]
    if proc.returncode == 0 and verdicts == ["DSPARK-ARGCHECK ok"]:
        return
    if verdicts and verdicts[-1] != "DSPARK-ARGCHECK ok":
        reason = json.loads(verdicts[-1].split(" ", 1)[1])
        raise ConfigError(f"vllm serve arguments refused by the installed vLLM: {reason} "
                          f"(VLLM_EXTRA_ARGS from {extra_args_source}, or a knob); allowed: flags this vLLM knows")
    detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise ConfigError(f"cannot check vllm serve arguments: {detail}; allowed: an importable vLLM")
