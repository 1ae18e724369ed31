"""Fetch: batches from partition logs, up to the high watermark, with long polling.

A fetch that finds fewer than `min_bytes` waits up to `max_wait_ms` for appends to the
partitions it asks for (a purgatory keyed by partition, woken by appends). Sizes follow KIP-74:
`max_bytes` bounds the response and `partition_max_bytes` each partition, but the first
partition with data always returns at least one whole batch so a large batch cannot stall a
consumer. Records are not read here: each partition's answer holds a pinned slice of its
segment, which the server sends with `sendfile` (`broker/protocol/fetch.py`). Fetch sessions
(KIP-227) are not kept: every response has session id 0, which tells clients to send full
fetch requests.
"""

from __future__ import annotations

import asyncio
from typing import Any

from broker.protocol import ErrorCode
from broker.protocol.fetch import FetchPartition, FetchResponse, FetchTopic
from broker.replica import FetchResult
from broker.server import RequestContext, parked

from .context import NodeState

__all__ = ["Handler"]


class Handler:
    def __init__(self, state: NodeState) -> None:
        self._replicas = state.replicas

    async def __call__(self, context: RequestContext, request: Any) -> FetchResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.max_wait.total_seconds()
        keys = [(t.topic, p.partition) for t in request.topics for p in t.partitions]
        while True:
            reads, total, errors = self._read(request)
            remaining = deadline - loop.time()
            if total >= request.min_bytes or errors or remaining <= 0 or not keys:
                break
            with parked():  # a client that goes away does not leave its wait behind
                await self._replicas.wait_for_append(keys, remaining)
        # No await from the read to here: every slice is pinned before the log can change.
        responses = [
            FetchTopic(topic.topic, tuple(_partition(wanted, got) for wanted, got in partitions))
            for topic, partitions in zip(request.topics, reads, strict=True)
        ]
        return FetchResponse(
            throttle_time_ms=0, error_code=ErrorCode.none, session_id=0, responses=tuple(responses)
        )

    def _read(self, request: Any) -> tuple[list[list[tuple[Any, FetchResult]]], int, bool]:
        budget = request.max_bytes
        total = 0
        errors = False
        reads = []
        for topic in request.topics:
            partitions = []
            for wanted in topic.partitions:
                result = self._replicas.read(
                    topic.topic,
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
                if result.error != ErrorCode.none:
                    errors = True
                partitions.append((wanted, result))
            reads.append(partitions)
        return reads, total, errors


def _partition(wanted: Any, result: FetchResult) -> FetchPartition:
    return FetchPartition(
        partition_index=wanted.partition,
        error_code=result.error,
        high_watermark=result.high_watermark,
        last_stable_offset=result.high_watermark,  # no transactions: nothing is left open
        log_start_offset=result.log_start_offset,
        records=b"" if result.records is None else result.records.pin(),
    )
