"""Metadata from a metadata image, partition by partition as Kafka's metadata cache answers it:
a leader that is not registered is LEADER_NOT_AVAILABLE, one without the client's listener
LISTENER_NOT_FOUND (LEADER_NOT_AVAILABLE before v6), each with no leader id; offline replicas
are those on brokers not registered, fenced or without the listener; v0 lists only reachable
replicas. A big answer is built off the event loop, and is the same answer. Requests and
responses go through the codec."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.handlers.context import NodeState
from broker.handlers.metadata import Handler
from broker.metadata import MetadataImage, PartitionState
from broker.metadata.image import TopicState
from broker.protocol import ApiKey, ErrorCode, RequestHeader, request_type
from broker.protocol.messages import (
    decode_request_body,
    decode_response_body,
    encode_request_body,
    encode_response_body,
)
from broker.server import BUILT_OFF_LOOP_ENTRIES, BuiltOffLoop, RequestContext
from tests.support.requests import fill
from tests.unit.handlers.test_topic_partitions import LISTENER, brokers_some_unreachable


def _image() -> MetadataImage:
    """Brokers 1 and 2 live, 3 fenced, 4 registered without the client's listener, 5 not
    registered (`brokers_some_unreachable`)."""
    image = brokers_some_unreachable()
    topics = {
        "a": {
            0: PartitionState((1, 2, 3), (1, 2, 3), 1, 4, 7),
            1: PartitionState((2, 1), (2, 1), 2, 2, 3),
            2: PartitionState((3, 5), (), -1, 5, 9),
            3: PartitionState((4, 1), (4, 1), 4, 1, 1),
            4: PartitionState((5, 1), (5, 1), 5, 1, 1),
        },
        "big": {i: PartitionState((1, 2), (1, 2), 1 + i % 2, 0, 0) for i in range(2500)},
    }
    for number, (name, partitions) in enumerate(topics.items(), start=1):
        topic = TopicState(name, uuid.UUID(int=number), dict(partitions))
        image.topics[name] = topic
        image.topics_by_id[topic.topic_id] = topic
    return image


def _answer(image: MetadataImage, topic: str, version: int) -> tuple[Any, Any]:
    """(the handler's answer as it returned it, the response as a client decodes it)."""
    values = {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
    filled = fill(request_type(ApiKey.METADATA, version), values)
    body = decode_request_body(ApiKey.METADATA, version, encode_request_body(filled))
    header = RequestHeader(ApiKey.METADATA, version, 1, "unit")
    state = cast(
        NodeState,
        SimpleNamespace(
            metadata=SimpleNamespace(image=image),
            cluster_id="c",
            controller_id=1,
            config=SimpleNamespace(auto_create_topics_enable=False),
        ),
    )
    returned = asyncio.run(Handler(state)(RequestContext(header, LISTENER, ""), body))
    response = returned.build() if isinstance(returned, BuiltOffLoop) else returned
    wire = encode_response_body(response)
    return returned, decode_response_body(ApiKey.METADATA, version, wire)


def _partitions(response: Any) -> dict[int, tuple[Any, ...]]:
    (topic,) = response.topics
    return {
        p.partition_index: (p.error_code, p.leader_id, p.replica_nodes, p.isr_nodes,
                            getattr(p, "offline_replicas", ()))
        for p in topic.partitions
    }  # fmt: skip


def test_leaders_and_replicas_a_client_cannot_reach_are_told_as_kafka_tells_them() -> None:
    _, response = _answer(_image(), "a", 12)
    assert _partitions(response) == {
        # Broker 3 is fenced: offline, though a replica and in the ISR as the image has it.
        0: (ErrorCode.none, 1, (1, 2, 3), (1, 2, 3), (3,)),
        1: (ErrorCode.none, 2, (2, 1), (2, 1), ()),
        # No leader; broker 5 is not registered.
        2: (ErrorCode.leader_not_available, -1, (3, 5), (), (3, 5)),
        # The leader has no endpoint on the client's listener.
        3: (ErrorCode.listener_not_found, -1, (4, 1), (4, 1), (4,)),
        # The leader is not registered.
        4: (ErrorCode.leader_not_available, -1, (5, 1), (5, 1), (5,)),
    }


def test_before_v6_a_leader_without_the_listener_is_leader_not_available() -> None:
    _, response = _answer(_image(), "a", 5)
    assert _partitions(response)[3][:2] == (ErrorCode.leader_not_available, -1)


def test_v0_lists_only_the_replicas_a_client_can_reach() -> None:
    _, response = _answer(_image(), "a", 0)
    described = {i: (error, replicas, isr) for i, (error, _, replicas, isr, _) in
                 _partitions(response).items()}  # fmt: skip
    assert described[0] == (ErrorCode.replica_not_available, (1, 2), (1, 2))
    assert described[1] == (ErrorCode.none, (2, 1), (2, 1))


@pytest.mark.parametrize("version", [1, 12])
def test_a_big_topic_is_described_off_the_loop_and_whole(version: int) -> None:
    returned, response = _answer(_image(), "big", version)
    assert isinstance(returned, BuiltOffLoop), "2,500 partitions were built on the loop"
    assert len(_image().topics["big"].partitions) >= BUILT_OFF_LOOP_ENTRIES
    described = _partitions(response)
    assert sorted(described) == list(range(2500))
    assert described[7] == (ErrorCode.none, 2, (1, 2), (1, 2), ())
    small, _ = _answer(_image(), "a", version)
    assert not isinstance(small, BuiltOffLoop)
