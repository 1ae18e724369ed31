"""Cluster metadata: the KRaft record log, the image it builds, and the controller's decisions.

What it owns: `__cluster_metadata` (records in Kafka's format), the deterministic state machine
that replays it, and the pure rules that turn admin requests into records. What it must never
do: touch sockets or asyncio, or read a clock (time and ids are arguments).
"""

from .configs import ConfigSource, ConfigType, resolve_topic_configs
from .controller import ConfigOp, Outcome, QuorumController, TopicRequest, TopicResult
from .image import (
    BROKER_RESOURCE,
    TOPIC_RESOURCE,
    ConfigChanged,
    MetadataImage,
    PartitionChanged,
    PartitionState,
    TopicRemoved,
    TopicState,
)
from .quorum import METADATA_TOPIC, MetadataLog
from .records import MetadataRecord

__all__ = [
    "BROKER_RESOURCE",
    "METADATA_TOPIC",
    "TOPIC_RESOURCE",
    "ConfigChanged",
    "ConfigOp",
    "ConfigSource",
    "ConfigType",
    "MetadataImage",
    "MetadataLog",
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
