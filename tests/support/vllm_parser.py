"""The start of a script, run by the suite's Python (dspark-launch installed), that builds `vllm serve`'s
real argument parser as `parser` (node/serve_argcheck.py knows where each vLLM release keeps it)."""

PARSER_PREAMBLE = r"""
import json, sys
from dspark_launch.node.serve_argcheck import serve_parser
parser = serve_parser()
"""
