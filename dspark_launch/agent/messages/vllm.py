"""The installed vLLM's serve parser as data (handlers/vllm.py; imports vLLM when asked)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.agent.protocol import Request
from dspark_launch.node.values import VllmOffer


@dataclass(frozen=True)
class DescribeVllm(Request["DescribeVllmAnswer"]):
    """The installed vLLM's serve parser as data (head: imports vLLM, seconds; a repeat for the same
    install is answered from the node's private folder, see offer_cache)."""

    keep: bool = True  # False in a container: recreated on every start, nothing kept there would be read
    config_path: str = ""  # the placed model's config.json for the dry boot; "" the profile's shipped copy


@dataclass(frozen=True)
class DescribeVllmAnswer:
    offer: VllmOffer
