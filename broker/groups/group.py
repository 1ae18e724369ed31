"""A classic consumer group and its members, as Kafka's `ClassicGroup` keeps them.

What it owns: the state machine (Empty → PreparingRebalance → CompletingRebalance → Stable,
and Dead), membership (dynamic, pending and static members), the leader, the generation, the
protocol type and the selected protocol, the topics the members subscribe to, and the group's
committed offsets. What it must never do: decide when to rebalance, read a clock, or answer a
request; the coordinator does those and passes `now_ms` in.

Tickets stand for parked JoinGroup and SyncGroup requests: a member is "awaiting join" while
it holds a `join_ticket`, "awaiting sync" while it holds a `sync_ticket`.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.protocol import ErrorCode

from .api import JoinMember, TopicPartition
from .records import GroupMetadataValue, MemberMetadata, OffsetCommitValue, subscribed_topics

__all__ = ["ClassicGroup", "GroupState", "Member"]

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}

Protocols = tuple[tuple[str, bytes], ...]


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = b""
    join_ticket: int | None = None
    sync_ticket: int | None = None
    is_new: bool = False
    """Joined but not yet through a rebalance: it may expire while its JoinGroup is parked."""

    @property
    def awaiting_join(self) -> bool:
        return self.join_ticket is not None

    @property
    def has_satisfied_heartbeat(self) -> bool:
        """A member parked in a rebalance owes no heartbeat; a new one always does."""
        return not self.is_new and (self.join_ticket is not None or self.sync_ticket is not None)

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise ValueError(f"member {self.member_id} does not support protocol {protocol!r}")

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        return next(name for name, _ in self.protocols if name in candidates)

    def matches(self, protocols: Protocols) -> bool:
        return self.protocols == protocols


@dataclass(eq=False)
class ClassicGroup:
    group_id: str
    state: GroupState = GroupState.EMPTY
    previous_state: GroupState = GroupState.DEAD
    state_timestamp: int | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation: int = 0
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    """group.instance.id → member id."""
    pending_join: set[str] = field(default_factory=set)
    """Member ids handed out with MEMBER_ID_REQUIRED, not yet used to join."""
    pending_sync: set[str] = field(default_factory=set)
    supported_protocols: Counter[str] = field(default_factory=Counter)
    subscribed_topics: frozenset[str] | None = None
    """None when unknown: not the consumer protocol, or metadata that does not parse."""
    new_member_added: bool = False
    initial_join: tuple[int, int] | None = None
    """(delay, remaining) of the initial rebalance delay while it runs."""
    sync_generation: int = -1
    offsets: dict[TopicPartition, OffsetCommitValue] = field(default_factory=dict)

    # -- state ---------------------------------------------------------------------------

    def transition(self, state: GroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise AssertionError(f"group {self.group_id}: {self.state.value} → {state.value}")
        self.previous_state, self.state = self.state, state
        self.state_timestamp = now_ms

    def is_(self, *states: GroupState) -> bool:
        return self.state in states

    @property
    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    @property
    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    # -- membership ----------------------------------------------------------------------

    def add(self, member: Member, join_ticket: int | None) -> None:
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if not self.leader_id:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(name for name, _ in member.protocols)
        member.join_ticket = join_ticket
        self.pending_join.discard(member.member_id)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(name for name, _ in member.protocols)
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_join.discard(member_id)
        self.pending_sync.discard(member_id)
        return member

    def update_member(
        self,
        member: Member,
        protocols: Protocols,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        join_ticket: int | None,
    ) -> None:
        self.supported_protocols.subtract(name for name, _ in member.protocols)
        member.protocols = protocols
        self.supported_protocols.update(name for name, _ in protocols)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        member.join_ticket = join_ticket

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """The member keeps everything but its id; the caller fences the old id's requests."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        member.join_ticket = member.sync_ticket = None
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        self.static_members[instance_id] = new_id
        return member

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode:
        if instance_id is not None:
            existing = self.static_members.get(instance_id)
            if existing is None:
                return ErrorCode.unknown_member_id
            if existing != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return ErrorCode.none

    @property
    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.join_ticket is not None)

    @property
    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_join

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else promote a member that did; False if none did."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].awaiting_join:
            return True
        for member in self.members.values():
            if member.awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    # -- protocols -----------------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        size = len(self.members)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols[name] == size for name in names
        )

    def select_protocol(self) -> str:
        """Each member votes for its favourite protocol among those all members support; the
        most votes win (ties go to the protocol voted first, Kafka leaves them to hash order)."""
        size = len(self.members)
        candidates = {name for name, count in self.supported_protocols.items() if count == size}
        votes = Counter(member.vote(candidates) for member in self.members.values())
        return votes.most_common(1)[0][0]

    def init_next_generation(self, now_ms: int) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition(GroupState.EMPTY, now_ms)
        self.pending_sync.clear()

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        if not self.uses_consumer_protocol:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            member_topics = subscribed_topics(member.metadata(self.protocol_name))
            if member_topics is None:
                return None
            topics |= member_topics
        return frozenset(topics)

    def is_subscribed_to_topic(self, topic: str) -> bool:
        """Unknown subscriptions count as subscribed for consumer groups, as in Kafka."""
        if self.subscribed_topics is None:
            return self.uses_consumer_protocol
        return topic in self.subscribed_topics

    def current_members(self) -> tuple[JoinMember, ...]:
        protocol = self.protocol_name or ""
        return tuple(
            JoinMember(m.member_id, m.group_instance_id, m.metadata(protocol))
            for m in self.members.values()
        )

    # -- offsets -------------------------------------------------------------------------

    def offset_expiry_base(self) -> Callable[[OffsetCommitValue], int] | None:
        """From when an offset's retention counts, or None if this group's offsets never expire
        now (Kafka's `offsetExpirationCondition`)."""
        if self.protocol_type is None:
            return lambda offset: offset.commit_timestamp  # a "simple" group: per commit
        if self.state is GroupState.EMPTY:
            since = self.state_timestamp
            return lambda offset: offset.commit_timestamp if since is None else since
        if (
            self.uses_consumer_protocol
            and self.subscribed_topics is not None
            and self.is_(GroupState.STABLE)
        ):
            return lambda offset: offset.commit_timestamp
        return None

    # -- records -------------------------------------------------------------------------

    def metadata_value(self, assignment: dict[str, bytes]) -> GroupMetadataValue:
        protocol = self.protocol_name
        members = tuple(
            MemberMetadata(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.session_timeout_ms,
                subscription=m.metadata(protocol) if protocol is not None else b"",
                assignment=assignment.get(m.member_id, b""),
            )
            for m in self.members.values()
        )
        return GroupMetadataValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation,
            protocol=protocol,
            leader=self.leader_id,
            current_state_timestamp=-1 if self.state_timestamp is None else self.state_timestamp,
            members=members,
        )

    @classmethod
    def from_metadata(cls, group_id: str, value: GroupMetadataValue) -> ClassicGroup:
        """A group as replayed from `__consumer_offsets`: Stable with its members, or Empty."""
        group = cls(
            group_id,
            state=GroupState.STABLE if value.members else GroupState.EMPTY,
            state_timestamp=(
                None if value.current_state_timestamp < 0 else value.current_state_timestamp
            ),
            protocol_type=value.protocol_type or None,
            protocol_name=value.protocol,
            generation=value.generation,
            leader_id=value.leader,
        )
        protocol = value.protocol or ""
        for m in value.members:
            member = Member(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.session_timeout_ms,
                protocol_type=value.protocol_type,
                protocols=((protocol, m.subscription),),
                assignment=m.assignment,
            )
            group.members[m.member_id] = member
            group.supported_protocols[protocol] += 1
            if m.group_instance_id is not None:
                group.static_members[m.group_instance_id] = m.member_id
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.subscribed_topics = group.compute_subscribed_topics()
        return group
