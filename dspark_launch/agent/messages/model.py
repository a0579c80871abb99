"""The model weights on a node (handlers/model.py)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.agent.protocol import Request
from dspark_launch.node.values import Manifest
from dspark_launch.node.values import NodePlacement as NodePlacement
from dspark_launch.node.values import VerifyReport as VerifyReport


@dataclass(frozen=True)
class ModelVerify(Request["VerifyReport"]):
    """Every file of `manifest` in `folder`: sizes, and with `full` each sha256 (`only`: of those files alone)."""

    folder: str
    manifest: Manifest
    full: bool
    only: tuple[str, ...] | None = None
    caches: tuple[str, ...] = ()  # cache folders checked like the model folder (agent.model_folder)


@dataclass(frozen=True)
class ModelFastCheck(Request["VerifyReport"]):
    """The start pre-flight: the folder and caches safe (agent.model_folder), this node's manifest has
    `stamp`, every file its size, every file but the tensor shards its sha256."""

    folder: str
    stamp: str
    caches: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelPlacementQuery(Request["NodePlacement"]):
    """Before a copy, in one round trip: the folder and caches safe (agent.model_folder), every file of
    `manifest` in `folder` its size, the free space under `root`, the stamp this node last verified."""

    folder: str
    root: str
    manifest: Manifest
    caches: tuple[str, ...] = ()
