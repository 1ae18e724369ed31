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

from dataclasses import dataclass
from typing import Any

from broker.metadata import PartitionState, TopicRequest, TopicState
from broker.metadata.controller import validate_topic_name
from broker.metadata.image import is_internal_topic
from broker.protocol import ApiKey, ErrorCode, RequestBody, ResponseBody, build, response_module
from broker.server import BUILT_OFF_LOOP_ENTRIES, BuiltOffLoop, RequestContext

from .context import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_OPERATIONS,
    NO_THROTTLE,
    TOPIC_OPERATIONS,
    NodeState,
)

__all__ = ["Handler", "error_response", "live_brokers", "registered_brokers"]


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
                    _describe(schema, t, operations) if isinstance(t, _Described) else t
                    for t in topics
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
class _Described:
    """A topic to describe, with its partitions as they were when the request was handled."""

    topic: TopicState
    partitions: tuple[tuple[int, PartitionState], ...]


def _describe(schema: Any, described: _Described, operations: int) -> Any:
    topic = described.topic
    partitions = tuple(
        build(
            schema.MetadataResponsePartition,
            error_code=ErrorCode.none,
            partition_index=index,
            leader_id=p.leader,
            leader_epoch=p.leader_epoch,
            replica_nodes=p.replicas,
            isr_nodes=p.isr,
            offline_replicas=(),
        )
        for index, p in sorted(described.partitions)
    )
    return build(
        schema.MetadataResponseTopic,
        error_code=ErrorCode.none,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.internal,
        partitions=partitions,
        topic_authorized_operations=operations,
    )


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
