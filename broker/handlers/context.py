"""What handlers see of the node: its identity, its listeners, its topics."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.config import BrokerConfig

__all__ = ["Endpoint", "NodeState"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int


@dataclass
class NodeState:
    config: BrokerConfig
    cluster_id: str
    advertised: dict[str, Endpoint] = field(default_factory=dict)
    """Listener name → the host and port clients are told to use."""
