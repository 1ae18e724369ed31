"""ListOffsets: earliest (-2), latest (-1), max timestamp (-3), or the first offset at or after a
timestamp, per partition; read_committed sees the same as read_uncommitted (no transactions)."""

from __future__ import annotations

from typing import Any

from broker.protocol import ApiKey, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState

__all__ = ["Handler"]


class Handler:
    def __init__(self, state: NodeState) -> None:
        self._replicas = state.replicas

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.LIST_OFFSETS, version)
        topics = []
        for topic in request.topics:
            partitions = []
            for wanted in topic.partitions:
                result = self._replicas.list_offset(
                    topic.name,
                    wanted.partition_index,
                    wanted.timestamp,
                    getattr(wanted, "current_leader_epoch", -1),
                )
                partitions.append(
                    build(
                        schema.ListOffsetsPartitionResponse,
                        partition_index=wanted.partition_index,
                        error_code=result.error,
                        timestamp=result.timestamp,
                        offset=result.offset,
                        leader_epoch=result.leader_epoch,
                    )
                )
            topics.append(
                build(
                    schema.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(partitions)
                )
            )
        response: ResponseBody = build(
            schema.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics)
        )
        return response
