"""The Raft core's messages as Kafka's requests and responses (KIP-595, KIP-630, KIP-996).

Requests carry the core's message whole, but Kafka's responses do not name what they answer:
the driver maps a response back with the request it sent (`reply_from_response`), which is
where a fetch reply's `fetch_offset` and `last_fetched_epoch` and a vote reply's `pre_vote`
come from.

One difference of meaning is mapped here. The core asks for a pre-vote in the epoch it would
campaign in (its own plus one); Kafka's pre-vote carries the sender's current epoch
(`replica_epoch`), and a granted pre-vote answers with it. Kafka's KRaft voters can therefore
not be mixed with Gregor's in one quorum, which nobody asked for: the mapping only keeps each
field's meaning as Kafka documents it.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Sequence
from typing import Any

from broker.protocol import ApiKey, ErrorCode, MalformedInput, ResponseBody, build
from broker.protocol.messages import request_module, response_module
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

from .batches import decode_entries, encode_entries
from .store import METADATA_TOPIC

__all__ = [
    "METADATA_TOPIC_ID",
    "RequestFor",
    "Versions",
    "error_of",
    "message_from_request",
    "reply_from_response",
    "request_for",
    "response_for",
]

METADATA_TOPIC_ID = uuid.UUID(int=1)
"""Kafka's `Uuid.METADATA_TOPIC_ID`: how Fetch v13+ names `__cluster_metadata`."""

_REJECTED = frozenset(
    {
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.not_leader_or_follower,
    }
)


class Versions:
    """The versions a driver sends (every Gregor node serves them)."""

    VOTE = 2
    BEGIN_QUORUM_EPOCH = 1
    END_QUORUM_EPOCH = 1
    FETCH = 17
    FETCH_SNAPSHOT = 1


RequestFor = tuple[ApiKey, int, Any]
"""(API key, version, request body): the body typed loosely, as kio types each API's own."""


def request_for(
    message: Message,
    to: int,
    *,
    cluster_id: str,
    endpoint: tuple[str, str, int] | None,
    fetch_wait_ms: int,
    max_bytes: int,
) -> RequestFor:
    """The request that carries `message` (a core request) to voter `to`. `endpoint` is this
    node's controller listener (name, host, port), announced by a new or resigning leader."""
    endpoints = () if endpoint is None else (endpoint,)
    if isinstance(message, Vote):
        v = Versions.VOTE
        schema = request_module(ApiKey.VOTE, v)
        partition = build(
            schema.PartitionData,
            partition_index=0,
            replica_epoch=message.epoch - 1 if message.pre_vote else message.epoch,
            replica_id=message.sender,
            replica_directory_id=None,
            voter_directory_id=None,
            last_offset_epoch=message.last_epoch,
            last_offset=message.end_offset,
            pre_vote=message.pre_vote,
        )
        body = build(
            schema.VoteRequest,
            cluster_id=cluster_id,
            voter_id=to,
            topics=(build(schema.TopicData, topic_name=METADATA_TOPIC, partitions=(partition,)),),
        )
        return ApiKey.VOTE, v, body
    if isinstance(message, BeginQuorumEpoch):
        v = Versions.BEGIN_QUORUM_EPOCH
        schema = request_module(ApiKey.BEGIN_QUORUM_EPOCH, v)
        partition = build(
            schema.PartitionData,
            partition_index=0,
            voter_directory_id=None,
            leader_id=message.sender,
            leader_epoch=message.epoch,
        )
        body = build(
            schema.BeginQuorumEpochRequest,
            cluster_id=cluster_id,
            voter_id=to,
            topics=(build(schema.TopicData, topic_name=METADATA_TOPIC, partitions=(partition,)),),
            leader_endpoints=tuple(
                build(schema.LeaderEndpoint, name=n, host=h, port=p) for n, h, p in endpoints
            ),
        )
        return ApiKey.BEGIN_QUORUM_EPOCH, v, body
    if isinstance(message, EndQuorumEpoch):
        v = Versions.END_QUORUM_EPOCH
        schema = request_module(ApiKey.END_QUORUM_EPOCH, v)
        partition = build(
            schema.PartitionData,
            partition_index=0,
            leader_id=message.sender,
            leader_epoch=message.epoch,
            preferred_candidates=tuple(
                build(schema.ReplicaInfo, candidate_id=c, candidate_directory_id=None)
                for c in message.successors
            ),
        )
        body = build(
            schema.EndQuorumEpochRequest,
            cluster_id=cluster_id,
            topics=(build(schema.TopicData, topic_name=METADATA_TOPIC, partitions=(partition,)),),
            leader_endpoints=tuple(
                build(schema.LeaderEndpoint, name=n, host=h, port=p) for n, h, p in endpoints
            ),
        )
        return ApiKey.END_QUORUM_EPOCH, v, body
    if isinstance(message, Fetch):
        v = Versions.FETCH
        schema = request_module(ApiKey.FETCH, v)
        partition = build(
            schema.FetchPartition,
            partition=0,
            current_leader_epoch=message.epoch,
            fetch_offset=message.fetch_offset,
            last_fetched_epoch=message.last_fetched_epoch,
            log_start_offset=-1,
            partition_max_bytes=max_bytes,
            replica_directory_id=None,
        )
        body = build(
            schema.FetchRequest,
            cluster_id=cluster_id,
            replica_state=build(schema.ReplicaState, replica_id=message.sender, replica_epoch=-1),
            max_wait=datetime.timedelta(milliseconds=fetch_wait_ms),
            min_bytes=0,
            max_bytes=max_bytes,
            topics=(build(schema.FetchTopic, topic_id=METADATA_TOPIC_ID, partitions=(partition,)),),
            forgotten_topics_data=(),
        )
        return ApiKey.FETCH, v, body
    if isinstance(message, FetchSnapshot):
        v = Versions.FETCH_SNAPSHOT
        schema = request_module(ApiKey.FETCH_SNAPSHOT, v)
        partition = build(
            schema.PartitionSnapshot,
            partition=0,
            current_leader_epoch=message.epoch,
            snapshot_id=build(
                schema.SnapshotId, end_offset=message.id.end_offset, epoch=message.id.epoch
            ),
            position=message.position,
            replica_directory_id=None,
        )
        body = build(
            schema.FetchSnapshotRequest,
            cluster_id=cluster_id,
            replica_id=message.sender,
            max_bytes=max_bytes,
            topics=(build(schema.TopicSnapshot, name=METADATA_TOPIC, partitions=(partition,)),),
        )
        return ApiKey.FETCH_SNAPSHOT, v, body
    raise TypeError(f"{type(message).__name__} is not a request")


