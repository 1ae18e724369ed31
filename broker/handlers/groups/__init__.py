"""The consumer-group APIs on the wire: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, OffsetDelete, DescribeGroups, ListGroups, DeleteGroups.

Each handler translates one API, at every version in the version table, to the group
service's vocabulary and back; the rules of groups live in `broker.groups`. What stays here
is what Kafka's request layer does before the coordinator: partitions of unknown topics are
answered UNKNOWN_TOPIC_OR_PARTITION, JoinGroup v0 rebalances within its session timeout,
LeaveGroup v0–v2 carries one member, OffsetFetch v8 asks for several groups, and version
differences in the answers (nullable protocol names from JoinGroup v7, one error for
LeaveGroup v0–v2, per-partition errors for OffsetFetch v1).

`membership` holds FindCoordinator and the rebalance APIs, `offsets` the offset APIs, `admin`
DescribeGroups, ListGroups and DeleteGroups; `common` what they share.

A node serves every group's coordinator itself (FindCoordinator names this node) and
creates `__consumer_offsets` on the first FindCoordinator for a group, as Kafka does.
"""

from __future__ import annotations

from broker.groups import GroupService
from broker.server import Handler
from broker.server.dispatcher import ErrorResponder

from . import admin, membership, offsets
from .common import GroupNodeInfo

__all__ = ["GroupNodeInfo", "register"]


def register(
    handlers: dict[int, Handler], service: GroupService, node: GroupNodeInfo
) -> dict[int, ErrorResponder]:
    """Add the group APIs to `handlers`; returns their error responders for the dispatcher."""
    responders: dict[int, ErrorResponder] = {}
    for module in (membership, offsets, admin):
        responders.update(module.register(handlers, service, node))
    return responders
