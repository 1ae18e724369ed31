"""The metadata image: the cluster's state, rebuilt by replaying `__cluster_metadata`.

`MetadataImage.apply(record)` is the whole state machine: deterministic, no I/O, no clocks, so
every node that replays the same log holds the same image. It returns what changed, for the
broker side to act on (create a partition's log, delete a topic's, reload a config).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from .records import (
    FENCE,
    UNFENCE,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FeatureLevelRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)

_BrokerRecord = (
    RegisterBrokerRecord
    | UnfenceBrokerRecord
    | FenceBrokerRecord
    | BrokerRegistrationChangeRecord
    | UnregisterBrokerRecord
)
_BROKER_RECORDS = (
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
    FenceBrokerRecord,
    BrokerRegistrationChangeRecord,
    UnregisterBrokerRecord,
)

__all__ = [
    "BROKER_ONLY_TOPICS",
    "BROKER_RESOURCE",
    "CLUSTER_METADATA_TOPIC",
    "INTERNAL_TOPICS",
    "TOPIC_RESOURCE",
    "BrokerState",
    "Change",
    "ConfigChanged",
    "MetadataImage",
    "PartitionChanged",
    "PartitionState",
    "TopicRemoved",
    "TopicState",
    "is_internal_topic",
]

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4


CLUSTER_METADATA_TOPIC = "__cluster_metadata"
"""The metadata log's topic: never a topic of the image, whatever a client asks."""

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
"""Kafka's `Topic.isInternal`: topics of the image that only the broker's coordinators write;
a client's Produce to them fails with INVALID_TOPIC_EXCEPTION."""

BROKER_ONLY_TOPICS = INTERNAL_TOPICS | {CLUSTER_METADATA_TOPIC}
"""Topics a client may not create or add partitions to: the internal ones and the metadata
topic (which is never in the image, so every other request finds it unknown)."""


