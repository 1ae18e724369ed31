"""The consumer-group APIs on the wire: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, OffsetDelete, DescribeGroups, ListGroups, DeleteGroups.

Each handler translates one API, at every version in the version table, to the group
service's vocabulary and back; the rules of groups live in `broker.groups`. What stays here
is what Kafka's request layer does before the coordinator: partitions of unknown topics are
answered UNKNOWN_TOPIC_OR_PARTITION, JoinGroup v0 rebalances within its session timeout,
LeaveGroup v0–v2 carries one member, OffsetFetch v8 asks for several groups, and version
differences in the answers (nullable protocol names from JoinGroup v7, one error for
LeaveGroup v0–v2, per-partition errors for OffsetFetch v1).

A node serves every group's coordinator itself (FindCoordinator names this node) and
creates `__consumer_offsets` on the first FindCoordinator for a group, as Kafka does.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from broker.groups import (
    CommitOffset,
    FetchedOffset,
    GroupService,
    HeartbeatRequest,
    JoinRequest,
    JoinResult,
    LeaveRequest,
    LeaveResult,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchResult,
    SyncRequest,
    SyncResult,
)
from broker.protocol import ApiKey, ErrorCode, RequestBody, ResponseBody, build, response_module
from broker.server import Handler, RequestContext
from broker.server.dispatcher import ErrorResponder

from .context import NO_THROTTLE

__all__ = ["GroupNodeInfo", "register"]

E = ErrorCode
_GROUP_KEY, _TRANSACTION_KEY = 0, 1
_GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)
"""READ, DELETE and DESCRIBE: the ACL operations on a group, all allowed without an
authorizer (DescribeGroups v3+ `include_authorized_operations`)."""
_NO_OPERATIONS = -(2**31)


class GroupNodeInfo(Protocol):
    """What the group handlers need from the node."""

    @property
    def node_id(self) -> int: ...

    def coordinator_endpoint(self, listener: str) -> tuple[str, int] | None:
        """This node's advertised host and port on `listener`, None if it has none there."""

    async def ensure_offsets_topic(self) -> bool:
        """Create `__consumer_offsets` if it does not exist; False if it cannot be."""

    def partition_exists(self, topic: str, partition: int) -> bool: ...


def _ms(value: timedelta) -> int:
    return value // timedelta(milliseconds=1)


def _version(body: Any) -> int:
    return int(body.__version__)


def _client_host(context: RequestContext) -> str:
    """Kafka's `InetAddress.toString()` of the client: "/127.0.0.1"."""
    return "/" + context.client_address.rsplit(":", 1)[0]


# -- FindCoordinator -------------------------------------------------------------------------


class FindCoordinator:
    def __init__(self, node: GroupNodeInfo) -> None:
        self._node = node

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = _version(request)
        keys = tuple(request.coordinator_keys) if version >= 4 else (request.key,)
        key_type = int(getattr(request, "key_type", _GROUP_KEY))
        found: tuple[ErrorCode, str | None, int, str, int]
        if key_type == _TRANSACTION_KEY:
            found = (E.coordinator_not_available, "transactions are not supported", -1, "", -1)
        elif key_type != _GROUP_KEY:
            found = (E.invalid_request, f"unknown key type {key_type}", -1, "", -1)
        elif not await self._node.ensure_offsets_topic():
            found = (E.coordinator_not_available, "__consumer_offsets is not available", -1, "", -1)
        else:
            endpoint = self._node.coordinator_endpoint(context.listener)
            if endpoint is None:
                found = (E.coordinator_not_available, "no endpoint on this listener", -1, "", -1)
            else:
                found = (E.none, None, self._node.node_id, *endpoint)
        return _find_coordinator_response(version, keys, found)


