"""OffsetCommit, OffsetFetch and OffsetDelete on the wire."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


FIRST_TOPIC_ID_VERSION = 10
"""OffsetCommit and OffsetFetch v10 name topics by id (KIP-848's consumers, KIP-516's ids)."""


class OffsetCommit(_PartitionsApi):
    """v9 is v8 for a classic group (GenerationIdOrMemberEpoch is its generation) but for a
    group that does not exist (GROUP_ID_NOT_FOUND, `OffsetCommitRequest.api_version`); v10
    names topics by id, an unknown one answered UNKNOWN_TOPIC_ID."""

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = version_of(request)
        names = _topic_names(self._node, version, request.topics)
        errors: dict[tuple[str, int], ErrorCode] = {}
        offsets = []
        for topic, name in zip(request.topics, names, strict=True):
            for p in topic.partitions:
                if name is None:
                    continue  # answered UNKNOWN_TOPIC_ID
                if not self._node.partition_exists(name, p.partition_index):
                    errors[(name, p.partition_index)] = E.unknown_topic_or_partition
                    continue
                offsets.append(
                    CommitOffset(
                        topic=name,
                        partition=p.partition_index,
                        offset=p.committed_offset,
                        leader_epoch=getattr(p, "committed_leader_epoch", -1),
                        metadata=p.committed_metadata,
                    )
                )
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
                    api_version=version,
                )
            )
            for tp, error in result.errors:
                errors.setdefault(tp, error)

        def error_of(name: str | None, partition: int) -> ErrorCode:
            return E.unknown_topic_id if name is None else errors[(name, partition)]

        return _commit_response(request, names, error_of)


def _topic_names(node: GroupNodeInfo, version: int, topics: Any) -> list[str | None]:
    """Each requested topic's name: given up to v9, resolved from its id from v10 (None when
    the metadata image does not know the id)."""
    if version < FIRST_TOPIC_ID_VERSION:
        return [topic.name for topic in topics]
    return [node.topic_name(topic.topic_id) if topic.topic_id else None for topic in topics]


def _commit_response(
    request: Any,
    names: list[str | None],
    error_of: Callable[[str | None, int], ErrorCode],
) -> ResponseBody:
    schema = response_module(ApiKey.OFFSET_COMMIT, version_of(request))
    topics = tuple(
        build(
            schema.OffsetCommitResponseTopic,
            name=getattr(topic, "name", None),
            topic_id=getattr(topic, "topic_id", None),
            partitions=tuple(
                build(
                    schema.OffsetCommitResponsePartition,
                    partition_index=p.partition_index,
                    error_code=error_of(name, p.partition_index),
                )
                for p in topic.partitions
            ),
        )
        for topic, name in zip(request.topics, names, strict=True)
    )
    response: ResponseBody = build(
        schema.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=topics
    )
    return response


def _commit_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    body: Any = request
    return _commit_response(body, [""] * len(body.topics), lambda name, partition: error)


class OffsetFetch(GroupApi):
    """v9's MemberId and MemberEpoch are checked only for KIP-848 consumer groups, which Gregor
    does not have: on a classic group Kafka ignores them, and so does this. v10 names topics by
    id: an unknown one is answered UNKNOWN_TOPIC_ID per partition, and when all of a group's
    offsets are asked for, those of topics no longer in the image (no id) are left out."""

    def __init__(self, service: GroupService, node: GroupNodeInfo) -> None:
        super().__init__(service)
        self._node = node

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = version_of(request)
        if version >= 8:
            results = [await self._fetch(version, g.group_id, g.topics) for g in request.groups]
        else:
            results = [await self._fetch(version, request.group_id, request.topics)]
        return _fetch_response(version, request, results, self._node.topic_id)

    async def _fetch(self, version: int, group_id: str, topics: Any) -> _GroupOffsets:
        if topics is None:
            return _GroupOffsets(group_id, await self._service.fetch_offsets(group_id, None))
        names = _topic_names(self._node, version, topics)
        partitions = [
            (name, i)
            for t, name in zip(topics, names, strict=True)
            if name is not None
            for i in t.partition_indexes
        ]
        unknown = tuple(
            (t.topic_id, tuple(t.partition_indexes))
            for t, name in zip(topics, names, strict=True)
            if name is None
        )
        result = await self._service.fetch_offsets(group_id, partitions)
        return _GroupOffsets(group_id, result, unknown)


@dataclass(frozen=True, slots=True)
class _GroupOffsets:
    group_id: str
    result: OffsetFetchResult
    unknown_ids: tuple[tuple[uuid.UUID, tuple[int, ...]], ...] = ()
    """v10: requested topic ids the image does not know, with their partitions."""


def _fetch_topics(
    schema: Any,
    version: int,
    offsets: _GroupOffsets,
    topic_id: Callable[[str], uuid.UUID | None],
) -> tuple[Any, ...]:
    v8 = version >= 8
    topic_type = schema.OffsetFetchResponseTopics if v8 else schema.OffsetFetchResponseTopic
    partition_type = (
        schema.OffsetFetchResponsePartitions if v8 else schema.OffsetFetchResponsePartition
    )
    by_topic: dict[str, list[Any]] = {}
    for fetched in offsets.result.offsets:
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
    if version < FIRST_TOPIC_ID_VERSION:
        return tuple(
            build(topic_type, name=name, partitions=tuple(partitions))
            for name, partitions in by_topic.items()
        )
    topics = []
    for name, partitions in by_topic.items():
        found = topic_id(name)
        if found is not None:
            topics.append(build(topic_type, topic_id=found, partitions=tuple(partitions)))
    for unknown, indexes in offsets.unknown_ids:
        partitions = [
            build(
                partition_type,
                partition_index=i,
                committed_offset=-1,
                committed_leader_epoch=-1,
                metadata="",
                error_code=E.unknown_topic_id,
            )
            for i in indexes
        ]
        topics.append(build(topic_type, topic_id=unknown, partitions=tuple(partitions)))
    return tuple(topics)


def _fetch_response(
    version: int,
    request: Any,
    results: list[_GroupOffsets],
    topic_id: Callable[[str], uuid.UUID | None] = lambda name: None,
) -> ResponseBody:
    schema = response_module(ApiKey.OFFSET_FETCH, version)
    if version >= 8:
        groups = tuple(
            build(
                schema.OffsetFetchResponseGroup,
                group_id=offsets.group_id,
                topics=_fetch_topics(schema, version, offsets, topic_id),
                error_code=offsets.result.error,
            )
            for offsets in results
        )
        response: ResponseBody = build(
            schema.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=groups
        )
        return response
    (offsets,) = results
    result = offsets.result
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
        topics=_fetch_topics(schema, version, _GroupOffsets(offsets.group_id, result), topic_id),
        error_code=result.error,
    )
    return response


def _fetch_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    body: Any = request
    version = version_of(body)
    if version >= 8:
        results = [_GroupOffsets(g.group_id, OffsetFetchResult(error)) for g in body.groups]
    else:
        results = [_GroupOffsets(body.group_id, OffsetFetchResult(error))]
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
    handlers[ApiKey.OFFSET_FETCH] = OffsetFetch(service, node)
    handlers[ApiKey.OFFSET_DELETE] = OffsetDelete(service, node)
    return {
        ApiKey.OFFSET_COMMIT: _commit_error,
        ApiKey.OFFSET_FETCH: _fetch_error,
        ApiKey.OFFSET_DELETE: _offset_delete_error,
    }
