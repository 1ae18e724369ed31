"""Fetch: batches from partition logs, up to the high watermark, with long polling.

A fetch that finds fewer than `min_bytes` waits up to `max_wait_ms` for appends to the
partitions it asks for (a purgatory keyed by partition, woken by appends). Sizes follow KIP-74:
`max_bytes` bounds the response and `partition_max_bytes` each partition, but the first
partition with data always returns at least one whole batch so a large batch cannot stall a
consumer. Records are not read here: each partition's answer holds a pinned slice of its
segment, which the server sends with `sendfile` (`broker/protocol/fetch.py`). Fetch sessions
(KIP-227) are not kept: every response has session id 0, which tells clients to send full
fetch requests.

From v13 topics come by id (KIP-516), resolved through the metadata image; from v16 a partition
whose leader moved names the new leader and its endpoint (KIP-951).

A fetch with a replica id (ReplicaId before v15, ReplicaState from v15) is a follower's: it
reads up to the log end rather than the high watermark, only from a broker that is one of the
partition's replicas, and its fetch offset tells the leader how far the follower has come
(which moves the high watermark). Its LastFetchedEpoch is checked against the leader's epochs,
and a follower whose log parted is told where (DivergingEpoch). Only a registered broker of
this cluster may fetch as a replica, and only with its current broker epoch (ReplicaEpoch,
KIP-903): any other replica fetch, one below v15 (which has no epoch) included, is answered
NOT_LEADER_OR_FOLLOWER for every partition (`ReplicaManager.replica_fetch_error`). The
listener it comes on is not checked: Kafka authorizes replica fetches with ClusterAction, not
by listener, and without an authorizer allows them on any.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from broker.protocol import ErrorCode
from broker.protocol.fetch import FetchPartition, FetchResponse, FetchTopic, NodeEndpoint
from broker.replica import FetchResult
from broker.server import RequestContext, parked

from .context import NodeState

__all__ = ["Handler"]

FIRST_TOPIC_ID_VERSION = 13
FIRST_CURRENT_LEADER_VERSION = 16
FIRST_REPLICA_STATE_VERSION = 15
_LEADER_MOVED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)
_UNKNOWN_TOPIC_ID = FetchResult(ErrorCode.unknown_topic_id)


class Handler:
    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._replicas = state.replicas

    async def __call__(self, context: RequestContext, request: Any) -> FetchResponse:
        version = context.header.api_version
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.max_wait.total_seconds()
        # From v13 topics are named by id (KIP-516); an id the image does not know is answered
        # UNKNOWN_TOPIC_ID for each of its partitions, as Kafka does.
        names = [self._name(topic, version) for topic in request.topics]
        keys = [
            (name, p.partition)
            for name, t in zip(names, request.topics, strict=True)
            if name is not None
            for p in t.partitions
        ]
        replica_id, replica_epoch = _replica(request, version)
        if replica_id >= 0:
            # A broker's fetch only with that broker's current epoch (`replica_fetch_error`).
            refused = self._replicas.replica_fetch_error(replica_id, replica_epoch)
            if refused is not None:
                return _refused(request, names, refused)
        while True:
            reads, total, errors = self._read(request, names, replica_id)
            remaining = deadline - loop.time()
            if total >= request.min_bytes or errors or remaining <= 0 or not keys:
                break
            with parked():  # a client that goes away does not leave its wait behind
                await self._replicas.wait_for_append(keys, remaining)
        # No await from the read to here: every slice is pinned before the log can change.
        endpoints: dict[int, NodeEndpoint] = {}
        responses = []
        for topic, name, partitions in zip(request.topics, names, reads, strict=True):
            answers = []
            for wanted, got in partitions:
                answer = _partition(wanted, got)
                if version >= FIRST_CURRENT_LEADER_VERSION and got.error in _LEADER_MOVED:
                    assert name is not None  # an unknown topic id is not a moved leader
                    self._point_at_leader(answer, name, context.listener, endpoints)
                answers.append(answer)
            responses.append(
                FetchTopic(
                    name or "", tuple(answers), getattr(topic, "topic_id", None) or uuid.UUID(int=0)
                )
            )
        return FetchResponse(
            throttle_time_ms=0,
            error_code=ErrorCode.none,
            session_id=0,
            responses=tuple(responses),
            node_endpoints=tuple(endpoints.values()),
        )

    def _name(self, topic: Any, version: int) -> str | None:
        if version < FIRST_TOPIC_ID_VERSION:
            return str(topic.topic)
        return self._state.topic_name(topic.topic_id) if topic.topic_id is not None else None

    def _point_at_leader(
        self, answer: FetchPartition, topic: str, listener: str, endpoints: dict[int, NodeEndpoint]
    ) -> None:
        """KIP-951, as Kafka's fetch path: the partition's current leader and epoch, and the
        leader's endpoint on this listener among the response's node endpoints."""
        leader = self._state.current_leader(topic, answer.partition_index, listener)
        answer.current_leader_id = leader.leader_id
        answer.current_leader_epoch = leader.leader_epoch
        if leader.node is not None:
            endpoints[leader.node[0]] = NodeEndpoint(*leader.node)

    def _read(
        self, request: Any, names: list[str | None], replica_id: int
    ) -> tuple[list[list[tuple[Any, FetchResult]]], int, bool]:
        budget = request.max_bytes
        total = 0
        errors = False
        reads = []
        for topic, name in zip(request.topics, names, strict=True):
            partitions = []
            for wanted in topic.partitions:
                if name is None:
                    result = _UNKNOWN_TOPIC_ID
                elif replica_id >= 0:
                    result = self._replicas.read_for_follower(
                        name,
                        wanted.partition,
                        replica_id,
                        wanted.fetch_offset,
                        max(min(wanted.partition_max_bytes, budget), 0),
                        min_one_batch=total == 0,
                        current_leader_epoch=getattr(wanted, "current_leader_epoch", -1),
                        last_fetched_epoch=getattr(wanted, "last_fetched_epoch", -1),
                        log_start_offset=getattr(wanted, "log_start_offset", -1),
                    )
                else:
                    result = self._replicas.read(
                        name,
                        wanted.partition,
                        wanted.fetch_offset,
                        max(min(wanted.partition_max_bytes, budget), 0),
                        min_one_batch=total == 0,
                        # Only from v9 (KIP-320): older fetches skip the leader epoch check.
                        current_leader_epoch=getattr(wanted, "current_leader_epoch", -1),
                    )
                if result.records is not None:
                    total += result.records.size
                    budget -= result.records.size
                if result.error != ErrorCode.none or result.diverging_epoch is not None:
                    errors = True  # answered at once, as Kafka does
                partitions.append((wanted, result))
            reads.append(partitions)
        return reads, total, errors


def _replica(request: Any, version: int) -> tuple[int, int]:
    """Who fetches, as (replica id, replica epoch): a broker's id for a follower, -1 (or less)
    for a consumer; the epoch is -1 (unknown) before v15, which has no ReplicaState."""
    if version >= FIRST_REPLICA_STATE_VERSION:
        state = getattr(request, "replica_state", None)
        if state is None:
            return -1, -1
        return int(state.replica_id), int(state.replica_epoch)
    return int(getattr(request, "replica_id", -1)), -1


def _refused(request: Any, names: list[str | None], error: ErrorCode) -> FetchResponse:
    """Every partition answered `error` (a replica fetch that is not the broker's), but a topic
    id this node does not know, answered UNKNOWN_TOPIC_ID as Kafka does before its checks."""
    refused = FetchResult(error)
    return FetchResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(
            FetchTopic(
                name or "",
                tuple(
                    _partition(wanted, refused if name is not None else _UNKNOWN_TOPIC_ID)
                    for wanted in topic.partitions
                ),
                getattr(topic, "topic_id", None) or uuid.UUID(int=0),
            )
            for topic, name in zip(request.topics, names, strict=True)
        ),
    )


def _partition(wanted: Any, result: FetchResult) -> FetchPartition:
    return FetchPartition(
        partition_index=wanted.partition,
        error_code=result.error,
        high_watermark=result.high_watermark,
        last_stable_offset=result.high_watermark,  # no transactions: nothing is left open
        log_start_offset=result.log_start_offset,
        records=b"" if result.records is None else result.records.pin(),
        diverging_epoch=result.diverging_epoch,
    )