def _find_coordinator_response(
    version: int, keys: tuple[str, ...], found: tuple[ErrorCode, str | None, int, str, int]
) -> ResponseBody:
    schema = response_module(ApiKey.FIND_COORDINATOR, version)
    error, message, node_id, host, port = found
    if version >= 4:
        coordinators = tuple(
            build(
                schema.Coordinator,
                key=key,
                node_id=node_id,
                host=host,
                port=port,
                error_code=error,
                error_message=message,
            )
            for key in keys
        )
        response: ResponseBody = build(
            schema.FindCoordinatorResponse, throttle_time=NO_THROTTLE, coordinators=coordinators
        )
        return response
    response = build(
        schema.FindCoordinatorResponse,
        throttle_time=NO_THROTTLE,
        error_code=error,
        error_message=message,
        node_id=node_id,
        host=host,
        port=port,
    )
    return response


def _find_coordinator_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    body: Any = request
    version = _version(body)
    keys = tuple(body.coordinator_keys) if version >= 4 else (body.key,)
    return _find_coordinator_response(version, keys, (error, None, -1, "", -1))


# -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ----------------------------------------------


class JoinGroup:
    def __init__(self, service: GroupService) -> None:
        self._service = service

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = _version(request)
        session = _ms(request.session_timeout)
        result = await self._service.join_group(
            JoinRequest(
                group_id=request.group_id,
                member_id=request.member_id,
                group_instance_id=getattr(request, "group_instance_id", None),
                client_id=context.header.client_id or "",
                client_host=_client_host(context),
                session_timeout_ms=session,
                rebalance_timeout_ms=_ms(request.rebalance_timeout) if version >= 1 else session,
                protocol_type=request.protocol_type,
                protocols=tuple((p.name, p.metadata) for p in request.protocols),
                requires_known_member_id=version >= 4,
                supports_skip_assignment=version >= 9,
            )
        )
        return _join_response(version, result)


def _join_response(version: int, result: JoinResult) -> ResponseBody:
    schema = response_module(ApiKey.JOIN_GROUP, version)
    members = tuple(
        build(
            schema.JoinGroupResponseMember,
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            metadata=m.metadata,
        )
        for m in result.members
    )
    protocol_name = result.protocol_name
    if version < 7 and protocol_name is None:
        protocol_name = ""  # nullable only from v7
    response: ResponseBody = build(
        schema.JoinGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=protocol_name,
        leader=result.leader,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=members,
    )
    return response


def _join_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    return _join_response(_version(request), JoinResult(error=error))


class SyncGroup:
    def __init__(self, service: GroupService) -> None:
        self._service = service

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        result = await self._service.sync_group(
            SyncRequest(
                group_id=request.group_id,
                member_id=request.member_id,
                group_instance_id=getattr(request, "group_instance_id", None),
                generation_id=request.generation_id,
                protocol_type=getattr(request, "protocol_type", None),
                protocol_name=getattr(request, "protocol_name", None),
                assignments=tuple((a.member_id, a.assignment) for a in request.assignments),
            )
        )
        return _sync_response(_version(request), result)


def _sync_response(version: int, result: SyncResult) -> ResponseBody:
    schema = response_module(ApiKey.SYNC_GROUP, version)
    response: ResponseBody = build(
        schema.SyncGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )
    return response


def _sync_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    return _sync_response(_version(request), SyncResult(error=error))


class Heartbeat:
    def __init__(self, service: GroupService) -> None:
        self._service = service

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        error = await self._service.heartbeat(
            HeartbeatRequest(
                group_id=request.group_id,
                member_id=request.member_id,
                group_instance_id=getattr(request, "group_instance_id", None),
                generation_id=request.generation_id,
            )
        )
        return _heartbeat_response(_version(request), error)


def _heartbeat_response(version: int, error: ErrorCode) -> ResponseBody:
    schema = response_module(ApiKey.HEARTBEAT, version)
    response: ResponseBody = build(
        schema.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error
    )
    return response


def _heartbeat_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    return _heartbeat_response(_version(request), error)


class LeaveGroup:
    def __init__(self, service: GroupService) -> None:
        self._service = service

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = _version(request)
        if version >= 3:
            members = tuple((m.member_id, m.group_instance_id) for m in request.members)
        else:
            members = ((request.member_id, None),)
        result = await self._service.leave_group(
            LeaveRequest(group_id=request.group_id, members=members)
        )
        return _leave_response(version, result)


