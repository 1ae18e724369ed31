"""The node's KRaft driver: decisions become committed records, records become state.

`propose(decide)` runs a controller decision against the current image, commits the records it
returns to the metadata log and applies them to the image, then tells the subscribers (the
replica manager) what changed, and only then returns the decision's result — so an admin
request is answered after its records are committed, as in Kafka. Proposals are serialised:
each one sees the image its predecessor left.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from broker.config import SECURITY_PROTOCOL_IDS, BrokerConfig
from broker.metadata import MetadataImage, MetadataLog, MetadataRecord, QuorumController
from broker.metadata.configs import ResolvedConfig, log_config, resolve_topic_configs
from broker.metadata.image import BROKER_RESOURCE, Change
from broker.metadata.records import (
    BrokerEndpoint,
    FeatureLevelRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
)
from broker.storage import LogConfig

__all__ = ["METADATA_VERSION", "MetadataService"]

log = logging.getLogger(__name__)

T = TypeVar("T")

METADATA_VERSION = 21
"""`metadata.version` feature level written when a cluster is formatted (Kafka 3.9-IV0)."""


class MetadataService:
    def __init__(self, config: BrokerConfig, clock: Callable[[], int]) -> None:
        self.config = config
        self._clock = clock
        self.image = MetadataImage()
        self.log = MetadataLog(config.log_dirs[0], config.node_id, now_ms=clock())
        self.controller = QuorumController(
            self.image,
            num_partitions=config.num_partitions,
            replication_factor=config.default_replication_factor,
        )
        self.subscribers: list[Callable[[Change], None]] = []
        self._lock = asyncio.Lock()
        self.broker_epoch = -1

    def replay(self) -> None:
        """Rebuild the image from the committed log (before anything subscribes)."""
        count = 0
        for offset, record in self.log.replay():
            self.image.apply(record, offset)
            count += 1
        log.info(
            "metadata replayed: %d records, %d topics, leader epoch %d",
            count,
            len(self.image.topics),
            self.log.epoch,
        )

    async def propose(
        self, decide: Callable[[QuorumController], tuple[Sequence[MetadataRecord], T]]
    ) -> T:
        async with self._lock:
            records, result = decide(self.controller)
            self.commit(records)
            return result

    def commit(self, records: Sequence[MetadataRecord]) -> None:
        if not records:
            return
        first = self.log.append(records, self._clock())
        for i, record in enumerate(records):
            change = self.image.apply(record, first + i)
            if change is not None:
                for subscriber in self.subscribers:
                    subscriber(change)

    async def register_broker(self, endpoints: dict[str, tuple[str, int]]) -> None:
        """Register this node (its listeners and rack) and unfence it: the single-node
        shortcut of KRaft's registration + heartbeat handshake."""
        records: list[MetadataRecord] = []
        if "metadata.version" not in self.image.features:
            records.append(FeatureLevelRecord("metadata.version", METADATA_VERSION))
        self.broker_epoch = self.log.end_offset + len(records)
        records.append(
            RegisterBrokerRecord(
                broker_id=self.config.node_id,
                incarnation_id=uuid.uuid4(),
                broker_epoch=self.broker_epoch,
                end_points=tuple(
                    BrokerEndpoint(
                        name,
                        host,
                        port,
                        SECURITY_PROTOCOL_IDS.get(
                            self.config.listener_security_protocol_map.get(name, name), 0
                        ),
                    )
                    for name, (host, port) in sorted(endpoints.items())
                ),
                rack=self.config.broker_rack,
                fenced=True,
            )
        )
        records.append(UnfenceBrokerRecord(self.config.node_id, self.broker_epoch))
        async with self._lock:
            self.commit(records)

    @property
    def broker_dynamic_configs(self) -> dict[str, str]:
        """Settings kafka-configs set for this broker (`--entity-name <node.id>`)."""
        return self.image.configs.get((BROKER_RESOURCE, str(self.config.node_id)), {})

    @property
    def cluster_dynamic_configs(self) -> dict[str, str]:
        """Settings kafka-configs set for every broker (`--entity-default`)."""
        return self.image.configs.get((BROKER_RESOURCE, ""), {})

    def resolved_topic_configs(self, overrides: Mapping[str, str]) -> list[ResolvedConfig]:
        """Every topic setting for a topic with `overrides`, with its effective value and
        source: the one place the topic → dynamic broker → static broker → default chain is
        assembled."""
        return resolve_topic_configs(
            overrides,
            self.config.properties,
            self.broker_dynamic_configs,
            self.cluster_dynamic_configs,
        )

    def topic_log_config(self, topic: str) -> LogConfig:
        """The storage settings of `topic`: its own, over dynamic and static broker ones."""
        return log_config(self.resolved_topic_configs(self.image.topic_config(topic)))

    def close(self) -> None:
        self.log.close(self._clock())
