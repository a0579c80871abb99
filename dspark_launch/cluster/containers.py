"""The cluster's node containers (DSPARK_RUNTIME=docker|podman): image check, create, inspect, remove.

Every node's container is created before its agent is first asked anything (the agent
runs inside it), from an image that resolves to the same id on every node: a node that
lacks it or holds another is refused before anything starts (ImageMismatch, exit 1).
A start always recreates the containers, so the hotfix is applied to a pristine image's
vLLM at every start, inside every container. Removing a node's container ends every
process of ours on that node (its own PID namespace).
"""

from __future__ import annotations

import sys
from pathlib import Path

import dspark_launch
from dspark_launch.agent.host_shell import HostShell
from dspark_launch.agent.protocol import Glob
from dspark_launch.agent.transport import LocalTransport, Transport
from dspark_launch.cluster import container_engine
from dspark_launch.cluster.parallel import on_each
from dspark_launch.cluster.spec import ClusterSpec, Node, NodeContainers
from dspark_launch.errors import DsparkError
from dspark_launch.report import Reporter

PACKAGE_DIR = str(Path(dspark_launch.__file__).resolve().parent)


def host_of(node: Node) -> HostShell:
    """The shell on the node's host (the container transport carries it)."""
    return node.transport.host


def container_spec(
    spec: ClusterSpec, node: Node, agent_package: str, image: str = ""
) -> container_engine.ContainerSpec:
    """`image`: the id the check found on every node (what runs is what was compared); default DSPARK_IMAGE."""
    containers = spec.containers
    return container_engine.ContainerSpec(
        runtime=containers.runtime,
        image=image or containers.image,
        marker=containers.name(node.name),
        agent_package=agent_package,
        state_dir=str(spec.state_dir),
        model_cache=containers.model_cache,
        python=containers.python,
        extra_args=containers.extra_args,
        hardware_args=container_engine.hardware_args(containers.runtime),
        jit_cache=containers.jit_cache,
    )


def check_settings(spec: ClusterSpec) -> None:
    """The container arguments against the launcher's own (ConfigError, exit 2), before anything runs."""
    container_engine.check_spec(container_spec(spec, spec.head, PACKAGE_DIR))


def same_image(spec: ClusterSpec) -> str:
    """The image id every node holds for DSPARK_IMAGE; ImageMismatch (exit 1) with a line per node when not."""
    containers: NodeContainers = spec.containers
    identities = on_each(
        spec.nodes,
        lambda node: container_engine.resolve_image(host_of(node), containers.runtime, containers.image, node.name),
    )
    try:
        return container_engine.check_same_image([identities[n.name] for n in spec.nodes])
    except container_engine.ImageMismatch as exc:
        exc.extra = [f"  image  {n.label}: {identities[n.name].image_id or 'not on the node'}" for n in spec.nodes]
        raise


def up(
    spec: ClusterSpec, nodes: list[Node], image_id: str, reporter: Reporter
) -> dict[str, container_engine.ContainerState]:
    """The containers of `nodes` at once from `image_id`: kept when running from the same spec with nothing
    of a run inside, else (re)created; a worker first gets a copy of the launcher's package."""

    def up_one(node: Node) -> container_engine.ContainerState:
        host = host_of(node)
        package = PACKAGE_DIR if node.is_head else container_engine.ship_package(host, PACKAGE_DIR, str(spec.state_dir))
        wanted = container_spec(spec, node, package, image_id)
        reuse = container_engine.reusable(container_engine.inspect(host, wanted.runtime, wanted.name), wanted) and idle(
            node
        )
        if not reuse:
            reporter.phase(f"creating container {spec.containers.name(node.name)} on {node.label}")
        return container_engine.up(host, wanted, reuse=reuse)

    return on_each(nodes, up_one)


IDLE_PIDS = 4  # an idle container: its init, `sleep infinity`, the agent asking (and its exec wrapper)


def idle(node: Node) -> bool:
    """Nothing of a run inside the node's container (a launcher that died left no record of its Ray)."""
    try:
        return len(node.agent().call(Glob("/proc", "[0-9]*")).paths) <= IDLE_PIDS
    except DsparkError:
        return False


def down(spec: ClusterSpec, nodes: list[Node]) -> dict[str, bool]:
    """Remove the containers of `nodes` at once; per node, whether one was there."""
    containers = spec.containers
    return on_each(
        nodes, lambda node: container_engine.down(host_of(node), containers.runtime, containers.name(node.name))
    )


def inspect(spec: ClusterSpec) -> dict[str, container_engine.ContainerState]:
    containers = spec.containers
    return on_each(
        spec.nodes, lambda node: container_engine.inspect(host_of(node), containers.runtime, containers.name(node.name))
    )


def model_transports(spec: ClusterSpec) -> dict[str, Transport]:
    """Where the model commands check the weights with a container runtime, node containers up or not:
    the head in the launcher's own Python (it holds the host folder the containers mount), every worker
    in a short-lived `--rm` container from the image checked on every node (the package shipped into
    its state folder as for the node containers: container_engine.ship_package)."""
    image_id = same_image(spec)

    def transport_of(node: Node) -> Transport:
        if node.is_head:
            return LocalTransport(sys.executable)
        host = host_of(node)
        package = container_engine.ship_package(host, PACKAGE_DIR, str(spec.state_dir))
        return container_engine.oneshot_transport(host, container_spec(spec, node, package, image_id))

    return on_each(spec.nodes, transport_of)