def _only_partition(body: Any, what: str) -> Any:
    """The one partition of `__cluster_metadata` a quorum request or response names."""
    topics = body.topics if hasattr(body, "topics") else body.responses
    if len(topics) != 1 or len(topics[0].partitions) != 1:
        raise MalformedInput("must name exactly one partition of the metadata log", where=what)
    topic = topics[0]
    name = getattr(topic, "topic_name", getattr(topic, "name", getattr(topic, "topic", None)))
    topic_id = getattr(topic, "topic_id", None)
    if name != METADATA_TOPIC and topic_id != METADATA_TOPIC_ID:
        raise MalformedInput(f"names {name or topic_id}, not {METADATA_TOPIC}", where=what)
    partition = topic.partitions[0]
    index = getattr(partition, "partition_index", getattr(partition, "partition", None))
    if index is None:
        index = getattr(partition, "index", 0)
    if index != 0:
        raise MalformedInput(f"names partition {index} of {METADATA_TOPIC}", where=what)
    return partition


def reply_from_response(  # noqa: PLR0911 - one answer per kind of request
    sent: Message, to: int, response: Any
) -> Message | None:
    """The core's reply for the `response` that `to` sent to request `sent`; None when it
    carries nothing for the core (an error it cannot act on, an EndQuorumEpoch answer, a
    BeginQuorumEpoch answer from a voter no further on)."""
    what = type(response).__name__
    if isinstance(sent, BeginQuorumEpoch):
        if response.error_code != ErrorCode.none:
            return None
        p = _only_partition(response, what)
        if p.leader_epoch <= sent.epoch:
            return None
        return BeginQuorumEpochReply(to, p.leader_epoch, p.leader_id if p.leader_id >= 0 else None)
    if isinstance(sent, Vote):
        if response.error_code != ErrorCode.none:
            return None
        p = _only_partition(response, what)
        if p.error_code not in (ErrorCode.none, *_REJECTED):
            return None
        granted = p.error_code == ErrorCode.none and bool(p.vote_granted)
        epoch = p.leader_epoch + 1 if sent.pre_vote and granted else p.leader_epoch
        leader = p.leader_id if p.leader_id >= 0 else None
        return VoteReply(to, epoch, granted, sent.pre_vote, leader)
    if isinstance(sent, Fetch):
        if response.error_code != ErrorCode.none:
            return None
        p = _only_partition(response, what)
        leader = p.current_leader.leader_id
        reply = FetchReply(
            sender=to,
            epoch=p.current_leader.leader_epoch,
            leader=leader if leader >= 0 else None,
            high_watermark=p.high_watermark,
            fetch_offset=sent.fetch_offset,
            last_fetched_epoch=sent.last_fetched_epoch,
        )
        if p.error_code in _REJECTED:
            return _replace(reply, rejected=True)
        if p.error_code != ErrorCode.none:
            return None
        if p.diverging_epoch.epoch >= 0:
            diverging = Diverging(p.diverging_epoch.epoch, p.diverging_epoch.end_offset)
            return _replace(reply, diverging=diverging)
        if p.snapshot_id.end_offset >= 0:
            snapshot = SnapshotId(p.snapshot_id.end_offset, p.snapshot_id.epoch)
            return _replace(reply, snapshot=snapshot)
        return _replace(reply, entries=_entries_at(sent.fetch_offset, p.records or b""))
    if isinstance(sent, FetchSnapshot):
        if response.error_code != ErrorCode.none:
            return None
        p = _only_partition(response, what)
        leader = p.current_leader.leader_id
        snapshot_reply = FetchSnapshotReply(
            sender=to,
            epoch=p.current_leader.leader_epoch,
            leader=leader if leader >= 0 else None,
            id=sent.id,
            size=p.size,
            position=p.position,
            chunk=bytes(p.unaligned_records),
            missing=p.error_code == ErrorCode.snapshot_not_found,
            rejected=p.error_code in _REJECTED,
        )
        if p.error_code not in (ErrorCode.none, ErrorCode.snapshot_not_found, *_REJECTED):
            return None
        return snapshot_reply
    return None


