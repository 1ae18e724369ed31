"""DescribeTopicPartitions (KIP-966): topics and their partitions from this node's metadata
image, as Metadata describes them, with each partition's eligible leader replicas and last
known ELR, and paged so that a topic of many partitions never makes one huge answer. Kafka 4's
Admin `describeTopics` (and so `kafka-topics --describe`) uses it when a broker advertises it.

The rules are Kafka's (`DescribeTopicPartitionsRequestHandler` and its metadata cache):
- topics are answered in name order, from the `Cursor`'s topic and partition on; no topics
  named means every topic in the image, with no error entries;
- at most `ResponsePartitionLimit` partitions, never more than
  `max.request.partition.size.limit` (2000) nor fewer than 1. Where the limit cuts a topic,
  `NextCursor` names that topic and its first partition left out; where it falls between two
  topics, the next topic and partition 0; no cursor once everything is answered;
- a cursor naming a topic missing from the topics named, or a negative partition, is
  INVALID_REQUEST for every topic named, as Kafka's error response;
- a missing topic is UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for an illegal name)
  with the zero id; its entry does not count against the limit;
- a partition's leader is -1 when the leader is not registered with the client's listener;
  its offline replicas are those on brokers not registered, fenced, or without that listener.
  Replicas, ISR and ELR are as the image has them, unfiltered.
- topic authorized operations are always filled in, a missing topic's too (the request has
  no flag for them): every operation, as on a Kafka broker without an authorizer.
"""

from __future__ import annotations

from typing import Any

from broker.metadata.controller import validate_topic_name
from broker.metadata.elections import NO_LEADER
from broker.metadata.image import MetadataImage, PartitionState, TopicState, is_internal_topic
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, TOPIC_OPERATIONS, NodeState
from .metadata import offline_replicas

__all__ = ["MAX_REQUEST_PARTITION_SIZE_LIMIT", "DescribeTopicPartitions"]

MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000
"""Kafka's `max.request.partition.size.limit` (read-only, default 2000): the most partitions
one answer holds, whatever the client asks for."""


class DescribeTopicPartitions:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.DESCRIBE_TOPIC_PARTITIONS, context.header.api_version)
        image = self._state.metadata.image
        cursor = request.cursor
        after = cursor.topic_name if cursor is not None else ""
        every_topic = not request.topics
        if every_topic:
            names = sorted(name for name in image.topics if name >= after)
        else:
            names = sorted({t.name for t in request.topics if t.name >= after})
            if cursor is not None and cursor.topic_name not in names:
                return _refused(schema, request)
        if cursor is not None and cursor.partition_index < 0:
            return _refused(schema, request)
        limit = max(min(MAX_REQUEST_PARTITION_SIZE_LIMIT, request.response_partition_limit), 1)
        topics, next_cursor = describe(
            schema,
            image,
            names,
            context.listener,
            first_partition=cursor.partition_index if cursor is not None else 0,
            first_topic=after,
            limit=limit,
            report_missing=not every_topic,
        )
        response: ResponseBody = build(
            schema.DescribeTopicPartitionsResponse,
            throttle_time=NO_THROTTLE,
            topics=tuple(topics),
            next_cursor=next_cursor,
        )
        return response


def describe(
    schema: Any,
    image: MetadataImage,
    names: list[str],
    listener: str,
    *,
    first_topic: str,
    first_partition: int,
    limit: int,
    report_missing: bool,
) -> tuple[list[Any], Any]:
    """The answers for `names` (sorted), up to `limit` partitions, and the next cursor."""
    topics: list[Any] = []
    remaining = limit
    for name in names:
        if remaining == 0:
            return topics, build(schema.Cursor, topic_name=name, partition_index=0)
        topic = image.topics.get(name)
        if topic is None:
            if report_missing:
                topics.append(_missing(schema, name))
            continue
        start = first_partition if name == first_topic else 0
        count = len(topic.partitions)
        end = min(count, start + remaining)
        partitions = [
            _partition(schema, image, index, topic.partitions[index], listener)
            for index in range(start, end)
            if index in topic.partitions
        ]
        topics.append(_topic(schema, topic, partitions))
        if end < count:
            return topics, build(schema.Cursor, topic_name=name, partition_index=end)
        remaining -= len(partitions)
    return topics, None


def _topic(schema: Any, topic: TopicState, partitions: list[Any]) -> Any:
    return build(
        schema.DescribeTopicPartitionsResponseTopic,
        error_code=ErrorCode.none,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.internal,
        partitions=tuple(partitions),
        topic_authorized_operations=TOPIC_OPERATIONS,
    )


def _partition(
    schema: Any, image: MetadataImage, index: int, state: PartitionState, listener: str
) -> Any:
    leader = image.brokers.get(state.leader)
    return build(
        schema.DescribeTopicPartitionsResponsePartition,
        error_code=ErrorCode.none,
        partition_index=index,
        leader_id=state.leader
        if leader is not None and listener in leader.endpoints
        else NO_LEADER,
        leader_epoch=state.leader_epoch,
        replica_nodes=state.replicas,
        isr_nodes=state.isr,
        eligible_leader_replicas=state.elr,
        last_known_elr=state.last_known_elr,
        offline_replicas=offline_replicas(image.brokers, state, listener),
    )


def _missing(schema: Any, name: str) -> Any:
    error = ErrorCode.unknown_topic_or_partition
    if validate_topic_name(name) is not None:
        error = ErrorCode.invalid_topic_exception
    return build(
        schema.DescribeTopicPartitionsResponseTopic,
        error_code=error,
        name=name,
        topic_id=None,  # the zero id on the wire
        is_internal=is_internal_topic(name),
        partitions=(),
        topic_authorized_operations=TOPIC_OPERATIONS,  # Kafka fills them in for every topic
    )


def _refused(schema: Any, request: Any) -> ResponseBody:
    """Kafka's error response: INVALID_REQUEST for every topic named, nothing else."""
    seen: dict[str, Any] = {}
    for topic in request.topics:
        seen.setdefault(
            topic.name,
            build(
                schema.DescribeTopicPartitionsResponseTopic,
                error_code=ErrorCode.invalid_request,
                name=topic.name,
                topic_id=None,  # the zero id on the wire
                is_internal=False,
                partitions=(),
            ),
        )
    response: ResponseBody = build(
        schema.DescribeTopicPartitionsResponse,
        throttle_time=NO_THROTTLE,
        topics=tuple(seen.values()),
        next_cursor=None,
    )
    return response
