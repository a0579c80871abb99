"""The start of a script, run by the venv's Python, that builds `vllm serve`'s real argument parser as
`parser` (the module moved between vLLM releases)."""

PARSER_PREAMBLE = r"""
import json, sys
try:  # 0.33
    from vllm.entrypoints.common.cli_args import make_arg_parser
except ImportError:
    try:  # 0.31, 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
"""
