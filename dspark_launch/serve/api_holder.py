"""Whose is the API port: asked of the head's agent (agent/port_holder.py) before the API key is sent.

vLLM binds `VLLM_PORT` minutes after it starts loading, and any local user can bind it first (or after
the server died). The start's wait, `status` and `smoke` therefore send the key only once the head's
agent has found the listening socket among the recorded server's descriptors (pid and start time);
`/health` needs no key and never gets it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from dspark_launch.agent import protocol as p
from dspark_launch.errors import ClusterFailure
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord
from dspark_launch.errors import DsparkError
from dspark_launch.serve import http


class ForeignApiListener(DsparkError):
    """Another process holds the API port: nothing carrying the key was sent."""


def api_holder(spec: ClusterSpec, server: ServerRecord) -> p.PortHolderAnswer:
    """Who holds the server's port now; a container that is gone holds nothing."""
    address = urlsplit(server.url)
    process = server.process
    query = p.PortHolderQuery(address.hostname or "", address.port or 80, (process,) if process else ())
    try:
        return spec.head.agent().call(query, "server status")
    except ClusterFailure:
        if not spec.containers:
            raise
        return p.PortHolderAnswer(p.PortHolderAnswer.GONE, False)  # the head's container is gone, and the server with it


def foreign_line(server: ServerRecord, holder: p.PortHolderAnswer) -> str:
    address = urlsplit(server.url)
    ours = f"vllm serve (pid {server.pid})" if server.pid else "vllm serve (not started)"
    return (f"VLLM_PORT {address.port} on {address.hostname} is held by {holder.foreign}, not by {ours}; "
            "the API key was not sent; stop that process, then `dspark restart`")


def require_ours(spec: ClusterSpec, server: ServerRecord) -> p.PortHolderAnswer:
    """The holder when it is the recorded server; ForeignApiListener naming the other one otherwise."""
    holder = api_holder(spec, server)
    if holder.verdict == p.PortHolderAnswer.FOREIGN:
        raise ForeignApiListener(foreign_line(server, holder))
    return holder


def healthy(holder: p.PortHolderAnswer, url: str, key: str, served_name: str, timeout: float) -> bool:
    """/health (without the key), then /v1/models listing the served name (with it), only on our port."""
    return (holder.ours and http.request(f"{url}/health", timeout=timeout).status == 200
            and served_name in http.served_models(url, key, timeout))
