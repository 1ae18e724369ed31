"""AlterPartitionReassignments and ListPartitionReassignments (`kafka-reassign-partitions`,
Admin.alterPartitionReassignments / listPartitionReassignments, KIP-455): decided and answered
by the active controller (brokers forward them there)."""

from __future__ import annotations

from typing import Any

from broker.metadata.reassignments import Reassignment, ReassignmentResult
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState

__all__ = ["AlterPartitionReassignments", "ListPartitionReassignments"]


class AlterPartitionReassignments:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.ALTER_PARTITION_REASSIGNMENTS, context.header.api_version)
        wanted = [
            Reassignment(
                topic.name,
                partition.partition_index,
                None if partition.replicas is None else tuple(partition.replicas),
            )
            for topic in request.topics
            for partition in topic.partitions
        ]
        results = await self._state.metadata.alter_reassignments(
            # v1 (KIP-860) may forbid a change of replication factor; v0 always allows it.
            wanted,
            allow_replication_factor_change=getattr(
                request, "allow_replication_factor_change", True
            ),
        )
        by_topic: dict[str, list[ReassignmentResult]] = {}
        for result in results:
            by_topic.setdefault(result.topic, []).append(result)
        response: ResponseBody = build(
            schema.AlterPartitionReassignmentsResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            error_message=None,
            responses=tuple(
                build(
                    schema.ReassignableTopicResponse,
                    name=name,
                    partitions=tuple(
                        build(
                            schema.ReassignablePartitionResponse,
                            partition_index=result.partition,
                            error_code=result.error,
                            error_message=result.message,
                        )
                        for result in topic_results
                    ),
                )
                for name, topic_results in by_topic.items()
            ),
        )
        return response


class ListPartitionReassignments:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.LIST_PARTITION_REASSIGNMENTS, context.header.api_version)
        wanted = (
            None
            if request.topics is None
            else [(topic.name, list(topic.partition_indexes)) for topic in request.topics]
        )
        found = await self._state.metadata.list_reassignments(wanted)
        by_topic: dict[str, list[Any]] = {}
        for name, index, state in found:
            by_topic.setdefault(name, []).append(
                build(
                    schema.OngoingPartitionReassignment,
                    partition_index=index,
                    replicas=state.replicas,
                    adding_replicas=state.adding,
                    removing_replicas=state.removing,
                )
            )
        response: ResponseBody = build(
            schema.ListPartitionReassignmentsResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            error_message=None,
            topics=tuple(
                build(schema.OngoingTopicReassignment, name=name, partitions=tuple(partitions))
                for name, partitions in by_topic.items()
            ),
        )
        return response
