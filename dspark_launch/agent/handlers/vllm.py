"""The agent operations of the model profile and the fabric (issue 11), node side.

`describe_vllm` (head) imports vLLM in the agent's process: one request per agent
process, and the head's interpreter is the one that will serve; a repeat for the same
install is answered from what the node kept (offer_cache) without importing vLLM. `fabric_env` (every
node) reads the node's own sysfs; `non_carry_over` (head) writes the file vLLM reads
to keep each node's fabric values its own.
"""

from __future__ import annotations

from pathlib import Path

from dspark_launch.cluster import protocol as p
from dspark_launch.cluster.fabric import fabric_env as node_fabric_env
from dspark_launch.cluster.fabric import sysfs_root, write_non_carry_over
from dspark_launch.errors import ConfigError, DsparkError


def describe_vllm(req: p.DescribeVllm, report: p.Report) -> p.DescribeVllmAnswer:
    from dspark_launch.cluster.offer_cache import install_identity, recall, remember
    from dspark_launch.profiles.offer import describe_installed_vllm

    identity = install_identity() if req.keep else None
    kept = recall(identity) if identity else None
    if kept:
        report(p.Progress("phase", f"the serve flags of {identity.distribution}, as read before from this install"))
        return p.DescribeVllmAnswer(kept)
    report(p.Progress("phase", "reading the installed vLLM's serve flags"))
    offer = describe_installed_vllm()
    if identity and identity == install_identity():  # kept only when the install did not change meanwhile
        remember(identity, offer)
    return p.DescribeVllmAnswer(offer)


def fabric_env(req: p.FabricQuery, report: p.Report) -> p.FabricAnswer:
    root = Path(req.sysfs_root) if req.sysfs_root else sysfs_root()
    try:
        return p.FabricAnswer(node_fabric_env(req.request, root))
    except ConfigError as exc:
        raise p.OperationFailed(p.Failure("fabric", str(exc), config_error=True)) from None
    except DsparkError as exc:
        raise p.OperationFailed(p.Failure("fabric", str(exc))) from None


def non_carry_over(req: p.NonCarryOver, report: p.Report) -> p.NonCarryOverAnswer:
    return p.NonCarryOverAnswer(str(write_non_carry_over(Path(req.config_root))))
