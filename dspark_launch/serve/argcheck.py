"""Checks the generated `vllm serve` arguments with the installed vLLM's own parser.

The check itself runs on the head, as an operation of the head's agent (`agent/handlers/vllm.py`:
the launcher's process has no vLLM); a flag the installed version does not know
(`--max-num-partial-prefills` since 0.27) or a bad value fails here, before anything starts.
"""

from __future__ import annotations

from dspark_launch.agent.protocol import ServeArgsCheck
from dspark_launch.errors import ConfigError


def check_serve_args(head, serve_args: tuple[str, ...], extra_args_source: str) -> None:
    """Through the head's agent (a NodeAgent): ConfigError naming the refused argument."""
    reason = head.call(ServeArgsCheck(tuple(serve_args))).refused
    if reason is not None:
        raise refused_error(reason, extra_args_source)


def refused_error(reason: str, extra_args_source: str) -> ConfigError:
    return ConfigError(f"vllm serve arguments refused by the installed vLLM: {reason} "
                       f"(VLLM_EXTRA_ARGS from {extra_args_source}, or a knob); allowed: flags this vLLM knows")