def is_internal_topic(name: str) -> bool:
    """Topics the cluster keeps for itself (`__consumer_offsets`, `__transaction_state`,
    `__cluster_metadata`): never auto-created by a client's Metadata request, reported with
    `is_internal`. Other names starting with `__` are a user's, as in Kafka."""
    return name in BROKER_ONLY_TOPICS


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    adding: tuple[int, ...] = ()
    """Replicas a reassignment adds: they catch up before the `removing` ones go (KIP-455)."""
    removing: tuple[int, ...] = ()
    """Replicas a reassignment removes once every replica of its target is in the ISR."""
    elr: tuple[int, ...] = ()
    """Eligible leader replicas (KIP-966): out of the ISR, yet known to hold every committed
    record, because they left it while it was below `min.insync.replicas` and the high
    watermark cannot move then. With the ISR empty, one of them may lead."""
    last_known_elr: tuple[int, ...] = ()
    """The last leader, once the ISR and ELR are both empty: Kafka's balanced recovery
    elects it when it returns, rather than leaving the partition without a leader."""

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas the partition will have once its reassignment, if any, completes."""
        return tuple(r for r in self.replicas if r not in self.removing)


@dataclass(slots=True)
class TopicState:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionState] = field(default_factory=dict)

    @property
    def internal(self) -> bool:
        return is_internal_topic(self.name)


@dataclass(frozen=True, slots=True)
class BrokerState:
    broker_id: int
    epoch: int
    endpoints: dict[str, tuple[str, int]]
    """Listener name → (host, port)."""
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool = False


@dataclass(frozen=True, slots=True)
class PartitionChanged:
    topic: TopicState
    partition: int
    state: PartitionState


@dataclass(frozen=True, slots=True)
class TopicRemoved:
    topic: TopicState


@dataclass(frozen=True, slots=True)
class ConfigChanged:
    resource_type: int
    resource_name: str


Change = PartitionChanged | TopicRemoved | ConfigChanged
"""What `MetadataImage.apply` reports for the broker side to act on."""


class MetadataImage:
    def __init__(self) -> None:
        self.topics: dict[str, TopicState] = {}
        self.topics_by_id: dict[uuid.UUID, TopicState] = {}
        self.configs: dict[tuple[int, str], dict[str, str]] = {}
        self.brokers: dict[int, BrokerState] = {}
        self.features: dict[str, int] = {}
        self.next_producer_id = 0
        self.offset = -1
        """Offset of the last record applied."""
        self._registrations: dict[int, RegisterBrokerRecord] = {}
        self._producer_ids: ProducerIdsRecord | None = None

    def snapshot_records(self) -> list[MetadataRecord]:
        """The whole image as records: replayed into an empty image, they rebuild this one
        (what a snapshot holds, KIP-630)."""
        records: list[MetadataRecord] = [
            FeatureLevelRecord(name, level) for name, level in sorted(self.features.items())
        ]
        for broker_id in sorted(self._registrations):
            registration = self._registrations[broker_id]
            state = self.brokers[broker_id]
            records.append(
                replace(
                    registration,
                    fenced=state.fenced,
                    in_controlled_shutdown=state.in_controlled_shutdown,
                )
            )
        for topic in self.topics.values():
            records.append(TopicRecord(topic.name, topic.topic_id))
            for index, p in sorted(topic.partitions.items()):
                records.append(
                    PartitionRecord(
                        partition_id=index,
                        topic_id=topic.topic_id,
                        replicas=p.replicas,
                        isr=p.isr,
                        leader=p.leader,
                        leader_epoch=p.leader_epoch,
                        partition_epoch=p.partition_epoch,
                        removing_replicas=p.removing,
                        adding_replicas=p.adding,
                        eligible_leader_replicas=p.elr or None,
                        last_known_elr=p.last_known_elr or None,
                    )
                )
        for (resource_type, resource_name), entries in sorted(self.configs.items()):
            for name, value in sorted(entries.items()):
                records.append(ConfigRecord(resource_type, resource_name, name, value))
        if self._producer_ids is not None:
            records.append(self._producer_ids)
        return records

    def load(self, records: list[MetadataRecord], offset: int) -> list[Change]:
        """Replace the whole image with the one `records` build (a snapshot of the log up to
        `offset`), in place: holders of this image see the new state. Returns what changed
        for the broker side: every topic gone, every partition and config as it is now."""
        new = MetadataImage()
        for record in records:
            new.apply(record, offset)
        changes: list[Change] = [
            TopicRemoved(topic)
            for name, topic in self.topics.items()
            if name not in new.topics or new.topics[name].topic_id != topic.topic_id
        ]
        config_keys = set(self.configs) | set(new.configs)
        self.topics, self.topics_by_id = new.topics, new.topics_by_id
        self.configs, self.brokers, self.features = new.configs, new.brokers, new.features
        self.next_producer_id = new.next_producer_id
        self._registrations, self._producer_ids = new._registrations, new._producer_ids
        self.offset = offset
        for topic in self.topics.values():
            for index, state in sorted(topic.partitions.items()):
                changes.append(PartitionChanged(topic, index, state))
        changes.extend(ConfigChanged(kind, name) for kind, name in sorted(config_keys))
        return changes

    def registration(self, broker_id: int) -> RegisterBrokerRecord | None:
        """The record that registered the broker as it is now, if it is registered."""
        return self._registrations.get(broker_id)

    def topic_config(self, topic: str) -> dict[str, str]:
        """The topic's own settings (not the broker defaults under them)."""
        return self.configs.get((TOPIC_RESOURCE, topic), {})

    def apply(self, record: MetadataRecord, offset: int) -> Change | None:
        self.offset = offset
        if isinstance(record, TopicRecord):
            topic = TopicState(record.name, record.topic_id)
            self.topics[record.name] = topic
            self.topics_by_id[record.topic_id] = topic
            return None
        if isinstance(record, PartitionRecord):
            topic = self.topics_by_id[record.topic_id]
            state = PartitionState(
                replicas=record.replicas,
                isr=record.isr,
                leader=record.leader,
                leader_epoch=record.leader_epoch,
                partition_epoch=record.partition_epoch,
                adding=record.adding_replicas,
                removing=record.removing_replicas,
                elr=record.eligible_leader_replicas or (),
                last_known_elr=record.last_known_elr or (),
            )
            topic.partitions[record.partition_id] = state
            return PartitionChanged(topic, record.partition_id, state)
        if isinstance(record, PartitionChangeRecord):
            topic = self.topics_by_id[record.topic_id]
            old = topic.partitions[record.partition_id]
            leader_changed = record.leader not in (-2, old.leader)
            state = replace(
                old,
                replicas=old.replicas if record.replicas is None else record.replicas,
                isr=old.isr if record.isr is None else record.isr,
                leader=old.leader if record.leader == -2 else record.leader,
                leader_epoch=old.leader_epoch + 1 if leader_changed else old.leader_epoch,
                partition_epoch=old.partition_epoch + 1,
                adding=old.adding if record.adding_replicas is None else record.adding_replicas,
                removing=(
                    old.removing if record.removing_replicas is None else record.removing_replicas
                ),
                elr=(
                    old.elr
                    if record.eligible_leader_replicas is None
                    else record.eligible_leader_replicas
                ),
                last_known_elr=(
                    old.last_known_elr if record.last_known_elr is None else record.last_known_elr
                ),
            )
            topic.partitions[record.partition_id] = state
            return PartitionChanged(topic, record.partition_id, state)
        if isinstance(record, RemoveTopicRecord):
            topic = self.topics_by_id.pop(record.topic_id)
            del self.topics[topic.name]
            self.configs.pop((TOPIC_RESOURCE, topic.name), None)
            return TopicRemoved(topic)
        if isinstance(record, ConfigRecord):
            key = (record.resource_type, record.resource_name)
            entries = self.configs.setdefault(key, {})
            if record.value is None:
                entries.pop(record.name, None)
            else:
                entries[record.name] = record.value
            if not entries:
                del self.configs[key]
            return ConfigChanged(record.resource_type, record.resource_name)
        if isinstance(record, _BROKER_RECORDS):
            self._apply_to_broker(record)
            return None
        if isinstance(record, ProducerIdsRecord):
            self._producer_ids = record
            self.next_producer_id = record.next_producer_id
            return None
        if isinstance(record, FeatureLevelRecord):
            self.features[record.name] = record.feature_level
            return None
        raise TypeError(f"no state change defined for {type(record).__name__}")

    def _apply_to_broker(self, record: _BrokerRecord) -> None:
        if isinstance(record, RegisterBrokerRecord):
            self._registrations[record.broker_id] = record
            self.brokers[record.broker_id] = BrokerState(
                broker_id=record.broker_id,
                epoch=record.broker_epoch,
                endpoints={e.name: (e.host, e.port) for e in record.end_points},
                rack=record.rack,
                fenced=record.fenced,
                in_controlled_shutdown=record.in_controlled_shutdown,
            )
            return
        # A change names the registration it is for: one for an earlier registration of the
        # broker (a process that has been replaced since) changes nothing, as in Kafka.
        if isinstance(record, UnfenceBrokerRecord | FenceBrokerRecord):
            found = self.brokers.get(record.id)
            if found is not None and found.epoch == record.epoch:
                fenced = isinstance(record, FenceBrokerRecord)
                self.brokers[record.id] = replace(found, fenced=fenced)
            return
        if isinstance(record, BrokerRegistrationChangeRecord):
            broker = self.brokers.get(record.broker_id)
            if broker is None or broker.epoch != record.broker_epoch:
                return
            if record.fenced == FENCE:
                broker = replace(broker, fenced=True)
            elif record.fenced == UNFENCE:
                broker = replace(broker, fenced=False)
            if record.in_controlled_shutdown:
                broker = replace(broker, in_controlled_shutdown=True)
            self.brokers[record.broker_id] = broker
            return
        if isinstance(record, UnregisterBrokerRecord):
            found = self.brokers.get(record.broker_id)
            if found is not None and found.epoch == record.broker_epoch:
                del self.brokers[record.broker_id]
                self._registrations.pop(record.broker_id, None)

    def usable_broker_ids(self) -> set[int]:
        """Brokers that may lead and join ISRs: registered, unfenced, not shutting down."""
        return {
            broker.broker_id
            for broker in self.brokers.values()
            if not broker.fenced and not broker.in_controlled_shutdown
        }

    @property
    def live_brokers(self) -> list[BrokerState]:
        return [b for b in sorted(self.brokers.values(), key=lambda b: b.broker_id) if not b.fenced]
