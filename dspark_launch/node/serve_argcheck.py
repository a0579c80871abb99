"""The installed vLLM's own check of `vllm serve` arguments (model first, as after `vllm serve`).

Self-contained, stdlib and vLLM only: the head's agent runs this file's source in a child of the head's
interpreter (`python -c`, which also works for a vLLM venv without dspark-launch: the compat tests), and
the warm serve entry (`serve_entry`) calls `refusal_of` in its own process before it waits to serve.
"""

from __future__ import annotations

import json
import sys

VERDICT = "DSPARK-ARGCHECK "  # the line's prefix: "ok", or vLLM's reason as a JSON string


def vllm_serve_cli():
    """The installed vLLM's `make_arg_parser`, `validate_parsed_serve_args` and `FlexibleArgumentParser`
    (their modules moved between releases): the one place that knows where."""
    try:  # 0.33
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        try:  # 0.31, 0.32
            from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        except ImportError:  # before 0.31
            from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    return make_arg_parser, validate_parsed_serve_args, FlexibleArgumentParser


def serve_parser():
    """`vllm serve`'s own argument parser, as the installed vLLM builds it."""
    make_arg_parser, _, flexible_parser = vllm_serve_cli()
    return make_arg_parser(flexible_parser(prog="vllm serve"))


def refusal_of(argv: list[str]) -> str | None:
    """vLLM's reason for refusing `argv`, or None when its parser and its serve-argument checks accept it."""
    make_arg_parser, validate_parsed_serve_args, flexible_parser = vllm_serve_cli()

    class Refused(Exception):
        pass

    class Parser(flexible_parser):  # type: ignore[misc, valid-type]  # a class the installed vLLM gives
        def error(self, message):
            raise Refused(message)

    try:
        validate_parsed_serve_args(make_arg_parser(Parser(prog="vllm serve")).parse_args(argv))
    except (Refused, ValueError, TypeError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def verdict_line(reason: str | None) -> str:
    return VERDICT + ("ok" if reason is None else json.dumps(reason))


def main() -> None:
    """The child's protocol: the argument list as JSON on stdin, one verdict line out, exit 2 when refused."""
    reason = refusal_of(json.loads(sys.stdin.read()))
    print(verdict_line(reason))
    sys.exit(0 if reason is None else 2)


if __name__ == "__main__":
    main()
