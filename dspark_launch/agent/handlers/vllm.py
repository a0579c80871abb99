"""The agent's vLLM operations (head): the installed vLLM's serve flags, and its check of the serve arguments.

`describe_vllm` imports vLLM in the agent's process: one request per agent
process, and the head's interpreter is the one that will serve; a repeat for the same
install is answered from what the node kept (offer_cache) without importing vLLM.
`serve_args_check` runs vLLM's own parser in a child interpreter (seconds).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from dspark_launch.agent import protocol as p
from dspark_launch.node import serve_argcheck


def describe_vllm(req: p.DescribeVllm, report: p.Report) -> p.DescribeVllmAnswer:
    from dspark_launch.agent.offer_cache import install_identity, recall, remember
    from dspark_launch.node.vllm_offer import describe_installed_vllm

    identity = install_identity(req.config_path) if req.keep else None
    kept = recall(identity) if identity else None
    if kept:
        report(p.Progress("phase", f"the serve flags of {identity.distribution}, as read before from this install"))
        return p.DescribeVllmAnswer(kept)
    report(p.Progress("phase", "reading the installed vLLM's serve flags"))
    offer = describe_installed_vllm(req.config_path or None)
    if identity and identity == install_identity(req.config_path):  # kept only when the install did not change meanwhile
        remember(identity, offer)
    return p.DescribeVllmAnswer(offer)


# The installed vLLM's own serve-argument check, as a script for a child of the head's interpreter.
_CHECK = Path(serve_argcheck.__file__).read_text()


def _die_with_parent() -> None:
    """The checker ends with the agent that asked (an interrupted start kills the agent, never its ~10 s
    child too): Linux's PR_SET_PDEATHSIG."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def refusal(serve_args: list[str] | tuple[str, ...], python: str = sys.executable) -> str | None:
    """vLLM's reason for refusing `serve_args` (model first, as after `vllm serve`), or None when accepted."""
    proc = subprocess.run([python, "-c", _CHECK], input=json.dumps(["--model", *serve_args]), capture_output=True,
                          text=True, timeout=300, preexec_fn=_die_with_parent)
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith(serve_argcheck.VERDICT)]
    accepted = serve_argcheck.verdict_line(None)
    if proc.returncode == 0 and verdicts == [accepted]:
        return None
    if verdicts and verdicts[-1] != accepted:
        return json.loads(verdicts[-1].split(" ", 1)[1])
    detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"cannot check vllm serve arguments: {detail}; allowed: an importable vLLM")


def serve_args_check(req: p.ServeArgsCheck, report: p.Report) -> p.ServeArgsCheckAnswer:
    """The head agent's `serve_args_check` operation (runs under the head's interpreter); arguments this
    install accepted before are not checked again (offer_cache)."""
    from dspark_launch.agent.offer_cache import accepted_before, argv_key, install_identity, remember_accepted

    identity = install_identity()
    key = argv_key(_CHECK, req.serve_args)
    if identity and accepted_before(identity, key):
        report(p.Progress("phase", f"the same vllm serve arguments were accepted before by {identity.distribution} "
                                   "here (kept): not checked again"))
        return p.ServeArgsCheckAnswer(None)
    reason = refusal(req.serve_args)
    if reason is None and identity and identity == install_identity():  # kept only for an unchanged install
        remember_accepted(identity, key)
    return p.ServeArgsCheckAnswer(reason)
