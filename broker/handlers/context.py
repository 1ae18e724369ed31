"""What handlers see of the node: its identity, its listeners, its metadata and partitions."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.config import BrokerConfig
from broker.kraft import MetadataService
from broker.replica import ReplicaManager

__all__ = ["Endpoint", "NodeState", "wall_clock_ms"]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int


@dataclass
class NodeState:
    config: BrokerConfig
    cluster_id: str
    metadata: MetadataService
    replicas: ReplicaManager
    advertised: dict[str, Endpoint] = field(default_factory=dict)
    """Listener name → the host and port clients are told to use."""
    clock: Callable[[], int] = wall_clock_ms
    """Wall-clock milliseconds (timestamps clients see)."""

    @property
    def node_id(self) -> int:
        return self.config.node_id
