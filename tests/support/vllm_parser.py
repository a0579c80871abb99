"""`vllm serve`'s real argument parser in a child interpreter: the start of a script, run by the suite's Python
(dspark-launch installed), that builds it as `parser` (node/serve_argcheck.py knows where each vLLM release keeps
it), and `refusal`: node/serve_argcheck.py's verdict under another release's interpreter."""

import atexit
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


class _ParserChild:
    """One child of this interpreter that imports vLLM once and judges argument lists, one JSON list a line in, one
    verdict line out (a cold `import vllm` is about 9 CPU-s here; each test module asked for its own before)."""

    SOURCE = (
        "import json, sys\n"
        "from dspark_launch.node.serve_argcheck import refusal_of, verdict_line\n"
        "for line in sys.stdin:\n"
        "    print(verdict_line(refusal_of(json.loads(line))), flush=True)\n"
    )
    _proc: subprocess.Popen | None = None

    @classmethod
    def verdict(cls, argv: list[str]) -> str:
        if cls._proc is None or cls._proc.poll() is not None:
            cls._proc = subprocess.Popen(
                [sys.executable, "-c", cls.SOURCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            atexit.register(cls._proc.kill)
        assert cls._proc.stdin is not None and cls._proc.stdout is not None
        cls._proc.stdin.write(json.dumps(argv) + "\n")
        cls._proc.stdin.flush()
        line = cls._proc.stdout.readline()
        assert line.startswith(serve_argcheck.VERDICT), f"the parser child ended: {line!r}"
        return line.rstrip("\n")


def refusal(serve_args: list[str] | tuple[str, ...], python: str = sys.executable) -> str | None:
    """vLLM's reason for refusing `serve_args` (model first, as after `vllm serve`) under `python`, or None
    when accepted (the check a starting server runs on itself, node/serve_entry.py). This interpreter's vLLM is
    asked through one long-lived child; another release's interpreter (without dspark-launch) runs
    node/serve_argcheck.py's source once per call."""
    argv = ["--model", *serve_args]
    if python == sys.executable:
        verdict = _ParserChild.verdict(argv)
        return None if verdict == serve_argcheck.verdict_line(None) else json.loads(verdict.split(" ", 1)[1])
    proc = subprocess.run(
        [python, "-c", Path(serve_argcheck.__file__).read_text()],
        input=json.dumps(argv),
        capture_output=True,
        text=True,
        timeout=300,
    )
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith(serve_argcheck.VERDICT)]
    if proc.returncode == 0 and verdicts == [serve_argcheck.verdict_line(None)]:
        return None
    assert verdicts, proc.stderr[-2000:]
    return json.loads(verdicts[-1].split(" ", 1)[1])
