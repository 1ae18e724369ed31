"""DescribeGroups, ListGroups and DeleteGroups on the wire."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.groups import GroupDescription, GroupService, ListGroupsResult
from broker.handlers.context import AUTHORIZED_OPERATIONS_OMITTED, NO_THROTTLE
from broker.protocol import ApiKey, ErrorCode, RequestBody, ResponseBody, build, response_module
from broker.server import Handler, RequestContext
from broker.server.dispatcher import ErrorResponder

from .common import E, GroupApi, GroupNodeInfo, version_of

_GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)
"""READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS and ALTER_CONFIGS: the ACL operations on a group
in Kafka 4 (`AclEntry.supportedOperations(GROUP)`), all allowed without an authorizer
(DescribeGroups v3+ `include_authorized_operations`)."""


class DescribeGroups(GroupApi):
    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        operations = (
            _GROUP_OPERATIONS
            if getattr(request, "include_authorized_operations", False)
            else AUTHORIZED_OPERATIONS_OMITTED
        )
        described = await self._service.describe_groups(request.groups)
        return _describe_response(version_of(request), described, operations)


FIRST_NOT_FOUND_VERSION = 6
"""KIP-1043: from DescribeGroups v6 an unknown group is GROUP_ID_NOT_FOUND with a message;
before, it is described without error as a Dead group with no members."""


def _error(version: int, d: GroupDescription) -> tuple[ErrorCode, str | None]:
    if d.error != E.group_id_not_found:
        return d.error, None
    if version < FIRST_NOT_FOUND_VERSION:
        return E.none, None
    return d.error, f"Group {d.group_id} not found."  # Kafka's words


def _describe_response(
    version: int, described: Iterable[GroupDescription], operations: int
) -> ResponseBody:
    schema = response_module(ApiKey.DESCRIBE_GROUPS, version)
    groups = tuple(
        build(
            schema.DescribedGroup,
            error_code=_error(version, d)[0],
            error_message=_error(version, d)[1],
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
            authorized_operations=operations
            if _error(version, d)[0] == E.none
            else AUTHORIZED_OPERATIONS_OMITTED,
        )
        for d in described
    )
    response: ResponseBody = build(
        schema.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=groups
    )
    return response


def _describe_error(request: RequestBody, error: ErrorCode) -> ResponseBody:
    body: Any = request
    failed = (GroupDescription(group_id, error, state="") for group_id in body.groups)
    return _describe_response(version_of(body), failed, AUTHORIZED_OPERATIONS_OMITTED)


class ListGroups(GroupApi):
    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        result = await self._service.list_groups(
            getattr(request, "states_filter", ()), getattr(request, "types_filter", ())
        )
        return _list_response(version_of(request), result)


def _list_response(version: int, result: ListGroupsResult) -> ResponseBody:
    schema = response_module(ApiKey.LIST_GROUPS, version)
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
    return _list_response(version_of(request), ListGroupsResult(error))


class DeleteGroups(GroupApi):
    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        result = await self._service.delete_groups(request.groups_names)
        return _delete_response(version_of(request), result.results)


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
    return _delete_response(version_of(body), tuple((g, error) for g in body.groups_names))


def register(
    handlers: dict[int, Handler], service: GroupService, node: GroupNodeInfo
) -> dict[int, ErrorResponder]:
    """Add this module's APIs to `handlers`; returns their error responders."""
    handlers[ApiKey.DESCRIBE_GROUPS] = DescribeGroups(service)
    handlers[ApiKey.LIST_GROUPS] = ListGroups(service)
    handlers[ApiKey.DELETE_GROUPS] = DeleteGroups(service)
    return {
        ApiKey.DESCRIBE_GROUPS: _describe_error,
        ApiKey.LIST_GROUPS: _list_error,
        ApiKey.DELETE_GROUPS: _delete_error,
    }
