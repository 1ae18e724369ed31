"""What handlers see of the node: its identity, its listeners, its metadata and partitions."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

from broker.config import BrokerConfig
from broker.forwarding import Forwarding
from broker.groups.service import GroupService
from broker.kraft import MetadataService, NotController
from broker.metadata import TopicRequest
from broker.protocol import (
    ApiKey,
    RequestHeader,
    build,
    decode_response,
    encode_request,
)
from broker.protocol.errors import ErrorCode
from broker.protocol.messages import request_module
from broker.replica import ReplicaManager

__all__ = [
    "AUTHORIZED_OPERATIONS_OMITTED",
    "CLUSTER_OPERATIONS",
    "NO_THROTTLE",
    "OFFSETS_TOPIC",
    "TOPIC_OPERATIONS",
    "CurrentLeader",
    "Endpoint",
    "NodeState",
    "in_turns",
    "steady_clock_ms",
    "wall_clock_ms",
]

NO_THROTTLE = timedelta(0)
"""`throttle_time_ms` of every response: quotas are not enforced yet."""

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
"""`*_authorized_operations` when the client did not ask for them (Kafka's INT32_MIN)."""


def _operations(*codes: int) -> int:
    return sum(1 << code for code in codes)


# Kafka's AclOperation codes: READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8,
# CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12.
TOPIC_OPERATIONS = _operations(3, 4, 5, 6, 7, 8, 10, 11)
"""Every operation on a topic (Kafka's `AclEntry.supportedOperations(TOPIC)`): all allowed, as
on a Kafka broker without an authorizer, which admin UIs read to enable their buttons."""
CLUSTER_OPERATIONS = _operations(5, 7, 8, 9, 10, 11, 12)
"""Every operation on the cluster, likewise."""

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_SEGMENT_BYTES = 104_857_600
"""`offsets.topic.segment.bytes`: small segments so compaction reaches old commits soon."""


log = logging.getLogger(__name__)

_CREATE_TOPICS_VERSION = 7

T = TypeVar("T")
R = TypeVar("R")

ITEMS_PER_TURN = 100
"""Items (topics, partitions) a handler turns into Python objects per turn of the event loop
when a request carries many: 100 topics of a CreateTopics cost about 1 ms, and a request of
1000 topics made in one go held every other client 6 ms."""


async def in_turns(function: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """`[function(item) for item in items]`, handing the event loop to the other clients
    after every `ITEMS_PER_TURN` items."""
    results: list[R] = []
    for number, item in enumerate(items, 1):
        results.append(function(item))
        if number % ITEMS_PER_TURN == 0:
            await asyncio.sleep(0)
    return results


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def steady_clock_ms() -> Callable[[], int]:
    """A clock in milliseconds since the epoch that is never stepped: the wall clock as it
    read when this was called, advanced by the monotonic clock since. Consumer group session,
    rebalance and sync deadlines run on it (Kafka's timers use `System.nanoTime`), so an NTP
    step or an operator changing the date neither expires every member at once nor keeps a
    dead one forever; it stays within the wall clock's drift of the time records are stamped
    with."""
    wall = time.time_ns()
    start = time.monotonic_ns()

    def now_ms() -> int:
        return (wall + time.monotonic_ns() - start) // 1_000_000

    return now_ms


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class CurrentLeader:
    """A partition's leader as the metadata image has it (KIP-951: Produce v10+ and Fetch v16+
    name it beside NOT_LEADER_OR_FOLLOWER so the client can move without a Metadata round)."""

    leader_id: int = -1
    leader_epoch: int = -1
    node: tuple[int, str, int, str | None] | None = None
    """(id, host, port, rack) of the leader on the request's listener, if it is alive there."""


@dataclass
class NodeState:
    config: BrokerConfig
    cluster_id: str
    metadata: MetadataService
    replicas: ReplicaManager
    groups: GroupService
    advertised: dict[str, Endpoint] = field(default_factory=dict)
    """Listener name → the host and port clients are told to use."""
    clock: Callable[[], int] = wall_clock_ms
    """Wall-clock milliseconds (timestamps clients see)."""
    forwarding: Forwarding | None = None
    """Sends this broker's own metadata writes to the active controller when it is not it."""
    producer_ids: Callable[[], Awaitable[range | None]] | None = None
    """Asks the active controller for this broker's next block of producer ids
    (AllocateProducerIds); None when none was handed out."""

    @property
    def node_id(self) -> int:
        return self.config.node_id

    @property
    def controller_id(self) -> int:
        """What Metadata and DescribeCluster name as the controller: this broker, which
        forwards admin writes to the active controller (KIP-590). Kafka's brokers name a
        random live broker, never the quorum's leader: a client that sends its CreateTopics
        to a controller that has just died waits for it, where a live broker answers at once
        (NOT_CONTROLLER while the quorum elects, which clients retry)."""
        return self.node_id

    def current_leader(self, topic: str, partition: int, listener: str) -> CurrentLeader:
        image = self.metadata.image
        found = image.topics.get(topic)
        state = found.partitions.get(partition) if found is not None else None
        if state is None:
            return CurrentLeader()
        broker = image.brokers.get(state.leader)
        node = None
        if broker is not None and not broker.fenced and listener in broker.endpoints:
            host, port = broker.endpoints[listener]
            node = (state.leader, host, port, broker.rack)
        return CurrentLeader(state.leader, state.leader_epoch, node)

    # -- what the group coordinator needs from the node (GroupNodeInfo) --------------------

    def coordinator_endpoint(self, group_id: str, listener: str) -> tuple[int, str, int] | None:
        leader = self.current_leader(OFFSETS_TOPIC, self.groups.partition_for(group_id), listener)
        if leader.node is None:
            return None
        node_id, host, port, _ = leader.node
        return node_id, host, port

    def partition_exists(self, topic: str, partition: int) -> bool:
        found = self.metadata.image.topics.get(topic)
        return found is not None and partition in found.partitions

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        found = self.metadata.image.topics_by_id.get(topic_id)
        return None if found is None else found.name

    def topic_id(self, name: str) -> uuid.UUID | None:
        found = self.metadata.image.topics.get(name)
        return None if found is None else found.topic_id

    async def create_topics(self, requests: list[TopicRequest]) -> list[tuple[ErrorCode, str]]:
        """This broker's own topic creations (`__consumer_offsets`, auto-created topics): with
        the controller in this node, proposed here; otherwise sent to the active controller as
        a CreateTopics from this broker (KIP-590's forwarding). (error, message) per request,
        once committed; BROKER_NOT_AVAILABLE when no controller could be asked."""
        if self.metadata.is_active_controller or self.forwarding is None:
            try:
                results = await self.metadata.propose(
                    lambda c: c.create_topics(requests, by_broker=True)
                )
            except NotController as exc:
                return [(ErrorCode.not_controller, str(exc))] * len(requests)
            return [(r.error, r.message or "") for r in results]
        schema = request_module(ApiKey.CREATE_TOPICS, _CREATE_TOPICS_VERSION)
        body = build(
            schema.CreateTopicsRequest,
            topics=tuple(
                build(
                    schema.CreatableTopic,
                    name=topic.name,
                    num_partitions=topic.num_partitions,
                    replication_factor=topic.replication_factor,
                    assignments=(),
                    configs=tuple(
                        build(schema.CreatableTopicConfig, name=k, value=v)
                        for k, v in topic.configs.items()
                    ),
                )
                for topic in requests
            ),
            timeout=timedelta(seconds=30),
            validate_only=False,
        )
        header = RequestHeader(ApiKey.CREATE_TOPICS, _CREATE_TOPICS_VERSION, 0, "gregor-broker")
        answer = await self.forwarding.send_as_broker(encode_request(header, body)[4:])
        if answer is None:
            return [(ErrorCode.broker_not_available, "no controller answered")] * len(requests)
        _, response = decode_response(ApiKey.CREATE_TOPICS, _CREATE_TOPICS_VERSION, answer[4:])
        by_name = {t.name: t for t in response.topics}  # type: ignore[union-attr]
        return [
            (ErrorCode(by_name[t.name].error_code), by_name[t.name].error_message or "")
            if t.name in by_name
            else (ErrorCode.unknown_server_error, "not in the controller's answer")
            for t in requests
        ]

    async def ensure_offsets_topic(self) -> bool:
        """Create `__consumer_offsets` on first use, as Kafka does: compacted, with
        `offsets.topic.num.partitions` partitions and `offsets.topic.replication.factor`
        replicas — which must not exceed the live brokers (then groups are unavailable, and
        the log says which setting to change)."""
        if OFFSETS_TOPIC in self.metadata.image.topics:
            return True
        request = TopicRequest(
            OFFSETS_TOPIC,
            num_partitions=self.config.offsets_topic_num_partitions,
            replication_factor=self.config.offsets_topic_replication_factor,
            configs={
                "cleanup.policy": "compact",
                "compression.type": "producer",
                "segment.bytes": str(OFFSETS_TOPIC_SEGMENT_BYTES),
            },
        )
        [(error, message)] = await self.create_topics([request])
        if error not in (ErrorCode.none, ErrorCode.topic_already_exists):
            log.warning(
                "cannot create %s (offsets.topic.replication.factor=%d): %s",
                OFFSETS_TOPIC,
                self.config.offsets_topic_replication_factor,
                message,
            )
            return False
        # The controller answers once it committed; this node applies it a fetch later.
        return OFFSETS_TOPIC in self.metadata.image.topics
