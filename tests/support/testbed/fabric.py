"""The fabric: one bridge in a namespace of its own, a veth per node (fab0), cable pulls."""

from __future__ import annotations

from tests.support.testbed.base import BRIDGE_IF, FABRIC_IF


class Fabric:
    """The fabric between the nodes (a mixin of Testbed: uses its _run and node lookup)."""

    def _port(self, name: str) -> str:
        return f"p-{name}"[:15]

    def link_down(self, node) -> None:
        """Unplug the node's cable: its bridge port goes down (fab0 loses carrier)."""
        self._run(["ip", "-n", self.fabric_netns, "link", "set", self._port(self.node(node).name), "down"])

    def link_up(self, node) -> None:
        self._run(["ip", "-n", self.fabric_netns, "link", "set", self._port(self.node(node).name), "up"])

    def _build_fabric(self, state: dict) -> None:
        """Register the nodes' namespaces and join their fab0 through the bridge."""
        fab = self.fabric_netns
        self._run(["ip", "netns", "add", fab])
        for rec in state["nodes"]:
            self._run(["ip", "netns", "attach", rec["netns"], str(rec["holder_pid"])])
        self._run(["ip", "-n", fab, "link", "set", "lo", "up"])
        self._run(["ip", "-n", fab, "link", "add", BRIDGE_IF, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        self._run(["ip", "-n", fab, "link", "set", BRIDGE_IF, "up"])
        for rec in state["nodes"]:
            port, ns = self._port(rec["name"]), rec["netns"]
            self._run(["ip", "-n", fab, "link", "add", port, "type", "veth", "peer", "name", FABRIC_IF, "netns", ns])
            self._run(["ip", "-n", fab, "link", "set", port, "master", BRIDGE_IF, "up"])
            self._run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._run(["ip", "-n", ns, "addr", "add", f"{rec['ip']}/24", "dev", FABRIC_IF])
            self._run(["ip", "-n", ns, "link", "set", FABRIC_IF, "up"])
