"""ListOffsets: earliest (-2), latest (-1), max timestamp (-3), earliest local (-4), latest tiered
(-5), earliest pending upload (-6), or the first offset at or after a timestamp, per partition;
read_committed sees the same as read_uncommitted (no transactions).

Each special timestamp exists from the version that introduced it, and an older request naming
it is answered UNSUPPORTED_VERSION for that partition, as Kafka's ReplicaManager does. Without
tiered storage -4 is the log start offset and -5/-6 are -1 (`broker.replica`). v10's TimeoutMs
bounds Kafka's wait for remote storage; there is none to wait for here.

A new leader whose high watermark has not caught up answers OFFSET_NOT_AVAILABLE where the
answer depends on it (`ReplicaManager.list_offset`); before v5, which does not know that error,
LEADER_NOT_AVAILABLE, as Kafka's ReplicaManager.fetchOffset says it. Both are retriable.
"""

from __future__ import annotations

from typing import Any

from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.replica import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_PENDING_UPLOAD_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    OffsetResult,
)
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState

__all__ = ["Handler"]

FIRST_VERSION_OF: dict[int, int] = {
    EARLIEST_TIMESTAMP: 1,
    LATEST_TIMESTAMP: 1,
    MAX_TIMESTAMP: 7,  # KIP-734
    EARLIEST_LOCAL_TIMESTAMP: 8,  # KIP-405
    LATEST_TIERED_TIMESTAMP: 9,  # KIP-1005
    EARLIEST_PENDING_UPLOAD_TIMESTAMP: 11,  # KIP-1023
}
"""Special (negative) timestamps → the first ListOffsets version that may name them."""
FIRST_OFFSET_NOT_AVAILABLE_VERSION = 5


def _supported(timestamp: int, version: int) -> bool:
    return timestamp >= 0 or version >= FIRST_VERSION_OF.get(timestamp, version + 1)


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
                if _supported(wanted.timestamp, version):
                    result = self._replicas.list_offset(
                        topic.name,
                        wanted.partition_index,
                        wanted.timestamp,
                        getattr(wanted, "current_leader_epoch", -1),
                    )
                else:
                    result = OffsetResult(ErrorCode.unsupported_version)
                if (
                    result.error == ErrorCode.offset_not_available
                    and version < FIRST_OFFSET_NOT_AVAILABLE_VERSION
                ):
                    result = OffsetResult(ErrorCode.leader_not_available)
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
