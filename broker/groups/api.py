"""What goes into the group coordinator and what comes out, in Kafka's vocabulary but free of
any wire version: handlers translate each API version to and from these.

Results that can wait on a write carry `failed(error)`: the answer to send instead when the
write behind them did not reach the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.config import BrokerConfig
from broker.protocol import ErrorCode

__all__ = [
    "CommitOffset",
    "DeleteGroupsResult",
    "FetchedOffset",
    "GroupConfig",
    "GroupDescription",
    "HeartbeatRequest",
    "JoinMember",
    "JoinRequest",
    "JoinResult",
    "LeaveRequest",
    "LeaveResult",
    "ListGroupsResult",
    "ListedGroup",
    "MemberDescription",
    "OffsetCommitRequest",
    "OffsetCommitResult",
    "OffsetDeleteRequest",
    "OffsetDeleteResult",
    "OffsetFetchResult",
    "SyncRequest",
    "SyncResult",
    "TopicPartition",
]

TopicPartition = tuple[str, int]

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000
"""How long a new member's first JoinGroup may wait before it is dropped (Kafka's
`group.coordinator.new.member.join.timeout.ms`): a client whose parked JoinGroup timed out
retries with a fresh request, and the abandoned member must not stall the rebalance."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    """The broker settings the coordinator obeys, with Kafka's names and defaults."""

    num_partitions: int = 50
    """`offsets.topic.num.partitions`: fixed once the topic exists, as a group's partition
    is a hash of its id modulo this."""
    initial_rebalance_delay_ms: int = 3_000
    """`group.initial.rebalance.delay.ms`: how long a new group waits for more members."""
    min_session_timeout_ms: int = 6_000
    """`group.min.session.timeout.ms`: JoinGroup with a shorter session is refused."""
    max_session_timeout_ms: int = 1_800_000
    """`group.max.session.timeout.ms`: JoinGroup with a longer session is refused."""
    max_size: int = 2_147_483_647
    """`group.max.size`: members a group may have."""
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    """`offsets.retention.minutes`, in milliseconds: when an offset expires is
    `ClassicGroup.offset_expiry_base`'s rule."""
    offsets_retention_check_interval_ms: int = 600_000
    """`offsets.retention.check.interval.ms`: how often expired offsets are removed."""
    offset_metadata_max_bytes: int = 4_096
    """`offset.metadata.max.bytes`: a longer commit metadata fails its partition."""
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS
    """How long a new member's first JoinGroup may wait: see `NEW_MEMBER_JOIN_TIMEOUT_MS`."""

    @classmethod
    def from_broker(cls, config: BrokerConfig) -> GroupConfig:
        return cls(
            num_partitions=config.offsets_topic_num_partitions,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            max_size=config.group_max_size,
            offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
            offset_metadata_max_bytes=config.offset_metadata_max_bytes,
        )


# -- membership ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    """(name, metadata) in the member's order of preference."""
    requires_known_member_id: bool = True
    """JoinGroup v4+ (KIP-394): a member without an id is first sent one (MEMBER_ID_REQUIRED)."""
    supports_skip_assignment: bool = True
    """JoinGroup v9+ (KIP-814): a static leader rejoining a stable group is told to skip
    the assignment."""


@dataclass(frozen=True, slots=True)
class JoinMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[JoinMember, ...] = ()
    """Filled for the leader only: every member with its metadata for the chosen protocol."""
    skip_assignment: bool = False

    def failed(self, error: ErrorCode) -> JoinResult:
        return JoinResult(error=error, member_id=self.member_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None = None
    generation_id: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignments: tuple[tuple[str, bytes], ...] = ()
    """Sent by the leader only: (member id, assignment)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""

    def failed(self, error: ErrorCode) -> SyncResult:
        return SyncResult(error=error)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None = None
    generation_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveRequest:
    group_id: str
    members: tuple[tuple[str, str | None], ...]
    """(member id, group instance id); an empty member id with an instance id removes that
    static member (KIP-345 administrative removal)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveResult:
    error: ErrorCode
    members: tuple[tuple[str, str | None, ErrorCode], ...] = ()

    def failed(self, error: ErrorCode) -> LeaveResult:
        return LeaveResult(error=error, members=self.members)

    @property
    def first_error(self) -> ErrorCode:
        """The single error of LeaveGroup v0–v2: the top-level one, else the member's."""
        if self.error != ErrorCode.none:
            return self.error
        return next((e for _, _, e in self.members if e != ErrorCode.none), ErrorCode.none)


# -- offsets ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitOffset:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequest:
    group_id: str
    member_id: str = ""
    group_instance_id: str | None = None
    generation_id: int = -1
    retention_time_ms: int = -1
    """OffsetCommit v2–v4: a per-commit expiry; -1 uses `offsets.retention.minutes`."""
    offsets: tuple[CommitOffset, ...] = ()
    api_version: int = 8
    """The OffsetCommit version: from v9 a commit with a generation to a group that does not
    exist is GROUP_ID_NOT_FOUND, before ILLEGAL_GENERATION (Kafka's OffsetMetadataManager).
    On a classic group v9+'s GenerationIdOrMemberEpoch is the generation, as before."""


@dataclass(frozen=True, slots=True)
class OffsetCommitResult:
    errors: tuple[tuple[TopicPartition, ErrorCode], ...]

    def failed(self, error: ErrorCode) -> OffsetCommitResult:
        return OffsetCommitResult(tuple((tp, error) for tp, _ in self.errors))


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    topic: str
    partition: int
    offset: int = -1
    leader_epoch: int = -1
    metadata: str = ""
    error: ErrorCode = ErrorCode.none


@dataclass(frozen=True, slots=True)
class OffsetFetchResult:
    error: ErrorCode
    offsets: tuple[FetchedOffset, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetDeleteRequest:
    group_id: str
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetDeleteResult:
    error: ErrorCode
    errors: tuple[tuple[TopicPartition, ErrorCode], ...] = ()

    def failed(self, error: ErrorCode) -> OffsetDeleteResult:
        return OffsetDeleteResult(error, ())


# -- administration --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    error: ErrorCode
    state: str = "Dead"
    protocol_type: str = ""
    protocol: str = ""
    members: tuple[MemberDescription, ...] = ()


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


@dataclass(frozen=True, slots=True)
class ListGroupsResult:
    error: ErrorCode
    groups: tuple[ListedGroup, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class DeleteGroupsResult:
    results: tuple[tuple[str, ErrorCode], ...]

    def failed(self, error: ErrorCode) -> DeleteGroupsResult:
        return DeleteGroupsResult(
            tuple((g, error if e == ErrorCode.none else e) for g, e in self.results)
        )
