"""Consumer groups, classic protocol: Kafka's group coordinator and `__consumer_offsets`.

What it owns: group membership and rebalancing (JoinGroup, SyncGroup, Heartbeat, LeaveGroup),
committed offsets (OffsetCommit, OffsetFetch, OffsetDelete), the administrative group APIs,
and the records that make all of it survive a restart. The decisions live in a pure core
(`GroupCoordinator`: no clock, no I/O, no asyncio); `GroupService` drives it with asyncio and
persists through a `GroupLog`, implemented on the broker's commit log by `LogGroupLog`.
What it must never do: speak the wire protocol (that is `broker.handlers.groups`), or import
the server.
"""

from .api import (
    CommitOffset,
    DeleteGroupsResult,
    FetchedOffset,
    GroupConfig,
    GroupDescription,
    HeartbeatRequest,
    JoinMember,
    JoinRequest,
    JoinResult,
    LeaveRequest,
    LeaveResult,
    ListedGroup,
    ListGroupsResult,
    MemberDescription,
    OffsetCommitRequest,
    OffsetCommitResult,
    OffsetDeleteRequest,
    OffsetDeleteResult,
    OffsetFetchResult,
    SyncRequest,
    SyncResult,
)
from .coordinator import GroupCoordinator
from .group import GroupState
from .persistence import GroupLog, GroupLogUnavailable, LogGroupLog
from .records import partition_for
from .service import GroupService

__all__ = [
    "CommitOffset",
    "DeleteGroupsResult",
    "FetchedOffset",
    "GroupConfig",
    "GroupCoordinator",
    "GroupDescription",
    "GroupLog",
    "GroupLogUnavailable",
    "GroupService",
    "GroupState",
    "HeartbeatRequest",
    "JoinMember",
    "JoinRequest",
    "JoinResult",
    "LeaveRequest",
    "LeaveResult",
    "ListGroupsResult",
    "ListedGroup",
    "LogGroupLog",
    "MemberDescription",
    "OffsetCommitRequest",
    "OffsetCommitResult",
    "OffsetDeleteRequest",
    "OffsetDeleteResult",
    "OffsetFetchResult",
    "SyncRequest",
    "SyncResult",
    "partition_for",
]