def _leave_response(version: int, result: LeaveResult) -> ResponseBody:
    schema = response_module(ApiKey.LEAVE_GROUP, version)
    if version < 3:
        response: ResponseBody = build(
            schema.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=result.first_error
        )
        return response
    members = tuple(
        build(
            schema.MemberResponse,
            member_id=member_id,
            group_instance_id=instance_id,
            error_code=error,
        )
        for member_id, instance_id, error in result.members
    )
    response = build(
        schema.LeaveGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        members=members,
    )
    return response


def _leave_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    return _leave_response(_version(request), LeaveResult(error=error))


# -- OffsetCommit, OffsetFetch, OffsetDelete ---------------------------------------------------


class OffsetCommit:
    def __init__(self, service: GroupService, node: GroupNodeInfo) -> None:
        self._service = service
        self._node = node

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        offsets = []
        errors: dict[tuple[str, int], ErrorCode] = {}
        for topic in request.topics:
            for p in topic.partitions:
                if not self._node.partition_exists(topic.name, p.partition_index):
                    errors[(topic.name, p.partition_index)] = E.unknown_topic_or_partition
                    continue
                offsets.append(
                    CommitOffset(
                        topic=topic.name,
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
                    retention_time_ms=-1 if retention is None else _ms(retention),
                    offsets=tuple(offsets),
                )
            )
            for tp, error in result.errors:
                errors.setdefault(tp, error)
        return _commit_response(request, lambda tp: errors[tp])


def _commit_response(
    request: Any, error_of: Callable[[tuple[str, int]], ErrorCode]
) -> ResponseBody:
    schema = response_module(ApiKey.OFFSET_COMMIT, _version(request))
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


class OffsetFetch:
    def __init__(self, service: GroupService) -> None:
        self._service = service

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = _version(request)
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
    version = _version(body)
    if version >= 8:
        results = [(g.group_id, OffsetFetchResult(error)) for g in body.groups]
    else:
        results = [(body.group_id, OffsetFetchResult(error))]
    return _fetch_response(version, body, results)


class OffsetDelete:
    def __init__(self, service: GroupService, node: GroupNodeInfo) -> None:
        self._service = service
        self._node = node

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        wanted = []
        errors: dict[tuple[str, int], ErrorCode] = {}
        for topic in request.topics:
            for p in topic.partitions:
                tp = (topic.name, p.partition_index)
                if self._node.partition_exists(*tp):
                    wanted.append(tp)
                else:
                    errors[tp] = E.unknown_topic_or_partition
        result = await self._service.delete_offsets(
            OffsetDeleteRequest(group_id=request.group_id, partitions=tuple(wanted))
        )
        for tp, error in result.errors:
            errors.setdefault(tp, error)
        return _offset_delete_response(request, result.error, errors)


def _offset_delete_response(
    request: Any, error: ErrorCode, errors: dict[tuple[str, int], ErrorCode]
) -> ResponseBody:
    schema = response_module(ApiKey.OFFSET_DELETE, _version(request))
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


# -- DescribeGroups, ListGroups, DeleteGroups -----------------------------------------------------


