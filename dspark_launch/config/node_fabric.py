"""One node's fabric request from the settings: the cluster-wide fabric settings, overridden for that node by
its DSPARK_NODE_FABRIC entries (`node:NAME=value`, the names config/text_settings.py checks)."""

from __future__ import annotations

from dspark_launch.config.settings import Settings
from dspark_launch.node.values import FabricRequest


def fabric_request(settings: Settings, node: str, fabric_ip: str) -> FabricRequest:
    """Launcher side: the request for one node, its DSPARK_NODE_FABRIC entries over the cluster-wide settings."""
    # what DSPARK_NODE_FABRIC may set for one node (config/text_settings.py checks the same names)
    values = {
        "DSPARK_FABRIC_IFNAME": settings.dspark_fabric_ifname,
        "NCCL_IB_HCA": settings.nccl_ib_hca,
        "NCCL_IB_GID_INDEX": settings.nccl_ib_gid_index,
        "NCCL_SOCKET_IFNAME": settings.nccl_socket_ifname,
        "GLOO_SOCKET_IFNAME": settings.gloo_socket_ifname,
        "TP_SOCKET_IFNAME": settings.tp_socket_ifname,
    }
    for entry in settings.dspark_node_fabric.split():
        target, _, assignment = entry.partition(":")
        name, _, value = assignment.partition("=")
        if target == node:
            values[name] = value
    return FabricRequest(
        node=node,
        ifname=values["DSPARK_FABRIC_IFNAME"],
        fabric_ip=fabric_ip,
        hca_list=values["NCCL_IB_HCA"],
        gid_index=values["NCCL_IB_GID_INDEX"],
        socket_ifnames=tuple(
            (n, values[n]) for n in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME") if values[n]
        ),
    )
