"""Metadata: the brokers a client should talk to, and the topics it asked about.

Brokers are advertised on the listener the client connected through, as Kafka does, so a
client on an internal listener never gets an external address. Unknown topics are created
when the client allows it and `auto.create.topics.enable` is on, with `num.partitions` and
`default.replication.factor`; the answer then already describes the new topic.

v13's top-level error code is Kafka's way to send a client back to its bootstrap servers
(REBOOTSTRAP_REQUIRED, KIP-1102) when the cluster it knew is gone; a node always answers for its
own cluster, so it is NONE here, as on a Kafka broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.metadata import PartitionState, TopicRequest, TopicState
from broker.metadata.controller import validate_topic_name
from broker.metadata.elections import NO_LEADER
from broker.metadata.image import BrokerState, is_internal_topic
from broker.protocol import ApiKey, ErrorCode, RequestBody, ResponseBody, build, response_module
from broker.server import BUILT_OFF_LOOP_ENTRIES, BuiltOffLoop, RequestContext

from .context import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_OPERATIONS,
    NO_THROTTLE,
    TOPIC_OPERATIONS,
    NodeState,
)

__all__ = ["Handler", "error_response", "live_brokers", "offline_replicas", "registered_brokers"]


def live_brokers(state: NodeState, listener: str) -> list[tuple[int, str, int, str | None]]:
    """(id, host, port, rack) of every unfenced broker reachable on `listener`."""
    return [b[:4] for b in registered_brokers(state, listener, with_fenced=False)]


def registered_brokers(
    state: NodeState, listener: str, with_fenced: bool
) -> list[tuple[int, str, int, str | None, bool]]:
    """(id, host, port, rack, fenced) of every broker reachable on `listener`, by id; the
    fenced ones only `with_fenced` (DescribeCluster v2's IncludeFencedBrokers)."""
    image = state.metadata.image
    brokers = image.brokers.values() if with_fenced else image.live_brokers
    found = []
    for broker in sorted(brokers, key=lambda b: b.broker_id):
        endpoint = broker.endpoints.get(listener)
        if endpoint is not None:
            found.append((broker.broker_id, endpoint[0], endpoint[1], broker.rack, broker.fenced))
    return found


class Handler:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody | BuiltOffLoop:
        version = context.header.api_version
        schema = response_module(ApiKey.METADATA, version)
        state = self._state
        image = state.metadata.image
        brokers = tuple(
            build(schema.MetadataResponseBroker, node_id=i, host=h, port=p, rack=r)
            for i, h, p, r in live_brokers(state, context.listener)
        )
        requested = request.topics
        operations = (
            TOPIC_OPERATIONS
            if getattr(request, "include_topic_authorized_operations", False)
            else AUTHORIZED_OPERATIONS_OMITTED
        )
        # Each topic described as it is now: its partitions' states are immutable, so a copy of
        # the list is all the answer needs, wherever it is built.
        topics: list[_Described | Any] = []
        if requested is None or (version == 0 and not requested):
            topics = [_Described(t, tuple(t.partitions.items())) for t in image.topics.values()]
        else:
            await self._auto_create(request, version)
            image = state.metadata.image
            for wanted in requested:
                name = getattr(wanted, "name", None)
                topic = image.topics.get(name) if name is not None else None
                topic_id = getattr(wanted, "topic_id", None)
                if name is None and topic_id is not None:
                    topic = image.topics_by_id.get(topic_id)
                if topic is not None:
                    topics.append(_Described(topic, tuple(topic.partitions.items())))
                    continue
                error = ErrorCode.unknown_topic_or_partition
                if name is None:
                    error = ErrorCode.unknown_topic_id
                elif validate_topic_name(name) is not None:
                    error = ErrorCode.invalid_topic_exception
                topics.append(
                    build(
                        schema.MetadataResponseTopic,
                        error_code=error,
                        name=name,
                        topic_id=topic_id,
                        is_internal=False,
                        partitions=(),
                        topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
                    )
                )
        cluster_id, controller_id = state.cluster_id, state.controller_id
        asked = _Asked(schema, operations, dict(image.brokers), context.listener, version)
        cluster_operations = (
            CLUSTER_OPERATIONS
            if getattr(request, "include_cluster_authorized_operations", False)
            else AUTHORIZED_OPERATIONS_OMITTED
        )

        def answer() -> ResponseBody:
            response: ResponseBody = build(
                schema.MetadataResponse,
                throttle_time=NO_THROTTLE,
                brokers=brokers,
                cluster_id=cluster_id,
                controller_id=controller_id,
                topics=tuple(
                    _describe(t, asked) if isinstance(t, _Described) else t for t in topics
                ),
                error_code=ErrorCode.none,
                cluster_authorized_operations=cluster_operations,
            )
            return response

        described = sum(len(t.partitions) for t in topics if isinstance(t, _Described))
        return BuiltOffLoop(answer) if described >= BUILT_OFF_LOOP_ENTRIES else answer()

    async def _auto_create(self, request: Any, version: int) -> None:
        state = self._state
        allowed = getattr(request, "allow_auto_topic_creation", True)
        if not (allowed and state.config.auto_create_topics_enable):
            return
        image = state.metadata.image
        missing = [
            TopicRequest(t.name)
            for t in request.topics
            if getattr(t, "name", None)
            and t.name not in image.topics
            and not is_internal_topic(t.name)
            and validate_topic_name(t.name) is None
        ]
        if missing:
            # Answered UNKNOWN_TOPIC_OR_PARTITION (or LEADER_NOT_AVAILABLE) below until this
            # node has applied the creation; the client asks again, as with Kafka.
            await state.create_topics(missing)


@dataclass(frozen=True, slots=True)
class _Asked:
    """What a Metadata request's topics are described with, taken when it was handled."""

    schema: Any
    operations: int
    brokers: Mapping[int, BrokerState]
    """The registered brokers (their states are immutable: a copy of the mapping will do)."""
    listener: str
    version: int


@dataclass(frozen=True, slots=True)
class _Described:
    """A topic to describe, with its partitions as they were when the request was handled."""

    topic: TopicState
    partitions: tuple[tuple[int, PartitionState], ...]


def _describe(described: _Described, asked: _Asked) -> Any:
    """A topic as Kafka's metadata cache describes it to a client on `listener`: a leader that
    is not registered (or none, -1) is LEADER_NOT_AVAILABLE, one registered without that
    listener LISTENER_NOT_FOUND (LEADER_NOT_AVAILABLE before v6), either with no leader id;
    replicas on brokers not registered, fenced or without the listener are offline. Replicas
    and ISR are as the image has them, but at v0 (Kafka's `errorUnavailableEndpoints`), where
    only the replicas a client can reach are listed, and REPLICA_NOT_AVAILABLE says some are
    missing."""
    schema, brokers, listener, version = asked.schema, asked.brokers, asked.listener, asked.version
    topic = described.topic
    partitions = []
    for index, p in sorted(described.partitions):
        error = ErrorCode.none
        leader = p.leader
        replicas, isr = p.replicas, p.isr
        if version == 0:
            replicas = _reachable_only(brokers, replicas, listener)
            isr = _reachable_only(brokers, isr, listener)
        registered = brokers.get(leader)
        if registered is None:
            error, leader = ErrorCode.leader_not_available, NO_LEADER
        elif listener not in registered.endpoints:
            error = ErrorCode.listener_not_found if version >= 6 else ErrorCode.leader_not_available
            leader = NO_LEADER
        elif len(replicas) < len(p.replicas) or len(isr) < len(p.isr):
            error = ErrorCode.replica_not_available
        partitions.append(
            build(
                schema.MetadataResponsePartition,
                error_code=error,
                partition_index=index,
                leader_id=leader,
                leader_epoch=p.leader_epoch,
                replica_nodes=replicas,
                isr_nodes=isr,
                offline_replicas=offline_replicas(brokers, p, listener),
            )
        )
    return build(
        schema.MetadataResponseTopic,
        error_code=ErrorCode.none,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.internal,
        partitions=tuple(partitions),
        topic_authorized_operations=asked.operations,
    )


def offline_replicas(
    brokers: Mapping[int, BrokerState], state: PartitionState, listener: str
) -> tuple[int, ...]:
    """Replicas on brokers that are not registered, are fenced, or lack the client's listener
    (Kafka's `getOfflineReplicas`; Kafka also counts a replica in an offline log dir, which the
    image does not know). DescribeTopicPartitions lists them too."""
    return tuple(r for r in state.replicas if not _reachable(brokers.get(r), listener))


def _reachable_only(
    brokers: Mapping[int, BrokerState], replicas: tuple[int, ...], listener: str
) -> tuple[int, ...]:
    return tuple(r for r in replicas if _reachable(brokers.get(r), listener))


def _reachable(broker: BrokerState | None, listener: str) -> bool:
    """A client on `listener` can reach the replica on `broker`."""
    return broker is not None and not broker.fenced and listener in broker.endpoints


def error_response(request: RequestBody, error: ErrorCode) -> ResponseBody:
    """Every requested topic answered with `error`, and no brokers."""
    body: Any = request
    schema = response_module(ApiKey.METADATA, type(request).__version__)
    topics = tuple(
        build(
            schema.MetadataResponseTopic,
            error_code=error,
            name=getattr(topic, "name", None),
            topic_id=None,
            partitions=(),
        )
        for topic in body.topics or ()
    )
    response: ResponseBody = build(
        schema.MetadataResponse,
        throttle_time=NO_THROTTLE,
        brokers=(),
        topics=topics,
        error_code=ErrorCode.none,  # the error is each topic's, as Kafka's error response
    )
    return response
