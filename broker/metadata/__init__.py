"""Cluster metadata: the KRaft record log, the image it builds, and the controller's decisions.

What it owns: the metadata records (in Kafka's format), the deterministic state machine that
replays them, and the pure rules that turn admin requests into records. The log itself and its
quorum are `broker.raft` (the core) and `broker.quorum` (its driver and files). What it must never
do: touch sockets or asyncio, or read a clock (time and ids are arguments).
"""

from .configs import ConfigSource, ConfigType, resolve_topic_configs
from .controller import ConfigOp, Outcome, QuorumController, TopicRequest, TopicResult
from .image import (
    BROKER_RESOURCE,
    CLUSTER_METADATA_TOPIC,
    TOPIC_RESOURCE,
    ConfigChanged,
    MetadataImage,
    PartitionChanged,
    PartitionState,
    TopicRemoved,
    TopicState,
)
from .records import MetadataRecord

__all__ = [
    "BROKER_RESOURCE",
    "CLUSTER_METADATA_TOPIC",
    "TOPIC_RESOURCE",
    "ConfigChanged",
    "ConfigOp",
    "ConfigSource",
    "ConfigType",
    "MetadataImage",
    "MetadataRecord",
    "Outcome",
    "PartitionChanged",
    "PartitionState",
    "QuorumController",
    "TopicRemoved",
    "TopicRequest",
    "TopicResult",
    "TopicState",
    "resolve_topic_configs",
]
