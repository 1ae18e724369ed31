"""The group coordinator: the groups of the `__consumer_offsets` partitions served here, their
committed offsets, and the administrative APIs (DescribeGroups, ListGroups, DeleteGroups,
OffsetDelete).

What it owns: which partitions are loaded (a group in any other partition is answered
NOT_COORDINATOR, one still loading COORDINATOR_LOAD_IN_PROGRESS), building groups and offsets
back from a partition's records, OffsetCommit validation (generation and member checks for
group members, plain commits for "simple" consumers), OffsetFetch, OffsetDelete, group
deletion and offset expiry (`offsets.retention.minutes`, checked every
`offsets.retention.check.interval.ms`). What it must never do: wait, read a clock, or touch
the log: records go out through the outbox, time comes in as `now_ms`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from broker.protocol import ErrorCode

from .api import (
    DeleteGroupsResult,
    FetchedOffset,
    GroupConfig,
    GroupDescription,
    ListedGroup,
    ListGroupsResult,
    MemberDescription,
    OffsetCommitRequest,
    OffsetCommitResult,
    OffsetDeleteRequest,
    OffsetDeleteResult,
    OffsetFetchResult,
    TopicPartition,
)
from .group import ClassicGroup, GroupState
from .membership import Membership
from .records import (
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_offset_commit_key,
    encode_offset_commit_value,
)

__all__ = ["GroupCoordinator"]

E = ErrorCode
S = GroupState
_EXPIRE = ("expire",)


@dataclass
class _Loading:
    """A partition being replayed: the last value of each key, as compaction would keep it."""

    groups: dict[str, GroupMetadataValue | None] = field(default_factory=dict)
    offsets: dict[OffsetCommitKey, OffsetCommitValue | None] = field(default_factory=dict)


class GroupCoordinator(Membership):
    """Rebalancing comes from `Membership`; this adds partitions, offsets and administration."""

    def __init__(
        self, config: GroupConfig, *, member_id_suffix: Callable[[], str] | None = None
    ) -> None:
        super().__init__(config, member_id_suffix=member_id_suffix)
        self.loaded: set[int] = set()
        """Partitions whose groups are served here."""
        self._loading: dict[int, _Loading] = {}

    # -- partitions ------------------------------------------------------------------------

    @property
    def loading(self) -> frozenset[int]:
        return frozenset(self._loading)

    def partition_error(self, group_id: str) -> ErrorCode:
        partition = self.partition_of(group_id)
        if partition in self.loaded:
            return E.none
        if partition in self._loading:
            return E.coordinator_load_in_progress
        return E.not_coordinator

    def begin_load(self, partition: int) -> None:
        self.loaded.discard(partition)
        self._loading[partition] = _Loading()

    def replay(self, partition: int, key: bytes, value: bytes | None) -> None:
        """One record of the partition, in log order. Raises `GroupRecordError` for a record
        that cannot be read; the caller decides whether to skip it."""
        loading = self._loading[partition]
        decoded = decode_key(key)
        if decoded is None:
            return
        if isinstance(decoded, OffsetCommitKey):
            loading.offsets[decoded] = None if value is None else decode_offset_commit_value(value)
        else:
            loading.groups[decoded.group_id] = (
                None if value is None else decode_group_metadata_value(value)
            )

    def complete_load(self, partition: int, now_ms: int) -> None:
        loading = self._loading.pop(partition)
        loaded = []
        for group_id, value in loading.groups.items():
            if value is not None:
                group = self.groups[group_id] = ClassicGroup.from_metadata(group_id, value)
                loaded.append(group)
        for (group_id, topic, index), offset in loading.offsets.items():
            if offset is None:
                continue
            owner = self.groups.get(group_id)
            if owner is None:
                owner = self.groups[group_id] = ClassicGroup(group_id, state_timestamp=now_ms)
            owner.offsets[(topic, index)] = offset
        self.loaded.add(partition)
        for group in loaded:
            for member in group.members.values():
                self._schedule_heartbeat(group, member, now_ms)
            if len(group.members) > self.config.max_size:
                self._prepare_rebalance(group, now_ms)
        if _EXPIRE not in self.deadlines:
            self._schedule_expiry(now_ms)

    def unload(self, partition: int) -> None:
        """Stop serving a partition: its groups are forgotten here and every parked request
        of theirs is answered NOT_COORDINATOR, so clients look for the coordinator again."""
        self.loaded.discard(partition)
        self._loading.pop(partition, None)
        for group_id in [g for g in self.groups if self.partition_of(g) == partition]:
            group = self.groups.pop(group_id)
            for member in group.members.values():
                self._drop_member(group, member, E.not_coordinator)
            self._cancel_group_timers(group)

    # -- OffsetCommit ----------------------------------------------------------------------

    def commit_offsets(self, request: OffsetCommitRequest, now_ms: int) -> int:
        ticket = next(self._tickets)
        group_id = request.group_id
        partitions = [(o.topic, o.partition) for o in request.offsets]

        def answer_all(error: ErrorCode) -> int:
            result = OffsetCommitResult(tuple((tp, error) for tp in partitions))
            self._reply(ticket, group_id, result)
            return ticket

        error = self.partition_error(group_id)
        if error != E.none:
            return answer_all(error)
        group = self.groups.get(group_id)
        if group is None:
            if request.generation_id >= 0:
                # OffsetCommit v9+ says GROUP_ID_NOT_FOUND; older versions ILLEGAL_GENERATION.
                if request.api_version >= 9:
                    return answer_all(E.group_id_not_found)
                return answer_all(E.illegal_generation)
            # A consumer without group management (or the admin client): a "simple" group.
            group = self.groups[group_id] = ClassicGroup(group_id, state_timestamp=now_ms)
        error = _validate_offset_commit(group, request)
        if error != E.none:
            return answer_all(error)
        records: list[tuple[bytes, bytes | None]] = []
        errors = []
        for commit in request.offsets:
            tp = (commit.topic, commit.partition)
            metadata = commit.metadata or ""
            if len(metadata.encode("utf-16-le", "surrogatepass")) // 2 > (
                self.config.offset_metadata_max_bytes
            ):
                errors.append((tp, E.offset_metadata_too_large))
                continue
            value = OffsetCommitValue(
                offset=commit.offset,
                metadata=metadata,
                commit_timestamp=now_ms,
                leader_epoch=commit.leader_epoch,
                expire_timestamp=(
                    None if request.retention_time_ms == -1 else now_ms + request.retention_time_ms
                ),
            )
            group.offsets[tp] = value
            records.append(
                (
                    encode_offset_commit_key(group_id, commit.topic, commit.partition),
                    encode_offset_commit_value(value),
                )
            )
            errors.append((tp, E.none))
        self.outbox.append(self.partition_of(group_id), records)
        self._reply(ticket, group_id, OffsetCommitResult(tuple(errors)))
        return ticket

    # -- OffsetFetch -----------------------------------------------------------------------

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> OffsetFetchResult:
        """The committed offsets of `partitions` (all of the group's with None); -1 where none
        is committed. Commits are only in memory once they are in the log, so every answer is
        stable (`require_stable` has nothing to wait for without transactional commits)."""
        error = self.partition_error(group_id)
        if error != E.none:
            return OffsetFetchResult(error)
        group = self.groups.get(group_id)
        offsets = {} if group is None else group.offsets
        wanted = sorted(offsets) if partitions is None else list(partitions)
        fetched = []
        for topic, index in wanted:
            committed = offsets.get((topic, index))
            if committed is None:
                fetched.append(FetchedOffset(topic, index))
            else:
                fetched.append(
                    FetchedOffset(
                        topic, index, committed.offset, committed.leader_epoch, committed.metadata
                    )
                )
        return OffsetFetchResult(E.none, tuple(fetched))

    # -- OffsetDelete ----------------------------------------------------------------------

    def delete_offsets(self, request: OffsetDeleteRequest, now_ms: int) -> int:
        ticket = next(self._tickets)
        group_id = request.group_id
        error = E.invalid_group_id if not group_id else self.partition_error(group_id)
        group = self.groups.get(group_id)
        if error == E.none and (group is None or group.is_(S.DEAD)):
            error = E.group_id_not_found
        if error == E.none and group is not None:
            busy = group.is_(S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE)
            if busy and not group.uses_consumer_protocol:
                error = E.non_empty_group
        if error != E.none or group is None:
            self._reply(ticket, group_id, OffsetDeleteResult(error))
            return ticket
        records: list[tuple[bytes, bytes | None]] = []
        errors = []
        for topic, index in request.partitions:
            if group.is_subscribed_to_topic(topic):
                errors.append(((topic, index), E.group_subscribed_to_topic))
                continue
            if group.offsets.pop((topic, index), None) is not None:
                records.append((encode_offset_commit_key(group_id, topic, index), None))
            errors.append(((topic, index), E.none))
        self.outbox.append(self.partition_of(group_id), records)
        self._reply(ticket, group_id, OffsetDeleteResult(E.none, tuple(errors)))
        return ticket

    # -- DescribeGroups, ListGroups, DeleteGroups ------------------------------------------

    def describe_groups(self, group_ids: Iterable[str]) -> tuple[GroupDescription, ...]:
        return tuple(self._describe(group_id) for group_id in group_ids)

    def _describe(self, group_id: str) -> GroupDescription:
        if not group_id:
            return GroupDescription(group_id, E.invalid_group_id)
        error = self.partition_error(group_id)
        if error != E.none:
            return GroupDescription(group_id, error)
        group = self.groups.get(group_id)
        if group is None:
            # Dead, and not found: DescribeGroups v6+ says so, older versions only say Dead.
            return GroupDescription(group_id, E.group_id_not_found)
        stable = group.is_(S.STABLE) and group.protocol_name is not None
        protocol = group.protocol_name if stable and group.protocol_name else ""
        members = tuple(
            MemberDescription(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                metadata=m.metadata(protocol) if stable else b"",
                assignment=m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return GroupDescription(
            group_id, E.none, group.state.value, group.protocol_type or "", protocol, members
        )

    def list_groups(
        self, states: Iterable[str] = (), types: Iterable[str] = ()
    ) -> ListGroupsResult:
        """Groups of the loaded partitions, filtered by state (ListGroups v4) and by type
        (v5: every group here is "classic"); case does not matter, as in Kafka."""
        wanted_states = {s.lower() for s in states}
        wanted_types = {t.lower() for t in types}
        error = E.coordinator_load_in_progress if self._loading else E.none
        if wanted_types and "classic" not in wanted_types:
            return ListGroupsResult(error)
        listed = tuple(
            ListedGroup(group.group_id, group.protocol_type or "", group.state.value)
            for group in self.groups.values()
            if not wanted_states or group.state.value.lower() in wanted_states
        )
        return ListGroupsResult(error, listed)

    def delete_groups(self, group_ids: Iterable[str], now_ms: int) -> int:
        ticket = next(self._tickets)
        results = []
        partitions = set()
        for group_id in group_ids:
            error = E.invalid_group_id if not group_id else self.partition_error(group_id)
            group = self.groups.get(group_id)
            if error == E.none and (group is None or group.is_(S.DEAD)):
                error = E.group_id_not_found
            if error == E.none and group is not None and not group.is_(S.EMPTY):
                error = E.non_empty_group
            if error == E.none and group is not None:
                self._delete_group(group, list(group.offsets), now_ms)
                partitions.add(self.partition_of(group_id))
            results.append((group_id, error))
        self.outbox.reply(ticket, DeleteGroupsResult(tuple(results)), *partitions)
        return ticket

    def _delete_group(
        self, group: ClassicGroup, offsets: list[TopicPartition], now_ms: int
    ) -> None:
        """Tombstones for the offsets given and for the group itself; the group is gone."""
        group_id = group.group_id
        records = _offset_tombstones(group_id, offsets)
        records.append((encode_group_metadata_key(group_id), None))
        self.outbox.append(self.partition_of(group_id), records)
        group.transition(S.DEAD, now_ms)
        del self.groups[group_id]
        self._cancel_group_timers(group)

    # -- offset expiry ---------------------------------------------------------------------

    def expire_offsets(self, now_ms: int) -> None:
        """Kafka's `cleanupGroupMetadata`: expired offsets get tombstones, and an Empty group
        left without offsets is deleted."""
        retention = self.config.offsets_retention_ms
        for group in list(self.groups.values()):
            base = group.offset_expiry_base()
            if base is None and group.offsets:
                continue
            expired = []
            for tp, offset in group.offsets.items():
                if group.is_subscribed_to_topic(tp[0]):
                    continue
                assert base is not None
                if offset.expire_timestamp is not None:
                    gone = now_ms >= offset.expire_timestamp
                else:
                    gone = now_ms - base(offset) >= retention
                if gone:
                    expired.append(tp)
            for tp in expired:
                del group.offsets[tp]
            if not group.offsets and group.is_(S.EMPTY):
                self._delete_group(group, expired, now_ms)
            elif expired:
                records = _offset_tombstones(group.group_id, expired)
                self.outbox.append(self.partition_of(group.group_id), records)

    def _fire(self, name: Hashable, now_ms: int) -> None:
        if name == _EXPIRE:
            self.expire_offsets(now_ms)
            self._schedule_expiry(now_ms)
        else:
            super()._fire(name, now_ms)

    def _schedule_expiry(self, now_ms: int) -> None:
        self.deadlines.schedule(_EXPIRE, now_ms + self.config.offsets_retention_check_interval_ms)


def _offset_tombstones(
    group_id: str, partitions: Iterable[TopicPartition]
) -> list[tuple[bytes, bytes | None]]:
    return [(encode_offset_commit_key(group_id, topic, index), None) for topic, index in partitions]


def _validate_offset_commit(group: ClassicGroup, request: OffsetCommitRequest) -> ErrorCode:
    """Kafka's `ClassicGroup.validateOffsetCommit` for a non-transactional commit."""
    if group.is_(S.DEAD):
        return E.coordinator_not_available
    if request.generation_id < 0 and group.is_(S.EMPTY):
        return E.none  # a simple consumer, or the admin client, on a group nobody consumes in
    error = E.none
    if request.generation_id >= 0 or request.member_id or request.group_instance_id is not None:
        error = group.validate_member(request.member_id, request.group_instance_id)
        if error == E.none and request.generation_id != group.generation:
            error = E.illegal_generation
    elif not group.is_(S.EMPTY):
        error = E.unknown_member_id  # a plain commit while the group has members
    if error == E.none and group.is_(S.COMPLETING_REBALANCE):
        error = E.rebalance_in_progress
    return error
