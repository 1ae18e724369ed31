"""OffsetCommit, OffsetFetch and OffsetDelete on the wire."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from broker.groups import (
    CommitOffset,
    FetchedOffset,
    GroupService,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchResult,
)
from broker.handlers.context import NO_THROTTLE
from broker.protocol import ApiKey, ErrorCode, RequestBody, ResponseBody, build, response_module
from broker.server import Handler, RequestContext
from broker.server.dispatcher import ErrorResponder

from .common import E, GroupApi, GroupNodeInfo, ms, version_of


class _PartitionsApi(GroupApi):
    """An offset API whose partitions of unknown topics are answered here, as Kafka's request
    layer does, and never reach the coordinator."""

    def __init__(self, service: GroupService, node: GroupNodeInfo) -> None:
        super().__init__(service)
        self._node = node

    def _known_partitions(
        self, topics: Any, errors: dict[tuple[str, int], ErrorCode]
    ) -> Iterator[tuple[str, Any]]:
        """(topic name, partition) of each requested partition that exists; the others get
        UNKNOWN_TOPIC_OR_PARTITION in `errors`."""
        for topic in topics:
            for p in topic.partitions:
                if self._node.partition_exists(topic.name, p.partition_index):
                    yield topic.name, p
                else:
                    errors[(topic.name, p.partition_index)] = E.unknown_topic_or_partition


class OffsetCommit(_PartitionsApi):
    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        errors: dict[tuple[str, int], ErrorCode] = {}
        offsets = [
            CommitOffset(
                topic=topic,
                partition=p.partition_index,
                offset=p.committed_offset,
                leader_epoch=getattr(p, "committed_leader_epoch", -1),
                metadata=p.committed_metadata,
            )
            for topic, p in self._known_partitions(request.topics, errors)
        ]
        if offsets:
            retention = getattr(request, "retention_time", None)
            result = await self._service.commit_offsets(
                OffsetCommitRequest(
                    group_id=request.group_id,
                    member_id=request.member_id,
                    group_instance_id=getattr(request, "group_instance_id", None),
                    generation_id=request.generation_id_or_member_epoch,
                    retention_time_ms=-1 if retention is None else ms(retention),
                    offsets=tuple(offsets),
                )
            )
            for tp, error in result.errors:
                errors.setdefault(tp, error)
        return _commit_response(request, lambda tp: errors[tp])


def _commit_response(
    request: Any, error_of: Callable[[tuple[str, int]], ErrorCode]
) -> ResponseBody:
    schema = response_module(ApiKey.OFFSET_COMMIT, version_of(request))
    topics = tuple(
        build(
            schema.OffsetCommitResponseTopic,
            name=topic.name,
            partitions=tuple(
                build(
                    schema.OffsetCommitResponsePartition,
                    partition_index=p.partition_index,
                    error_code=error_of((topic.name, p.partition_index)),
                )
                for p in topic.partitions
            ),
        )
        for topic in request.topics
    )
    response: ResponseBody = build(
        schema.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=topics
    )
    return response


def _commit_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    return _commit_response(request, lambda tp: error)


class OffsetFetch(GroupApi):
    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = version_of(request)
        if version >= 8:
            results = [
                (g.group_id, await self._fetch(g.group_id, g.topics)) for g in request.groups
            ]
        else:
            results = [(request.group_id, await self._fetch(request.group_id, request.topics))]
        return _fetch_response(version, request, results)

    async def _fetch(self, group_id: str, topics: Any) -> OffsetFetchResult:
        partitions = None
        if topics is not None:
            partitions = [(t.name, i) for t in topics for i in t.partition_indexes]
        return await self._service.fetch_offsets(group_id, partitions)


def _fetch_topics(schema: Any, version: int, result: OffsetFetchResult) -> tuple[Any, ...]:
    v8 = version >= 8
    topic_type = schema.OffsetFetchResponseTopics if v8 else schema.OffsetFetchResponseTopic
    partition_type = (
        schema.OffsetFetchResponsePartitions if v8 else schema.OffsetFetchResponsePartition
    )
    by_topic: dict[str, list[Any]] = {}
    for fetched in result.offsets:
        by_topic.setdefault(fetched.topic, []).append(
            build(
                partition_type,
                partition_index=fetched.partition,
                committed_offset=fetched.offset,
                committed_leader_epoch=fetched.leader_epoch,
                metadata=fetched.metadata,
                error_code=fetched.error,
            )
        )
    return tuple(
        build(topic_type, name=name, partitions=tuple(partitions))
        for name, partitions in by_topic.items()
    )


def _fetch_response(
    version: int, request: Any, results: list[tuple[str, OffsetFetchResult]]
) -> ResponseBody:
    schema = response_module(ApiKey.OFFSET_FETCH, version)
    if version >= 8:
        groups = tuple(
            build(
                schema.OffsetFetchResponseGroup,
                group_id=group_id,
                topics=_fetch_topics(schema, version, result),
                error_code=result.error,
            )
            for group_id, result in results
        )
        response: ResponseBody = build(
            schema.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=groups
        )
        return response
    ((_, result),) = results
    if version < 2 and result.error != E.none:
        # v1 has no group-level error: every requested partition carries it.
        result = OffsetFetchResult(
            E.none,
            tuple(
                FetchedOffset(t.name, i, error=result.error)
                for t in request.topics
                for i in t.partition_indexes
            ),
        )
    response = build(
        schema.OffsetFetchResponse,
        throttle_time=NO_THROTTLE,
        topics=_fetch_topics(schema, version, result),
        error_code=result.error,
    )
    return response


def _fetch_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    body: Any = request
    version = version_of(body)
    if version >= 8:
        results = [(g.group_id, OffsetFetchResult(error)) for g in body.groups]
    else:
        results = [(body.group_id, OffsetFetchResult(error))]
    return _fetch_response(version, body, results)


class OffsetDelete(_PartitionsApi):
    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        errors: dict[tuple[str, int], ErrorCode] = {}
        wanted = [
            (topic, p.partition_index)
            for topic, p in self._known_partitions(request.topics, errors)
        ]
        result = await self._service.delete_offsets(
            OffsetDeleteRequest(group_id=request.group_id, partitions=tuple(wanted))
        )
        for tp, error in result.errors:
            errors.setdefault(tp, error)
        return _offset_delete_response(request, result.error, errors)


def _offset_delete_response(
    request: Any, error: ErrorCode, errors: dict[tuple[str, int], ErrorCode]
) -> ResponseBody:
    schema = response_module(ApiKey.OFFSET_DELETE, version_of(request))
    topics = []
    for topic in request.topics:
        partitions = tuple(
            build(
                schema.OffsetDeleteResponsePartition,
                partition_index=p.partition_index,
                error_code=errors[(topic.name, p.partition_index)],
            )
            for p in topic.partitions
            if (topic.name, p.partition_index) in errors
        )
        if partitions:
            topics.append(
                build(schema.OffsetDeleteResponseTopic, name=topic.name, partitions=partitions)
            )
    response: ResponseBody = build(
        schema.OffsetDeleteResponse,
        error_code=error,
        throttle_time=NO_THROTTLE,
        topics=tuple(topics),
    )
    return response


def _offset_delete_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    return _offset_delete_response(request, error, {})


def register(
    handlers: dict[int, Handler], service: GroupService, node: GroupNodeInfo
) -> dict[int, ErrorResponder]:
    """Add this module's APIs to `handlers`; returns their error responders."""
    handlers[ApiKey.OFFSET_COMMIT] = OffsetCommit(service, node)
    handlers[ApiKey.OFFSET_FETCH] = OffsetFetch(service)
    handlers[ApiKey.OFFSET_DELETE] = OffsetDelete(service, node)
    return {
        ApiKey.OFFSET_COMMIT: _commit_error,
        ApiKey.OFFSET_FETCH: _fetch_error,
        ApiKey.OFFSET_DELETE: _offset_delete_error,
    }
