"""`vllm serve`'s real argument parser in a child interpreter: the start of a script, run by the suite's Python
(dspark-launch installed), that builds it as `parser` (node/serve_argcheck.py knows where each vLLM release keeps
it), and `refusal`: node/serve_argcheck.py's verdict under another release's interpreter."""

import json
import subprocess
import sys
from pathlib import Path

from dspark_launch.node import serve_argcheck

PARSER_PREAMBLE = r"""
import json, sys
from dspark_launch.node.serve_argcheck import serve_parser
parser = serve_parser()
"""


def refusal(serve_args: list[str] | tuple[str, ...], python: str = sys.executable) -> str | None:
    """vLLM's reason for refusing `serve_args` (model first, as after `vllm serve`) under `python`, or None
    when accepted (the check a starting server runs on itself, node/serve_entry.py)."""
    proc = subprocess.run(
        [python, "-c", Path(serve_argcheck.__file__).read_text()],
        input=json.dumps(["--model", *serve_args]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith(serve_argcheck.VERDICT)]
    if proc.returncode == 0 and verdicts == [serve_argcheck.verdict_line(None)]:
        return None
    assert verdicts, proc.stderr[-2000:]
    return json.loads(verdicts[-1].split(" ", 1)[1])
