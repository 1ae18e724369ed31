"""The Raft core's messages through Kafka's quorum requests and responses, encoded to bytes and
decoded again: every field the core acts on arrives as it was sent."""

from __future__ import annotations

import dataclasses

import pytest

from broker.protocol import ApiKey, ErrorCode, MalformedInput, RequestHeader
from broker.protocol.messages import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from broker.quorum.wire import (
    message_from_request,
    reply_from_response,
    request_for,
    response_for,
)
from broker.raft import (
    BeginQuorumEpoch,
    BeginQuorumEpochReply,
    Diverging,
    EndQuorumEpoch,
    Entry,
    Fetch,
    FetchReply,
    FetchSnapshot,
    FetchSnapshotReply,
    Message,
    SnapshotId,
    Vote,
    VoteReply,
)

ENDPOINT = ("CONTROLLER", "localhost", 9093)


def _over_the_wire(message: Message, to: int) -> tuple[ApiKey, int, Message]:
    api_key, version, body = request_for(
        message, to, cluster_id="c1", endpoint=ENDPOINT, fetch_wait_ms=500, max_bytes=1 << 20
    )
    frame = encode_request(RequestHeader(api_key, version, 7, "raft-client-1"), body)
    request = decode_request(frame[4:])
    return api_key, version, message_from_request(api_key, request.body)


def _answer(
    api_key: ApiKey, version: int, sent: Message, to: int, reply: Message | None
) -> Message | None:
    body = response_for(api_key, version, reply, epoch=9, leader=2, now_ms=5, voters=(1, 2, 3))
    frame = encode_response(RequestHeader(api_key, version, 7, "x"), body)
    _, decoded = decode_response(api_key, version, frame[4:])
    return reply_from_response(sent, to, decoded)


@pytest.mark.parametrize(
    "message",
    [
        Vote(1, 5, 4, 120, pre_vote=False),
        Vote(1, 6, 4, 120, pre_vote=True),
        BeginQuorumEpoch(1, 5),
        EndQuorumEpoch(1, 5, (3, 2)),
        Fetch(1, 5, 120, 4),
        FetchSnapshot(1, 5, SnapshotId(100, 4), 4096),
    ],
    ids=lambda m: type(m).__name__ + ("-pre" if getattr(m, "pre_vote", False) else ""),
)
def test_requests_arrive_as_sent(message: Message) -> None:
    _, _, received = _over_the_wire(message, to=2)
    assert received == message


def test_a_pre_vote_carries_the_senders_current_epoch_as_kafka_does() -> None:
    _, _, body = request_for(
        Vote(1, 6, 4, 120, pre_vote=True),
        2,
        cluster_id="c",
        endpoint=None,
        fetch_wait_ms=1,
        max_bytes=1,
    )
    partition = body.topics[0].partitions[0]
    assert (partition.replica_epoch, partition.pre_vote) == (5, True)


@pytest.mark.parametrize(
    ("sent", "reply"),
    [
        (Vote(1, 5, 4, 120), VoteReply(2, 5, True, False)),
        (Vote(1, 5, 4, 120), VoteReply(2, 7, False, False, leader=3)),
        (Vote(1, 6, 4, 120, pre_vote=True), VoteReply(2, 6, True, True)),
        (Vote(1, 6, 4, 120, pre_vote=True), VoteReply(2, 5, False, True, leader=3)),
        (
            Fetch(1, 5, 3, 4),
            FetchReply(
                2,
                5,
                2,
                4,
                3,
                4,
                entries=(Entry(5, b"", control=True), Entry(5, b"a"), Entry(5, b"b")),
            ),
        ),
        (Fetch(1, 5, 3, 4), FetchReply(2, 5, 2, 1, 3, 4, diverging=Diverging(3, 2))),
        (Fetch(1, 5, 3, 4), FetchReply(2, 5, 2, 9, 3, 4, snapshot=SnapshotId(8, 4))),
        (Fetch(1, 5, 3, 4), FetchReply(2, 6, 3, -1, 3, 4, rejected=True)),
        (
            FetchSnapshot(1, 5, SnapshotId(8, 4), 10),
            FetchSnapshotReply(2, 5, 2, SnapshotId(8, 4), 30, 10, b"chunk"),
        ),
        (
            FetchSnapshot(1, 5, SnapshotId(8, 4), 10),
            FetchSnapshotReply(2, 5, 2, SnapshotId(8, 4), 0, 0, missing=True),
        ),
    ],
)
def test_replies_arrive_as_sent(sent: Message, reply: Message) -> None:
    api_key, version, _ = _over_the_wire(sent, to=2)
    assert _answer(api_key, version, sent, 2, reply) == reply


def test_a_request_the_core_did_not_answer_in_time_carries_nothing_for_it() -> None:
    sent = Fetch(1, 5, 3, 4)
    api_key, version, _ = _over_the_wire(sent, to=2)
    body = response_for(
        api_key, version, None, epoch=5, leader=2, error=ErrorCode.request_timed_out
    )
    frame = encode_response(RequestHeader(api_key, version, 7, "x"), body)
    _, decoded = decode_response(api_key, version, frame[4:])
    assert reply_from_response(sent, 2, decoded) is None


@pytest.mark.parametrize(
    ("voter_epoch", "error", "expected"),
    [
        (7, ErrorCode.fenced_leader_epoch, BeginQuorumEpochReply(2, 7, None)),
        (5, ErrorCode.none, None),
    ],
)
def test_a_voter_further_on_answers_begin_quorum_epoch_with_its_epoch(
    voter_epoch: int, error: ErrorCode, expected: Message | None
) -> None:
    """What draws a voter that went to a higher epoch alone back into the quorum: the old
    leader learns its epoch from the response; a voter in the same epoch says nothing new."""
    sent = BeginQuorumEpoch(1, 5)
    api_key, version, _ = _over_the_wire(sent, to=2)
    body = response_for(api_key, version, None, epoch=voter_epoch, leader=None, error=error)
    frame = encode_response(RequestHeader(api_key, version, 7, "x"), body)
    _, decoded = decode_response(api_key, version, frame[4:])
    assert reply_from_response(sent, 2, decoded) == expected


def test_a_request_for_another_topic_is_malformed() -> None:
    api_key, _, body = request_for(
        BeginQuorumEpoch(1, 5), 2, cluster_id="c", endpoint=None, fetch_wait_ms=1, max_bytes=1
    )
    topic = dataclasses.replace(body.topics[0], topic_name="orders")
    other = dataclasses.replace(body, topics=(topic,))
    with pytest.raises(MalformedInput, match="orders, not __cluster_metadata"):
        message_from_request(api_key, other)
