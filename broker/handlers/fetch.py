"""Fetch: batches from partition logs, up to the high watermark, with long polling.

A fetch that finds fewer than `min_bytes` waits up to `max_wait_ms` for appends to the
partitions it asks for (a purgatory keyed by partition, woken by appends). Sizes follow KIP-74:
`max_bytes` bounds the response and `partition_max_bytes` each partition, but the first
partition with data always returns at least one whole batch so a large batch cannot stall a
consumer. Fetch sessions (KIP-227) are not kept: every response has session id 0, which tells
clients to send full fetch requests.
"""

from __future__ import annotations

import asyncio
from typing import Any

from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState

__all__ = ["Handler"]


class Handler:
    def __init__(self, state: NodeState) -> None:
        self._replicas = state.replicas

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.FETCH, version)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.max_wait.total_seconds()
        keys = [(t.topic, p.partition) for t in request.topics for p in t.partitions]
        while True:
            topics, total, errors = self._read(schema, request)
            remaining = deadline - loop.time()
            if total >= request.min_bytes or errors or remaining <= 0 or not keys:
                break
            await self._replicas.wait_for_append(keys, remaining)
        response: ResponseBody = build(
            schema.FetchResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            session_id=0,
            responses=tuple(topics),
        )
        return response

    def _read(self, schema: Any, request: Any) -> tuple[list[Any], int, bool]:
        budget = request.max_bytes
        total = 0
        errors = False
        topics = []
        for topic in request.topics:
            partitions = []
            for wanted in topic.partitions:
                limit = min(wanted.partition_max_bytes, budget)
                result = self._replicas.read(
                    topic.topic,
                    wanted.partition,
                    wanted.fetch_offset,
                    max(limit, 0),
                    min_one_batch=total == 0,
                    current_leader_epoch=wanted.current_leader_epoch,
                )
                records = b""
                if result.records is not None:
                    records = result.records.read()
                    total += len(records)
                    budget -= len(records)
                if result.error != ErrorCode.none:
                    errors = True
                partitions.append(
                    build(
                        schema.PartitionData,
                        partition_index=wanted.partition,
                        error_code=result.error,
                        high_watermark=result.high_watermark,
                        last_stable_offset=result.high_watermark,
                        log_start_offset=result.log_start_offset,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=records,
                    )
                )
            topics.append(
                build(
                    schema.FetchableTopicResponse, topic=topic.topic, partitions=tuple(partitions)
                )
            )
        return topics, total, errors