def error_of(response: Any) -> ErrorCode:
    """The error a quorum response carries: its top-level one, else its partition's."""
    if response.error_code != ErrorCode.none:
        return ErrorCode(response.error_code)
    topics: Any = getattr(response, "topics", None) or getattr(response, "responses", ())
    for topic in topics:
        for partition in topic.partitions:
            return ErrorCode(partition.error_code)
    return ErrorCode.none


def _replace(reply: FetchReply, **changes: Any) -> FetchReply:
    return dataclasses.replace(reply, **changes)


def _entries_at(first: int, records: bytes) -> tuple[Entry, ...]:
    entries: list[Entry] = []
    for offset, entry in decode_entries(records):
        if offset != first + len(entries):
            raise MalformedInput(
                f"entry at offset {offset} where {first + len(entries)} was due",
                where="metadata log fetch response",
            )
        entries.append(entry)
    return tuple(entries)


def message_from_request(api_key: int, body: Any) -> Message:
    """The core's message for a quorum request a peer sent; MalformedInput if it names no
    single partition of the metadata log."""
    what = type(body).__name__
    p = _only_partition(body, what)
    if api_key == ApiKey.VOTE:
        pre_vote = bool(getattr(p, "pre_vote", False))
        epoch = p.replica_epoch if hasattr(p, "replica_epoch") else p.candidate_epoch
        sender = p.replica_id if hasattr(p, "replica_id") else p.candidate_id
        return Vote(
            sender,
            epoch + 1 if pre_vote else epoch,
            p.last_offset_epoch,
            p.last_offset,
            pre_vote,
        )
    if api_key == ApiKey.BEGIN_QUORUM_EPOCH:
        return BeginQuorumEpoch(p.leader_id, p.leader_epoch)
    if api_key == ApiKey.END_QUORUM_EPOCH:
        if hasattr(p, "preferred_candidates"):
            successors = tuple(c.candidate_id for c in p.preferred_candidates)
        else:
            successors = tuple(p.preferred_successors)
        return EndQuorumEpoch(p.leader_id, p.leader_epoch, successors)
    if api_key == ApiKey.FETCH:
        state = getattr(body, "replica_state", None)
        sender = state.replica_id if state is not None else body.replica_id
        return Fetch(sender, p.current_leader_epoch, p.fetch_offset, p.last_fetched_epoch)
    if api_key == ApiKey.FETCH_SNAPSHOT:
        snapshot_id = SnapshotId(p.snapshot_id.end_offset, p.snapshot_id.epoch)
        return FetchSnapshot(body.replica_id, p.current_leader_epoch, snapshot_id, p.position)
    raise MalformedInput(f"API key {api_key} is not a quorum request", where=what)


