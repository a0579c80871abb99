"""Checks the generated `vllm serve` arguments with the installed vLLM's own parser.

It runs on the head, as an operation of the head's agent (the launcher's process has
no vLLM). Importing vLLM's CLI takes seconds, so it runs in a child interpreter; a flag the
installed version does not know (`--max-num-partial-prefills` since 0.27) or a
bad value fails here, before anything starts.
"""

from __future__ import annotations

import json
import signal
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


def _die_with_parent() -> None:
    """The checker ends with the agent that asked (an interrupted start kills the agent, never its ~10 s
    child too): Linux's PR_SET_PDEATHSIG."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def refusal(serve_args: list[str] | tuple[str, ...], python: str = sys.executable) -> str | None:
    """vLLM's reason for refusing `serve_args` (model first, as after `vllm serve`), or None when accepted."""
    proc = subprocess.run([python, "-c", _CHECK], input=json.dumps(["--model", *serve_args]), capture_output=True,
                          text=True, timeout=300, preexec_fn=_die_with_parent)
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith("DSPARK-ARGCHECK ")]
    if proc.returncode == 0 and verdicts == ["DSPARK-ARGCHECK ok"]:
        return None
    if verdicts and verdicts[-1] != "DSPARK-ARGCHECK ok":
        return json.loads(verdicts[-1].split(" ", 1)[1])
    detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"cannot check vllm serve arguments: {detail}; allowed: an importable vLLM")


def check_serve_args_op(req, report):
    """The head agent's `check_serve_args` operation (runs under the head's interpreter)."""
    from dspark_launch.cluster.protocol import ServeArgsAnswer

    return ServeArgsAnswer(refusal(req.serve_args))


def check_serve_args(head, serve_args: tuple[str, ...], extra_args_source: str) -> None:
    """Through the head's agent (a NodeAgent): ConfigError naming the refused argument."""
    reason = head.check_serve_args(serve_args)
    if reason is not None:
        raise ConfigError(f"vllm serve arguments refused by the installed vLLM: {reason} "
                          f"(VLLM_EXTRA_ARGS from {extra_args_source}, or a knob); allowed: flags this vLLM knows")
