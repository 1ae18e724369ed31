"""FindCoordinator, JoinGroup, SyncGroup, Heartbeat and LeaveGroup on the wire."""

from __future__ import annotations

from typing import Any

from broker.groups import (
    GroupService,
    HeartbeatRequest,
    JoinRequest,
    JoinResult,
    LeaveRequest,
    LeaveResult,
    SyncRequest,
    SyncResult,
)
from broker.handlers.context import NO_THROTTLE
from broker.protocol import ApiKey, ErrorCode, RequestBody, ResponseBody, build, response_module
from broker.server import Handler, RequestContext
from broker.server.dispatcher import ErrorResponder

from .common import E, GroupApi, GroupNodeInfo, client_host, ms, version_of

_GROUP_KEY, _TRANSACTION_KEY, _SHARE_KEY = 0, 1, 2

TRANSACTIONS_UNSUPPORTED = (
    "Gregor does not support transactions yet: unset transactional.id (an idempotent "
    "producer, enable.idempotence=true, still writes each record once)"
)


class FindCoordinator:
    def __init__(self, node: GroupNodeInfo) -> None:
        self._node = node

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = version_of(request)
        keys = tuple(request.coordinator_keys) if version >= 4 else (request.key,)
        key_type = int(getattr(request, "key_type", _GROUP_KEY))
        found: tuple[ErrorCode, str | None, int, str, int]
        if key_type == _GROUP_KEY and await self._node.ensure_offsets_topic():
            # Each group's own coordinator: the leader of its __consumer_offsets partition.
            return _find_coordinator_response(
                version, keys, [self._coordinator(key, context.listener) for key in keys]
            )
        if key_type == _TRANSACTION_KEY:
            # Not the retriable COORDINATOR_NOT_AVAILABLE: a transactional producer would
            # retry it for its whole timeout. Clients treat this error as fatal at once.
            found = (E.transactional_id_authorization_failed, TRANSACTIONS_UNSUPPORTED, -1, "", -1)
        elif key_type == _SHARE_KEY:
            # FindCoordinator v6 (KIP-932): INVALID_REQUEST, as Kafka answers with share groups
            # off.
            found = (E.invalid_request, "share groups are not supported", -1, "", -1)
        elif key_type != _GROUP_KEY:
            found = (E.invalid_request, f"unknown key type {key_type}", -1, "", -1)
        else:
            found = (E.coordinator_not_available, "__consumer_offsets is not available", -1, "", -1)
        return _find_coordinator_response(version, keys, [found] * len(keys))

    def _coordinator(self, group_id: str, listener: str) -> _Found:
        endpoint = self._node.coordinator_endpoint(group_id, listener)
        if endpoint is None:
            return (E.coordinator_not_available, "the coordinator is not available", -1, "", -1)
        return (E.none, None, *endpoint)


_Found = tuple[ErrorCode, str | None, int, str, int]


def _find_coordinator_response(
    version: int, keys: tuple[str, ...], answers: list[_Found]
) -> ResponseBody:
    schema = response_module(ApiKey.FIND_COORDINATOR, version)
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
            for key, (error, message, node_id, host, port) in zip(keys, answers, strict=True)
        )
        response: ResponseBody = build(
            schema.FindCoordinatorResponse, throttle_time=NO_THROTTLE, coordinators=coordinators
        )
        return response
    error, message, node_id, host, port = answers[0]
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
    version = version_of(body)
    keys = tuple(body.coordinator_keys) if version >= 4 else (body.key,)
    return _find_coordinator_response(version, keys, [(error, None, -1, "", -1)] * len(keys))


class JoinGroup(GroupApi):
    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = version_of(request)
        session = ms(request.session_timeout)
        result = await self._service.join_group(
            JoinRequest(
                group_id=request.group_id,
                member_id=request.member_id,
                group_instance_id=getattr(request, "group_instance_id", None),
                client_id=context.header.client_id or "",
                client_host=client_host(context),
                session_timeout_ms=session,
                rebalance_timeout_ms=ms(request.rebalance_timeout) if version >= 1 else session,
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
    return _join_response(version_of(request), JoinResult(error=error))


class SyncGroup(GroupApi):
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
        return _sync_response(version_of(request), result)


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
    return _sync_response(version_of(request), SyncResult(error=error))


class Heartbeat(GroupApi):
    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        error = await self._service.heartbeat(
            HeartbeatRequest(
                group_id=request.group_id,
                member_id=request.member_id,
                group_instance_id=getattr(request, "group_instance_id", None),
                generation_id=request.generation_id,
            )
        )
        return _heartbeat_response(version_of(request), error)


def _heartbeat_response(version: int, error: ErrorCode) -> ResponseBody:
    schema = response_module(ApiKey.HEARTBEAT, version)
    response: ResponseBody = build(
        schema.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error
    )
    return response


def _heartbeat_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    return _heartbeat_response(version_of(request), error)


class LeaveGroup(GroupApi):
    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = version_of(request)
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
    return _leave_response(version_of(request), LeaveResult(error=error))


def register(
    handlers: dict[int, Handler], service: GroupService, node: GroupNodeInfo
) -> dict[int, ErrorResponder]:
    """Add this module's APIs to `handlers`; returns their error responders."""
    handlers[ApiKey.FIND_COORDINATOR] = FindCoordinator(node)
    handlers[ApiKey.JOIN_GROUP] = JoinGroup(service)
    handlers[ApiKey.SYNC_GROUP] = SyncGroup(service)
    handlers[ApiKey.HEARTBEAT] = Heartbeat(service)
    handlers[ApiKey.LEAVE_GROUP] = LeaveGroup(service)
    return {
        ApiKey.FIND_COORDINATOR: _find_coordinator_error,
        ApiKey.JOIN_GROUP: _join_error,
        ApiKey.SYNC_GROUP: _sync_error,
        ApiKey.HEARTBEAT: _heartbeat_error,
        ApiKey.LEAVE_GROUP: _leave_error,
    }