def response_for(
    api_key: int,
    version: int,
    reply: Message | None,
    *,
    epoch: int,
    leader: int | None,
    error: ErrorCode = ErrorCode.none,
    now_ms: int = 0,
    voters: Sequence[int] = (),
) -> ResponseBody:
    """The response to a quorum request: from the core's `reply`, or (None) an answer that
    only says the node's `epoch` and `leader` (Begin/EndQuorumEpoch, or a request the core
    did not answer in time: `error` says why)."""
    schema = response_module(api_key, version)
    leader_id = -1 if leader is None else leader
    if api_key == ApiKey.VOTE:
        granted = isinstance(reply, VoteReply) and reply.granted
        if isinstance(reply, VoteReply):
            leader_id = -1 if reply.leader is None else reply.leader
            epoch = reply.epoch - 1 if reply.pre_vote and reply.granted else reply.epoch
        partition = build(
            schema.PartitionData,
            partition_index=0,
            error_code=error,
            leader_id=leader_id,
            leader_epoch=epoch,
            vote_granted=granted,
        )
        topics = (build(schema.TopicData, topic_name=METADATA_TOPIC, partitions=(partition,)),)
        response: ResponseBody = build(
            schema.VoteResponse, error_code=ErrorCode.none, topics=topics
        )
        return response
    if api_key in (ApiKey.BEGIN_QUORUM_EPOCH, ApiKey.END_QUORUM_EPOCH):
        partition = build(
            schema.PartitionData,
            partition_index=0,
            error_code=error,
            leader_id=leader_id,
            leader_epoch=epoch,
        )
        topics = (build(schema.TopicData, topic_name=METADATA_TOPIC, partitions=(partition,)),)
        name = (
            "BeginQuorumEpochResponse"
            if api_key == ApiKey.BEGIN_QUORUM_EPOCH
            else "EndQuorumEpochResponse"
        )
        response = build(getattr(schema, name), error_code=ErrorCode.none, topics=topics)
        return response
    if api_key == ApiKey.FETCH:
        return _fetch_response(schema, reply, epoch, leader_id, error, now_ms, voters)
    if api_key == ApiKey.FETCH_SNAPSHOT:
        return _fetch_snapshot_response(schema, reply, epoch, leader_id, error)
    raise ValueError(f"API key {api_key} is not a quorum request")


def _fetch_response(  # noqa: PLR0917 - the fields of one response
    schema: Any,
    reply: Message | None,
    epoch: int,
    leader_id: int,
    error: ErrorCode,
    now_ms: int,
    voters: Sequence[int],
) -> ResponseBody:
    high_watermark = -1
    diverging = build(schema.EpochEndOffset, epoch=-1, end_offset=-1)
    snapshot_id = build(schema.SnapshotId, end_offset=-1, epoch=-1)
    records = b""
    if isinstance(reply, FetchReply):
        epoch, high_watermark = reply.epoch, reply.high_watermark
        leader_id = -1 if reply.leader is None else reply.leader
        if reply.rejected:
            error = ErrorCode.fenced_leader_epoch
        if reply.diverging is not None:
            diverging = build(
                schema.EpochEndOffset,
                epoch=reply.diverging.epoch,
                end_offset=reply.diverging.end_offset,
            )
        if reply.snapshot is not None:
            snapshot_id = build(
                schema.SnapshotId, end_offset=reply.snapshot.end_offset, epoch=reply.snapshot.epoch
            )
        records = encode_entries(
            reply.fetch_offset, reply.entries, now_ms=now_ms, leader=reply.sender, voters=voters
        )
    partition = build(
        schema.PartitionData,
        partition_index=0,
        error_code=error,
        high_watermark=high_watermark,
        diverging_epoch=diverging,
        current_leader=build(schema.LeaderIdAndEpoch, leader_id=leader_id, leader_epoch=epoch),
        snapshot_id=snapshot_id,
        aborted_transactions=None,
        records=records,
    )
    topic = build(
        schema.FetchableTopicResponse, topic_id=METADATA_TOPIC_ID, partitions=(partition,)
    )
    response: ResponseBody = build(
        schema.FetchResponse,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(topic,),
    )
    return response


def _fetch_snapshot_response(
    schema: Any, reply: Message | None, epoch: int, leader_id: int, error: ErrorCode
) -> ResponseBody:
    size = position = 0
    chunk = b""
    snapshot_id = build(schema.SnapshotId, end_offset=-1, epoch=-1)
    if isinstance(reply, FetchSnapshotReply):
        epoch = reply.epoch
        leader_id = -1 if reply.leader is None else reply.leader
        if reply.rejected:
            error = ErrorCode.fenced_leader_epoch
        elif reply.missing:
            error = ErrorCode.snapshot_not_found
        size, position, chunk = reply.size, reply.position, reply.chunk
        snapshot_id = build(schema.SnapshotId, end_offset=reply.id.end_offset, epoch=reply.id.epoch)
    partition = build(
        schema.PartitionSnapshot,
        index=0,
        error_code=error,
        snapshot_id=snapshot_id,
        current_leader=build(schema.LeaderIdAndEpoch, leader_id=leader_id, leader_epoch=epoch),
        size=size,
        position=position,
        unaligned_records=chunk,
    )
    topic = build(schema.TopicSnapshot, name=METADATA_TOPIC, partitions=(partition,))
    response: ResponseBody = build(
        schema.FetchSnapshotResponse,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        topics=(topic,),
    )
    return response
