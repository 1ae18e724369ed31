"""Rebalancing: JoinGroup, SyncGroup, Heartbeat, LeaveGroup and the timers that drive them,
with the rules and error codes of Kafka's classic group coordinator.

The rules, in the order a group lives them:
1. A new group waits `group.initial.rebalance.delay.ms` for more members, and again each time
   one arrives, up to its rebalance timeout; it never completes the join phase early.
2. Any other rebalance completes as soon as every member (and every member id handed out with
   MEMBER_ID_REQUIRED) has rejoined, or at the rebalance timeout, when dynamic members that
   did not rejoin are removed. Static members stay: their session timeout decides.
3. Completing the join phase bumps the generation, picks the protocol every member supports by
   vote, keeps the leader if it rejoined (else promotes one that did), sends the leader every
   member's metadata, and gives each member the rebalance timeout to send SyncGroup; members
   that do not are removed and the group rebalances again.
4. The leader's SyncGroup writes the group (members and assignments) to the log; only then
   does each member get its assignment and the group become Stable.
5. A member whose session times out is removed and the group rebalances; a member parked in
   a JoinGroup or SyncGroup owes no heartbeat, except a new member, which is given
   `new_member_join_timeout_ms` to complete its first join.
6. A static member (group.instance.id) that joins with an unknown member id takes over the
   old member id, which is fenced (FENCED_INSTANCE_ID). In a Stable group whose protocol does
   not change this needs no rebalance: the new id is written and the member goes on.

No clock is read and nothing waits here: `now_ms` is an argument and answers go to `outbox`.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Callable, Hashable

from broker.protocol import ErrorCode

from .api import (
    GroupConfig,
    HeartbeatRequest,
    JoinRequest,
    JoinResult,
    LeaveRequest,
    LeaveResult,
    SyncRequest,
    SyncResult,
)
from .effects import Deadlines, Outbox, Result
from .group import ClassicGroup, GroupState, Member
from .records import (
    GroupMetadataValue,
    encode_group_metadata_key,
    encode_group_metadata_value,
    partition_for,
)

__all__ = ["Membership"]

E = ErrorCode
S = GroupState


def _random_suffix() -> str:
    return str(uuid.uuid4())


class Membership:
    def __init__(
        self, config: GroupConfig, *, member_id_suffix: Callable[[], str] | None = None
    ) -> None:
        """`member_id_suffix`: what follows the client id in a new member id (a random UUID
        by default, as in Kafka; tests pass a counter)."""
        self.config = config
        self.groups: dict[str, ClassicGroup] = {}
        self.outbox = Outbox()
        self.deadlines = Deadlines()
        self._tickets = itertools.count(1)
        self._member_id_suffix = member_id_suffix or _random_suffix

    # -- hooks for the coordinator ---------------------------------------------------------

    def partition_error(self, group_id: str) -> ErrorCode:
        """NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS when the group's partition is not
        served here yet; NONE otherwise."""
        return E.none

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.config.num_partitions)

    def _reply(self, ticket: int, group_id: str, result: Result) -> None:
        self.outbox.reply(ticket, result, self.partition_of(group_id))

    def _write_group(self, group: ClassicGroup, assignment: dict[str, bytes]) -> None:
        value = encode_group_metadata_value(group.metadata_value(assignment))
        self.outbox.append(
            self.partition_of(group.group_id),
            [(encode_group_metadata_key(group.group_id), value)],
        )

    def _write_empty_group(self, group: ClassicGroup) -> None:
        """Kafka's record for a group just created: generation 0, no members, no protocol."""
        value = GroupMetadataValue(
            protocol_type="",
            generation=0,
            protocol=None,
            leader=None,
            current_state_timestamp=-1 if group.state_timestamp is None else group.state_timestamp,
        )
        self.outbox.append(
            self.partition_of(group.group_id),
            [(encode_group_metadata_key(group.group_id), encode_group_metadata_value(value))],
        )

    # -- JoinGroup -------------------------------------------------------------------------

    def join_group(self, request: JoinRequest, now_ms: int) -> int:
        ticket = next(self._tickets)
        group_id, member_id = request.group_id, request.member_id

        def fail(error: ErrorCode, member: str = member_id) -> int:
            self._reply(ticket, group_id, JoinResult(error=error, member_id=member))
            return ticket

        if not group_id:
            return fail(E.invalid_group_id)
        error = self.partition_error(group_id)
        if error != E.none:
            return fail(error)
        if not (
            self.config.min_session_timeout_ms
            <= request.session_timeout_ms
            <= self.config.max_session_timeout_ms
        ):
            return fail(E.invalid_session_timeout)
        group = self.groups.get(group_id)
        is_new_group = group is None
        if group is None:
            if member_id:
                return fail(E.unknown_member_id)
            group = self.groups[group_id] = ClassicGroup(group_id, state_timestamp=now_ms)
        written = self.outbox.appended
        if not self._accepts_joining_member(group, member_id):
            removed = group.remove(member_id)
            if removed is not None:
                self._drop_member(group, removed)
            fail(E.group_max_size_reached, "")
        elif not member_id:
            self._join_new_member(group, request, ticket, now_ms)
        else:
            self._join_existing_member(group, request, ticket, now_ms)
        if is_new_group and self.outbox.appended == written and group_id in self.groups:
            # Write the new group at once, so that it survives a restart (Kafka 3.7+).
            self._write_empty_group(group)
        return ticket

    def _accepts_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        max_size = self.config.max_size
        if group.is_(S.EMPTY, S.DEAD):
            return True
        if group.is_(S.PREPARING_REBALANCE):
            member = group.members.get(member_id)
            return (member is not None and member.awaiting_join) or (
                group.num_awaiting_join < max_size
            )
        return member_id in group.members or len(group.members) < max_size

    def _join_new_member(
        self, group: ClassicGroup, request: JoinRequest, ticket: int, now_ms: int
    ) -> None:
        if group.is_(S.DEAD):
            self._reply(ticket, group.group_id, JoinResult(error=E.coordinator_not_available))
            return
        if not group.supports_protocols(request.protocol_type, {n for n, _ in request.protocols}):
            self._reply(ticket, group.group_id, JoinResult(error=E.inconsistent_group_protocol))
            return
        instance_id = request.group_instance_id
        new_id = f"{instance_id or request.client_id}-{self._member_id_suffix()}"
        if instance_id is not None:
            existing = group.static_members.get(instance_id)
            if existing is not None:
                self._replace_static_member(
                    group, request, old_id=existing, new_id=new_id, ticket=ticket, now_ms=now_ms
                )
            else:
                self._add_member(group, request, new_id, ticket, now_ms)
        elif request.requires_known_member_id:
            group.pending_join.add(new_id)
            self.deadlines.schedule(
                ("heartbeat", group.group_id, new_id), now_ms + request.session_timeout_ms
            )
            self._reply(
                ticket, group.group_id, JoinResult(error=E.member_id_required, member_id=new_id)
            )
        else:
            self._add_member(group, request, new_id, ticket, now_ms)

    def _join_existing_member(
        self, group: ClassicGroup, request: JoinRequest, ticket: int, now_ms: int
    ) -> None:
        member_id = request.member_id
        error = E.none
        if group.is_(S.DEAD):
            error = E.coordinator_not_available
        elif not group.supports_protocols(request.protocol_type, {n for n, _ in request.protocols}):
            error = E.inconsistent_group_protocol
        elif member_id in group.pending_join and request.group_instance_id is None:
            self._add_member(group, request, member_id, ticket, now_ms)
            return
        else:
            error = group.validate_member(member_id, request.group_instance_id)
        if error != E.none:
            self._reply(ticket, group.group_id, self._error(error, member_id))
        else:
            self._rejoin(group, group.members[member_id], request, ticket, now_ms)

    def _rejoin(
        self, group: ClassicGroup, member: Member, request: JoinRequest, ticket: int, now_ms: int
    ) -> None:
        member_id = member.member_id
        is_leader = group.leader_id == member_id
        unchanged = member.matches(request.protocols)
        if group.is_(S.PREPARING_REBALANCE):
            self._update_member(group, member, request, ticket, now_ms)
        elif group.is_(S.COMPLETING_REBALANCE) and unchanged:
            # It missed the JoinGroup response: send it again.
            answer = self._current_generation(group, member_id, with_members=is_leader)
            self._reply(ticket, group.group_id, answer)
        elif group.is_(S.STABLE) and unchanged and not is_leader:
            answer = self._current_generation(group, member_id, with_members=False)
            self._reply(ticket, group.group_id, answer)
        elif group.is_(S.COMPLETING_REBALANCE, S.STABLE):
            # New metadata, or the leader asking for a rebalance (for changes outside member
            # metadata, such as new partitions of a subscribed topic).
            self._update_member(group, member, request, ticket, now_ms)
        else:
            self._reply(ticket, group.group_id, self._error(E.unknown_member_id, member_id))

    @staticmethod
    def _error(error: ErrorCode, member_id: str) -> JoinResult:
        return JoinResult(error=error, member_id=member_id)

    def _current_generation(
        self, group: ClassicGroup, member_id: str, *, with_members: bool, skip: bool = False
    ) -> JoinResult:
        """The JoinGroup answer for the current generation; the leader gets the members."""
        return JoinResult(
            error=E.none,
            member_id=member_id,
            generation_id=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader_id or "",
            members=group.current_members() if with_members else (),
            skip_assignment=skip,
        )

    def _add_member(
        self, group: ClassicGroup, request: JoinRequest, member_id: str, ticket: int, now_ms: int
    ) -> None:
        member = Member(
            member_id=member_id,
            group_instance_id=request.group_instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            session_timeout_ms=request.session_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=request.protocols,
            is_new=True,
        )
        if group.is_(S.PREPARING_REBALANCE) and group.previous_state is S.EMPTY:
            group.new_member_added = True
        group.add(member, ticket)
        self._schedule_heartbeat(group, member, now_ms, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance_or_complete_join(group, now_ms)

    def _update_member(
        self, group: ClassicGroup, member: Member, request: JoinRequest, ticket: int, now_ms: int
    ) -> None:
        self._supersede(group, member.join_ticket, JoinResult(error=E.rebalance_in_progress))
        group.update_member(
            member,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            ticket,
        )
        self._maybe_prepare_rebalance_or_complete_join(group, now_ms)

    def _supersede(self, group: ClassicGroup, ticket: int | None, result: Result) -> None:
        """A member sent the same request again while the first was parked (from a new
        connection): the first is answered rather than left hanging."""
        if ticket is not None:
            self._reply(ticket, group.group_id, result)

    def _replace_static_member(
        self,
        group: ClassicGroup,
        request: JoinRequest,
        *,
        old_id: str,
        new_id: str,
        ticket: int,
        now_ms: int,
    ) -> None:
        current_leader = group.leader_id or ""
        old = group.members[old_id]
        if old.join_ticket is not None:
            self._reply(
                old.join_ticket,
                group.group_id,
                JoinResult(error=E.fenced_instance_id, member_id=old_id),
            )
        if old.sync_ticket is not None:
            self._reply(old.sync_ticket, group.group_id, SyncResult(error=E.fenced_instance_id))
        assert request.group_instance_id is not None
        self.deadlines.cancel(("heartbeat", group.group_id, old_id))
        member = group.replace_static_member(request.group_instance_id, old_id, new_id)
        self._schedule_heartbeat(group, member, now_ms)
        group.update_member(
            member,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            ticket,
        )
        if group.is_(S.STABLE):
            if group.protocol_name != group.select_protocol():
                self._maybe_prepare_rebalance_or_complete_join(group, now_ms)
                return
            # Same protocol: persist the new member id, then let the member carry on.
            self._write_group(group, {m.member_id: m.assignment for m in group.members.values()})
            if request.supports_skip_assignment:
                is_leader = group.leader_id == new_id
                result = self._current_generation(
                    group, new_id, with_members=is_leader, skip=is_leader
                )
            else:
                # Older clients cannot skip the assignment: a static leader is told the old
                # leader id, so it acts as a follower and only syncs.
                result = dataclasses.replace(
                    self._current_generation(group, new_id, with_members=False),
                    leader=current_leader,
                )
            self._complete_join(group, member, result)
        elif group.is_(S.COMPLETING_REBALANCE):
            # The leader may already hold the old id for its assignment: rebalance.
            self._prepare_rebalance(group, now_ms)
        else:
            self._maybe_complete_join_phase(group, now_ms)

    # -- the join phase ----------------------------------------------------------------------

    def _complete_join(self, group: ClassicGroup, member: Member, result: JoinResult) -> bool:
        ticket = member.join_ticket
        if ticket is None:
            return False
        member.join_ticket = None
        self._reply(ticket, group.group_id, result)
        return True

    def _maybe_prepare_rebalance_or_complete_join(self, group: ClassicGroup, now_ms: int) -> None:
        if group.can_rebalance:
            self._prepare_rebalance(group, now_ms)
        else:
            self._maybe_complete_join_phase(group, now_ms)

    def _maybe_complete_join_phase(self, group: ClassicGroup, now_ms: int) -> None:
        if (
            group.is_(S.PREPARING_REBALANCE)
            and group.has_all_members_joined
            and group.previous_state is not S.EMPTY
        ):
            self._complete_join_phase(group, now_ms)

    def _prepare_rebalance(self, group: ClassicGroup, now_ms: int) -> None:
        if group.is_(S.COMPLETING_REBALANCE):
            self._propagate_assignment(group, E.rebalance_in_progress, reset=True, now_ms=now_ms)
        group.pending_sync.clear()
        self.deadlines.cancel(("sync", group.group_id))
        initial = group.is_(S.EMPTY)
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms - delay, 0)
            group.initial_join = (delay, remaining)
            self.deadlines.schedule(("join", group.group_id), now_ms + delay)
        group.transition(S.PREPARING_REBALANCE, now_ms)
        if not initial:
            self._complete_join_or_schedule(group, now_ms)

    def _complete_join_or_schedule(self, group: ClassicGroup, now_ms: int) -> None:
        if group.has_all_members_joined:
            self._complete_join_phase(group, now_ms)
        else:
            group.initial_join = None
            self.deadlines.schedule(("join", group.group_id), now_ms + group.rebalance_timeout_ms)

    def _on_join_deadline(self, group: ClassicGroup, now_ms: int) -> None:
        if group.initial_join is not None:
            delay, remaining = group.initial_join
            if group.new_member_added and remaining != 0:
                # Another member arrived during the delay: wait a little longer for more.
                group.new_member_added = False
                new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
                group.initial_join = (new_delay, max(remaining - delay, 0))
                self.deadlines.schedule(("join", group.group_id), now_ms + new_delay)
                return
        self._complete_join_phase(group, now_ms)

    def _complete_join_phase(self, group: ClassicGroup, now_ms: int) -> None:
        self.deadlines.cancel(("join", group.group_id))
        group.initial_join = None
        for member in list(group.members.values()):
            if not member.awaiting_join and member.group_instance_id is None:
                group.remove(member.member_id)
                self._drop_member(group, member)
        if group.is_(S.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody rejoined: wait for the session timeouts to clear the members out.
            self.deadlines.schedule(("join", group.group_id), now_ms + group.rebalance_timeout_ms)
            return
        group.init_next_generation(now_ms)
        if group.is_(S.EMPTY):
            self._write_group(group, {})
            return
        for member in group.members.values():
            is_leader = group.leader_id == member.member_id
            answer = self._current_generation(group, member.member_id, with_members=is_leader)
            self._complete_join(group, member, answer)
            self._schedule_heartbeat(group, member, now_ms)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        group.sync_generation = group.generation
        self.deadlines.schedule(("sync", group.group_id), now_ms + group.rebalance_timeout_ms)

    # -- SyncGroup -------------------------------------------------------------------------

    def _current_member(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int
    ) -> tuple[ClassicGroup | None, ErrorCode]:
        """The checks SyncGroup and Heartbeat share, in Kafka's order."""
        error = E.invalid_group_id if not group_id else self.partition_error(group_id)
        group = self.groups.get(group_id)
        if error == E.none:
            if group is None:
                error = E.unknown_member_id
            elif group.is_(S.DEAD):
                error = E.coordinator_not_available
            else:
                error = group.validate_member(member_id, instance_id)
                if error == E.none and generation_id != group.generation:
                    error = E.illegal_generation
        return group, error

    def sync_group(self, request: SyncRequest, now_ms: int) -> int:
        ticket = next(self._tickets)
        group_id = request.group_id
        group, error = self._current_member(
            group_id, request.member_id, request.group_instance_id, request.generation_id
        )
        if group is not None and error == E.none:
            if _inconsistent(request.protocol_type, group.protocol_type) or _inconsistent(
                request.protocol_name, group.protocol_name
            ):
                error = E.inconsistent_group_protocol
            elif group.is_(S.EMPTY):
                error = E.unknown_member_id
            elif group.is_(S.PREPARING_REBALANCE):
                error = E.rebalance_in_progress
        if group is None or error != E.none:
            self._reply(ticket, group_id, SyncResult(error=error))
            return ticket
        member = group.members[request.member_id]
        if group.is_(S.STABLE):
            self._remove_pending_sync(group, member.member_id)
            self._reply(
                ticket,
                group_id,
                SyncResult(
                    error=E.none,
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    assignment=member.assignment,
                ),
            )
            return ticket
        self._supersede(group, member.sync_ticket, SyncResult(error=E.rebalance_in_progress))
        member.sync_ticket = ticket
        self._remove_pending_sync(group, member.member_id)
        if group.leader_id == member.member_id:
            assignment = {m.member_id: b"" for m in group.members.values()}
            assignment.update(request.assignments)
            # The members learn their assignments only after the group is in the log: the
            # outbox delivers the answers queued below after this write.
            self._write_group(group, assignment)
            for m in group.members.values():
                m.assignment = assignment[m.member_id]
            self._propagate_assignment(group, E.none, reset=False, now_ms=now_ms)
            group.transition(S.STABLE, now_ms)
        return ticket

    def _propagate_assignment(
        self, group: ClassicGroup, error: ErrorCode, *, reset: bool, now_ms: int
    ) -> None:
        for member in group.members.values():
            if reset:
                member.assignment = b""
            ticket = member.sync_ticket
            if ticket is None:
                continue
            member.sync_ticket = None
            ok = error == E.none
            self._reply(
                ticket,
                group.group_id,
                SyncResult(
                    error=error,
                    protocol_type=group.protocol_type if ok else None,
                    protocol_name=group.protocol_name if ok else None,
                    assignment=member.assignment,
                ),
            )
            self._schedule_heartbeat(group, member, now_ms)

    def _remove_pending_sync(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync or not group.is_(S.COMPLETING_REBALANCE, S.STABLE):
            self.deadlines.cancel(("sync", group.group_id))

    def _on_sync_deadline(self, group: ClassicGroup, now_ms: int) -> None:
        if group.sync_generation != group.generation:
            return
        if group.is_(S.COMPLETING_REBALANCE, S.STABLE) and group.pending_sync:
            for member_id in list(group.pending_sync):
                member = group.remove(member_id)
                if member is not None:
                    self._drop_member(group, member)
            self._prepare_rebalance(group, now_ms)

    # -- Heartbeat -------------------------------------------------------------------------

    def heartbeat(self, request: HeartbeatRequest, now_ms: int) -> ErrorCode:
        group, error = self._current_member(
            request.group_id, request.member_id, request.group_instance_id, request.generation_id
        )
        if group is None or error != E.none:
            return error
        if group.is_(S.EMPTY):
            return E.unknown_member_id
        self._schedule_heartbeat(group, group.members[request.member_id], now_ms)
        return E.rebalance_in_progress if group.is_(S.PREPARING_REBALANCE) else E.none

    def _schedule_heartbeat(
        self, group: ClassicGroup, member: Member, now_ms: int, timeout_ms: int | None = None
    ) -> None:
        timeout = member.session_timeout_ms if timeout_ms is None else timeout_ms
        self.deadlines.schedule(("heartbeat", group.group_id, member.member_id), now_ms + timeout)

    def _on_heartbeat_deadline(self, group: ClassicGroup, member_id: str, now_ms: int) -> None:
        if group.is_(S.DEAD):
            return
        if member_id in group.pending_join:
            group.pending_join.discard(member_id)
            if group.is_(S.PREPARING_REBALANCE) and group.has_all_members_joined:
                self._complete_join_phase(group, now_ms)
            return
        member = group.members.get(member_id)
        if member is not None and not member.has_satisfied_heartbeat:
            self._remove_member_and_rebalance(group, member, now_ms)

    def _remove_member_and_rebalance(
        self, group: ClassicGroup, member: Member, now_ms: int
    ) -> None:
        group.remove(member.member_id)
        self._drop_member(group, member)
        if group.is_(S.STABLE, S.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(group, now_ms)
        elif group.is_(S.PREPARING_REBALANCE) and group.has_all_members_joined:
            self._complete_join_phase(group, now_ms)

    def _drop_member(
        self, group: ClassicGroup, member: Member, error: ErrorCode = E.unknown_member_id
    ) -> None:
        """A removed member's timers stop and its parked requests are answered `error`: by
        default UNKNOWN_MEMBER_ID, so that a live client joins again."""
        self.deadlines.cancel(("heartbeat", group.group_id, member.member_id))
        if member.join_ticket is not None:
            self._reply(member.join_ticket, group.group_id, JoinResult(error=error))
            member.join_ticket = None
        if member.sync_ticket is not None:
            self._reply(member.sync_ticket, group.group_id, SyncResult(error=error))
            member.sync_ticket = None

    def _cancel_group_timers(self, group: ClassicGroup) -> None:
        """For a group that goes away: its join and sync deadlines, and those of member ids
        handed out but not yet used to join."""
        for member_id in group.pending_join:
            self.deadlines.cancel(("heartbeat", group.group_id, member_id))
        self.deadlines.cancel(("join", group.group_id))
        self.deadlines.cancel(("sync", group.group_id))

    # -- LeaveGroup ------------------------------------------------------------------------

    def leave_group(self, request: LeaveRequest, now_ms: int) -> int:
        ticket = next(self._tickets)
        group_id = request.group_id
        if not group_id:
            self._reply(ticket, group_id, LeaveResult(error=E.invalid_group_id))
            return ticket
        error = self.partition_error(group_id)
        group = self.groups.get(group_id)
        if error == E.none and group is not None and group.is_(S.DEAD):
            error = E.coordinator_not_available
        if error != E.none:
            self._reply(ticket, group_id, LeaveResult(error=error))
            return ticket
        if group is None:
            members = tuple((m, i, E.unknown_member_id) for m, i in request.members)
            self._reply(ticket, group_id, LeaveResult(error=E.none, members=members))
            return ticket
        answers = [
            (member_id, instance_id, self._leave(group, member_id, instance_id))
            for member_id, instance_id in request.members
        ]
        left = any(error == E.none for _, _, error in answers)
        if left:
            if group.is_(S.STABLE, S.COMPLETING_REBALANCE):
                self._maybe_prepare_rebalance_or_complete_join(group, now_ms)
            elif group.is_(S.PREPARING_REBALANCE):
                self._maybe_complete_join_phase(group, now_ms)
        self._reply(ticket, group_id, LeaveResult(error=E.none, members=tuple(answers)))
        return ticket

    def _leave(self, group: ClassicGroup, member_id: str, instance_id: str | None) -> ErrorCode:
        if not member_id:
            # KIP-345: an administrator removes a static member by its instance id alone.
            static_id = group.static_members.get(instance_id) if instance_id else None
            if static_id is None:
                return E.unknown_member_id
            member_id = static_id
        elif member_id in group.pending_join:
            group.pending_join.discard(member_id)
            self.deadlines.cancel(("heartbeat", group.group_id, member_id))
            return E.none
        else:
            error = group.validate_member(member_id, instance_id)
            if error != E.none:
                return error
        member = group.members[member_id]
        group.remove(member_id)
        self._drop_member(group, member)
        return E.none

    # -- timers ----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        return self.deadlines.next_deadline()

    def tick(self, now_ms: int) -> None:
        """Fire every deadline due at `now_ms`, including those that firing schedules."""
        while (name := self.deadlines.pop_due(now_ms)) is not None:
            self._fire(name, now_ms)

    def _fire(self, name: Hashable, now_ms: int) -> None:
        assert isinstance(name, tuple)
        kind, group_id = name[0], name[1]
        group = self.groups.get(group_id)
        if group is None:
            return
        if kind == "heartbeat":
            self._on_heartbeat_deadline(group, name[2], now_ms)
        elif kind == "join":
            self._on_join_deadline(group, now_ms)
        elif kind == "sync":
            self._on_sync_deadline(group, now_ms)


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current