class DescribeGroups:
    def __init__(self, service: GroupService) -> None:
        self._service = service

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = _version(request)
        schema = response_module(ApiKey.DESCRIBE_GROUPS, version)
        operations = (
            _GROUP_OPERATIONS
            if getattr(request, "include_authorized_operations", False)
            else _NO_OPERATIONS
        )
        described = await self._service.describe_groups(request.groups)
        groups = tuple(
            build(
                schema.DescribedGroup,
                error_code=d.error,
                group_id=d.group_id,
                group_state=d.state,
                protocol_type=d.protocol_type,
                protocol_data=d.protocol,
                members=tuple(
                    build(
                        schema.DescribedGroupMember,
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in d.members
                ),
                authorized_operations=operations if d.error == E.none else _NO_OPERATIONS,
            )
            for d in described
        )
        response: ResponseBody = build(
            schema.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=groups
        )
        return response


def _describe_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    body: Any = request
    schema = response_module(ApiKey.DESCRIBE_GROUPS, _version(body))
    groups = tuple(
        build(
            schema.DescribedGroup,
            error_code=error,
            group_id=group_id,
            group_state="",
            protocol_type="",
            protocol_data="",
            members=(),
        )
        for group_id in body.groups
    )
    response: ResponseBody = build(
        schema.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=groups
    )
    return response


class ListGroups:
    def __init__(self, service: GroupService) -> None:
        self._service = service

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = _version(request)
        schema = response_module(ApiKey.LIST_GROUPS, version)
        result = await self._service.list_groups(
            getattr(request, "states_filter", ()), getattr(request, "types_filter", ())
        )
        groups = tuple(
            build(
                schema.ListedGroup,
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=g.state,
                group_type=g.group_type,
            )
            for g in result.groups
        )
        response: ResponseBody = build(
            schema.ListGroupsResponse,
            throttle_time=NO_THROTTLE,
            error_code=result.error,
            groups=groups,
        )
        return response


def _list_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    schema = response_module(ApiKey.LIST_GROUPS, _version(request))
    response: ResponseBody = build(
        schema.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=error, groups=()
    )
    return response


class DeleteGroups:
    def __init__(self, service: GroupService) -> None:
        self._service = service

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        result = await self._service.delete_groups(request.groups_names)
        return _delete_response(_version(request), result.results)


def _delete_response(version: int, results: tuple[tuple[str, ErrorCode], ...]) -> ResponseBody:
    schema = response_module(ApiKey.DELETE_GROUPS, version)
    response: ResponseBody = build(
        schema.DeleteGroupsResponse,
        throttle_time=NO_THROTTLE,
        results=tuple(
            build(schema.DeletableGroupResult, group_id=group_id, error_code=error)
            for group_id, error in results
        ),
    )
    return response


def _delete_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    body: Any = request
    return _delete_response(_version(body), tuple((g, error) for g in body.groups_names))


# -- registration ----------------------------------------------------------------------------


def register(
    handlers: dict[int, Handler], service: GroupService, node: GroupNodeInfo
) -> dict[int, ErrorResponder]:
    """Add the group APIs to `handlers`; returns their error responders for the dispatcher."""
    handlers[ApiKey.FIND_COORDINATOR] = FindCoordinator(node)
    handlers[ApiKey.JOIN_GROUP] = JoinGroup(service)
    handlers[ApiKey.SYNC_GROUP] = SyncGroup(service)
    handlers[ApiKey.HEARTBEAT] = Heartbeat(service)
    handlers[ApiKey.LEAVE_GROUP] = LeaveGroup(service)
    handlers[ApiKey.OFFSET_COMMIT] = OffsetCommit(service, node)
    handlers[ApiKey.OFFSET_FETCH] = OffsetFetch(service)
    handlers[ApiKey.OFFSET_DELETE] = OffsetDelete(service, node)
    handlers[ApiKey.DESCRIBE_GROUPS] = DescribeGroups(service)
    handlers[ApiKey.LIST_GROUPS] = ListGroups(service)
    handlers[ApiKey.DELETE_GROUPS] = DeleteGroups(service)
    return {
        ApiKey.FIND_COORDINATOR: _find_coordinator_error,
        ApiKey.JOIN_GROUP: _join_error,
        ApiKey.SYNC_GROUP: _sync_error,
        ApiKey.HEARTBEAT: _heartbeat_error,
        ApiKey.LEAVE_GROUP: _leave_error,
        ApiKey.OFFSET_COMMIT: _commit_error,
        ApiKey.OFFSET_FETCH: _fetch_error,
        ApiKey.OFFSET_DELETE: _offset_delete_error,
        ApiKey.DESCRIBE_GROUPS: _describe_error,
        ApiKey.LIST_GROUPS: _list_error,
        ApiKey.DELETE_GROUPS: _delete_error,
    }
