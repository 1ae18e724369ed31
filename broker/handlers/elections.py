"""ElectLeaders (`kafka-leader-election`, Admin.electLeaders): preferred or unclean elections,
decided by the active controller and answered once committed (brokers forward it there)."""

from __future__ import annotations

from typing import Any

from broker.metadata.elections import PREFERRED, UNCLEAN, ElectionResult
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState

__all__ = ["ElectLeaders"]


class ElectLeaders:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.ELECT_LEADERS, version)
        election_type = getattr(request, "election_type", PREFERRED)  # v0: preferred only
        if election_type not in (PREFERRED, UNCLEAN):
            # Kafka refuses the whole request (InvalidRequestException).
            return _answer(schema, version, ErrorCode.invalid_request, [])
        wanted = (
            None
            if request.topic_partitions is None
            else [(t.topic, list(t.partitions)) for t in request.topic_partitions]
        )
        results = await self._state.metadata.elect_leaders(election_type, wanted)
        return _answer(schema, version, ErrorCode.none, results)


def _answer(
    schema: Any, version: int, error: ErrorCode, results: list[ElectionResult]
) -> ResponseBody:
    by_topic: dict[str, list[Any]] = {}
    for result in results:
        by_topic.setdefault(result.topic, []).append(
            build(
                schema.PartitionResult,
                partition_id=result.partition,
                error_code=result.error,
                error_message=result.message,
            )
        )
    fields: dict[str, Any] = {
        "throttle_time": NO_THROTTLE,
        "replica_election_results": tuple(
            build(schema.ReplicaElectionResult, topic=topic, partition_result=tuple(partitions))
            for topic, partitions in by_topic.items()
        ),
    }
    if version >= 1:
        fields["error_code"] = error
    response: ResponseBody = build(schema.ElectLeadersResponse, **fields)
    return response
