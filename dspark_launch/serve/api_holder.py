"""Whose is the API port: asked of the head's agent (agent/port_holder.py) before the API key is sent.

vLLM binds `VLLM_PORT` minutes after it starts loading, and any local user can bind it first (or after
the server died, or while it shuts down with its listener closed). The start's wait, `status` and `smoke`
therefore send the key only once the head's agent has found the listening socket among the recorded server's
descriptors (pid and start time); `/health` needs no key and never gets it. And every request that carries
the key checks again, right before it is sent (`ServerPort`, the check of `http.Keyed`): the first time, and
whenever the sockets a connection lands on changed, through the head's agent; otherwise by one sock_diag
dump in this process (`port_holder.still_held`: those sockets are still the ones the agent found the
server's), tens of microseconds.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

from dspark_launch.agent import protocol as p
from dspark_launch.agent.port_holder import bind_address, still_held
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import ServerRecord
from dspark_launch.errors import ClusterFailure, DsparkError
from dspark_launch.serve import http


class ForeignApiListener(DsparkError):
    """Another process holds the API port: nothing carrying the key was sent."""


def api_holder(spec: ClusterSpec, server: ServerRecord, ip: str = "", port: int = 0) -> p.PortHolderAnswer:
    """Who holds the server's port now (or ip:port, the address a request is made to); a container that is gone
    holds nothing."""
    address = urlsplit(server.url)
    process = server.process
    query = p.PortHolderQuery(
        ip or bind_address(address.hostname or ""), port or address.port or 80, (process,) if process else ()
    )
    try:
        return spec.head.agent().call(query, "server status")
    except ClusterFailure:
        if not spec.containers:
            raise
        return p.PortHolderAnswer(
            p.PortHolderAnswer.GONE, False
        )  # the head's container is gone, and the server with it


def foreign_line(server: ServerRecord, holder: p.PortHolderAnswer) -> str:
    address = urlsplit(server.url)
    ours = f"vllm serve (pid {server.pid})" if server.pid else "vllm serve (not started)"
    return (
        f"VLLM_PORT {address.port} on {address.hostname} is held by {holder.foreign}, not by {ours}; "
        "the API key was not sent; stop that process, then `dspark restart`"
    )


def require_ours(spec: ClusterSpec, server: ServerRecord) -> p.PortHolderAnswer:
    """The holder when it is the recorded server; ForeignApiListener naming the other one otherwise."""
    holder = api_holder(spec, server)
    if holder.verdict == p.PortHolderAnswer.FOREIGN:
        raise ForeignApiListener(foreign_line(server, holder))
    return holder


class ServerPort:
    """The check before each request that carries the key (`http.Keyed.check`): True when the recorded server
    holds ip:port, False when nothing of it listens there, ForeignApiListener when another process holds it.
    `known`: an answer the caller just had from the head's agent (its sockets are trusted until they change)."""

    def __init__(self, spec: ClusterSpec, server: ServerRecord, known: p.PortHolderAnswer | None = None):
        self.spec, self.server = spec, server
        self._held: tuple[int, ...] = known.sockets if known is not None and known.ours else ()
        self._lock = threading.Lock()
        self.asked = 0  # how often the head's agent was asked (the rest were sock_diag reads here)

    def __call__(self, ip: str, port: int) -> bool:
        if self._held and still_held(ip, port, self._held):
            return True
        with self._lock:  # one agent call at a time (a bench's lanes check at once)
            if self._held and still_held(ip, port, self._held):
                return True
            holder = api_holder(self.spec, self.server, ip, port)
            self.asked += 1
            if holder.verdict == p.PortHolderAnswer.FOREIGN:
                self._held = ()
                raise ForeignApiListener(foreign_line(self.server, holder))
            self._held = holder.sockets if holder.ours else ()
            return holder.ours


def keyed(spec: ClusterSpec, server: ServerRecord, key: str, known: p.PortHolderAnswer | None = None) -> http.Keyed:
    """The key for requests to the recorded server, checked before each one (`ServerPort`)."""
    return http.Keyed(key, ServerPort(spec, server, known))


def healthy(holder: p.PortHolderAnswer, url: str, key: http.Keyed, served_name: str, timeout: float) -> bool:
    """/health (without the key), then /v1/models listing the served name (with it), only on our port (a
    listener that took the port since is not healthy: the next `api_holder` names it)."""
    try:
        return (
            holder.ours
            and http.request(f"{url}/health", timeout=timeout).status == 200
            and served_name in http.served_models(url, key, timeout)
        )
    except ForeignApiListener:
        return False
