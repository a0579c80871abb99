"""The agent's vLLM operation (head): the installed vLLM's serve flags.

`describe_vllm` imports vLLM in the agent's process: one request per agent
process, and the head's interpreter is the one that will serve; a repeat for the same
install is answered from what the node kept (offer_cache) without importing vLLM.
(The serve arguments are checked by the server's own interpreter as it starts: serve/warm_start.py.)
"""

from __future__ import annotations

from dspark_launch.agent import protocol as p


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
    if identity and identity == install_identity(
        req.config_path
    ):  # kept only when the install did not change meanwhile
        remember(identity, offer)
    return p.DescribeVllmAnswer(offer)
