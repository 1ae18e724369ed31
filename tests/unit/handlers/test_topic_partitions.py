"""DescribeTopicPartitions (KIP-966) from a metadata image: each partition as Metadata shows it
plus its ELR and last known ELR, missing topics, and Kafka's paging rules (the limit, the
cursor, INVALID_REQUEST for a cursor the request cannot have). Requests and responses go
through the codec, so every answer here is one the wire can carry."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.handlers.context import TOPIC_OPERATIONS, NodeState
from broker.handlers.topic_partitions import DescribeTopicPartitions
from broker.metadata import MetadataImage, PartitionState
from broker.metadata.image import BrokerState, TopicState
from broker.protocol import ApiKey, ErrorCode, RequestHeader, request_type
from broker.protocol.messages import (
    decode_request_body,
    decode_response_body,
    encode_request_body,
    encode_response_body,
)
from broker.server import RequestContext
from tests.support.requests import fill

LISTENER = "PLAINTEXT"
ZERO = None
"""The zero topic id, as the codec reads it."""


def brokers_some_unreachable() -> MetadataImage:
    """An image of brokers 1 and 2 live, 3 fenced, 4 registered without the client's listener
    (5 is not registered)."""
    image = MetadataImage()
    for broker_id, fenced, listener in ((1, False, LISTENER), (2, False, LISTENER),
                                        (3, True, LISTENER), (4, False, "OTHER")):  # fmt: skip
        image.brokers[broker_id] = BrokerState(
            broker_id, 1, {listener: ("localhost", 9090 + broker_id)}, None, fenced
        )
    return image


def _image() -> MetadataImage:
    """`brokers_some_unreachable`, and topic "a" of 3 partitions, "b" 2, "c" 1; a-1 has an
    ELR, a-2 lost its ISR."""
    image = brokers_some_unreachable()
    topics = {
        "a": {
            0: PartitionState((1, 2, 3), (1, 2), 1, 4, 7),
            1: PartitionState((2, 1, 4), (2,), 2, 2, 3, elr=(1,)),
            2: PartitionState((3, 5), (), -1, 5, 9, last_known_elr=(3,)),
        },
        "b": {0: PartitionState((2,), (2,), 2, 0, 0), 1: PartitionState((1,), (1,), 1, 0, 0)},
        "c": {0: PartitionState((4,), (4,), 4, 0, 0)},
        "__consumer_offsets": {0: PartitionState((1,), (1,), 1, 0, 0)},
    }
    for number, (name, partitions) in enumerate(topics.items(), start=1):
        topic = TopicState(name, uuid.UUID(int=number), dict(partitions))
        image.topics[name] = topic
        image.topics_by_id[topic.topic_id] = topic
    return image


def _describe(
    image: MetadataImage,
    names: list[str],
    limit: int = 2000,
    cursor: tuple[str, int] | None = None,
) -> Any:
    values = {
        "topics": [{"name": n} for n in names],
        "response_partition_limit": limit,
        "cursor": None
        if cursor is None
        else {"topic_name": cursor[0], "partition_index": cursor[1]},
    }
    version = 0
    filled = fill(request_type(ApiKey.DESCRIBE_TOPIC_PARTITIONS, version), values)
    body = decode_request_body(
        ApiKey.DESCRIBE_TOPIC_PARTITIONS, version, encode_request_body(filled)
    )
    header = RequestHeader(ApiKey.DESCRIBE_TOPIC_PARTITIONS, version, 1, "unit")
    state = cast(NodeState, SimpleNamespace(metadata=SimpleNamespace(image=image)))
    response = asyncio.run(
        DescribeTopicPartitions(state)(RequestContext(header, LISTENER, ""), body)
    )
    return decode_response_body(
        ApiKey.DESCRIBE_TOPIC_PARTITIONS, version, encode_response_body(response)
    )


def _pages(response: Any) -> list[tuple[str, list[int]]]:
    return [(t.name, [p.partition_index for p in t.partitions]) for t in response.topics]


def _cursor(response: Any) -> tuple[str, int] | None:
    cursor = response.next_cursor
    return None if cursor is None else (cursor.topic_name, cursor.partition_index)


def test_each_partition_as_the_image_has_it_with_its_elr() -> None:
    response = _describe(_image(), ["a"])
    (topic,) = response.topics
    assert (topic.error_code, topic.name, topic.topic_id) == (ErrorCode.none, "a", uuid.UUID(int=1))
    assert (topic.is_internal, topic.topic_authorized_operations) == (False, TOPIC_OPERATIONS)
    described = [
        (p.partition_index, p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes,
         p.eligible_leader_replicas, p.last_known_elr, p.offline_replicas)
        for p in topic.partitions
    ]  # fmt: skip
    assert described == [
        # Broker 3 is fenced: offline, though still a replica and in the image's ISR as given.
        (0, 1, 4, (1, 2, 3), (1, 2), (), (), (3,)),
        # Broker 4 has no endpoint on the client's listener: offline for this client.
        (1, 2, 2, (2, 1, 4), (2,), (1,), (), (4,)),
        # No leader; broker 5 is not registered.
        (2, -1, 5, (3, 5), (), (), (3,), (3, 5)),
    ]
    assert response.next_cursor is None


def test_a_leader_without_the_client_s_listener_is_no_leader() -> None:
    (topic,) = _describe(_image(), ["c"]).topics
    (partition,) = topic.partitions
    assert (partition.leader_id, partition.offline_replicas) == (-1, (4,))


def test_missing_and_illegal_topics_are_answered_with_their_error() -> None:
    response = _describe(_image(), ["nope", "b", "bad name!", "__transaction_state"])
    answers = [
        (t.name, t.error_code, t.topic_id, t.is_internal, t.partitions) for t in response.topics
    ]
    assert answers == [
        ("__transaction_state", ErrorCode.unknown_topic_or_partition, ZERO, True, ()),
        ("b", ErrorCode.none, uuid.UUID(int=2), False, answers[1][4]),
        ("bad name!", ErrorCode.invalid_topic_exception, ZERO, False, ()),
        ("nope", ErrorCode.unknown_topic_or_partition, ZERO, False, ()),
    ]
    assert {t.topic_authorized_operations for t in response.topics} == {TOPIC_OPERATIONS}


def test_every_topic_in_name_order_when_none_is_named() -> None:
    response = _describe(_image(), [])
    assert _pages(response) == [
        ("__consumer_offsets", [0]), ("a", [0, 1, 2]), ("b", [0, 1]), ("c", [0])
    ]  # fmt: skip
    assert response.topics[0].is_internal


def test_the_limit_cuts_a_topic_and_the_cursor_resumes_there() -> None:
    image = _image()
    first = _describe(image, ["a", "b", "c"], limit=4)
    assert (_pages(first), _cursor(first)) == ([("a", [0, 1, 2]), ("b", [0])], ("b", 1))
    second = _describe(image, ["a", "b", "c"], limit=4, cursor=("b", 1))
    assert (_pages(second), _cursor(second)) == ([("b", [1]), ("c", [0])], None)


def test_a_limit_that_ends_with_a_topic_points_at_the_next_one() -> None:
    response = _describe(_image(), [], limit=4)
    assert _pages(response) == [("__consumer_offsets", [0]), ("a", [0, 1, 2])]
    assert _cursor(response) == ("b", 0)


def test_missing_topics_do_not_count_against_the_limit() -> None:
    response = _describe(_image(), ["a", "aa", "b"], limit=4)
    assert _pages(response) == [("a", [0, 1, 2]), ("aa", []), ("b", [0])]
    assert response.topics[1].error_code == ErrorCode.unknown_topic_or_partition
    assert _cursor(response) == ("b", 1)


def test_the_next_cursor_may_name_a_missing_topic() -> None:
    """Kafka points the cursor at the next name once the limit is reached, without looking it
    up: the next page answers it UNKNOWN_TOPIC_OR_PARTITION."""
    response = _describe(_image(), ["a", "aa", "b"], limit=3)
    assert (_pages(response), _cursor(response)) == ([("a", [0, 1, 2])], ("aa", 0))


@pytest.mark.parametrize(("limit", "expected"), [(0, 1), (-5, 1), (1_000_000, 2000)])
def test_the_limit_is_at_least_one_and_at_most_kafka_s_maximum(limit: int, expected: int) -> None:
    image = _image()
    image.topics["big"] = TopicState(
        "big", uuid.UUID(int=99), {i: PartitionState((1,), (1,), 1, 0, 0) for i in range(2500)}
    )
    response = _describe(image, ["big"], limit=limit)
    assert len(response.topics[0].partitions) == expected
    assert _cursor(response) == ("big", expected)


@pytest.mark.parametrize(
    ("names", "cursor"),
    [(["a", "b"], ("c", 0)), (["a", "b"], ("b", -1)), ([], ("a", -1))],
    ids=["cursor topic not named", "negative partition", "negative partition, all topics"],
)
def test_a_cursor_the_request_cannot_have_is_invalid_request(
    names: list[str], cursor: tuple[str, int]
) -> None:
    response = _describe(_image(), names, cursor=cursor)
    assert [(t.name, t.error_code, t.partitions) for t in response.topics] == [
        (name, ErrorCode.invalid_request, ()) for name in names
    ]
    assert response.next_cursor is None


def test_a_cursor_past_a_topic_s_end_answers_it_empty() -> None:
    response = _describe(_image(), ["a", "b"], cursor=("a", 7))
    assert _pages(response) == [("a", []), ("b", [0, 1])]
    assert response.next_cursor is None
