"""Rebalancing in the pure coordinator: members join, sync, heartbeat, time out and leave."""

from __future__ import annotations

from broker.groups import GroupState, JoinResult, SyncResult
from broker.groups.effects import Append, Reply
from broker.groups.records import decode_group_metadata_value, decode_key
from broker.protocol import ErrorCode as E

from .harness import Core

# -- JoinGroup -----------------------------------------------------------------------------


def test_first_join_without_member_id_gets_member_id_required() -> None:
    core = Core()
    answer = core.answer(core.join(client="app"))
    assert answer == JoinResult(error=E.member_id_required, member_id="app-id1")
    # The new group is written at once (generation 0, no members), as Kafka 3.7+ does.
    ((_, key, value),) = core.records
    assert decode_key(key) == ("g",)
    assert value is not None
    assert decode_group_metadata_value(value).generation == 0


def test_rejoining_with_the_member_id_completes_the_first_generation() -> None:
    core = Core()
    member = core.join_new("app")
    assert core.answer(core.last) is None  # parked for the initial rebalance delay
    core.advance(0)
    answer = core.answer(core.last)
    assert answer.error == E.none
    assert (answer.member_id, answer.generation_id, answer.leader) == (member, 1, member)
    assert (answer.protocol_type, answer.protocol_name) == ("consumer", "range")
    assert [(m.member_id, m.metadata) for m in answer.members] == [(member, b"r-meta")]


def test_join_before_v4_needs_no_member_id_round_trip() -> None:
    core = Core()
    ticket = core.join(version=3)
    core.advance(0)
    answer = core.answer(ticket)
    assert answer.error == E.none
    assert answer.member_id == "c-id1"


def test_initial_rebalance_delay_extends_while_members_keep_arriving() -> None:
    core = Core(initial_rebalance_delay_ms=3_000)
    core.join_new("a", rebalance=10_000)
    first = core.last
    core.advance(1_000)
    core.join_new("b", rebalance=10_000)
    second = core.last
    core.advance(1_999)  # t=2999: still waiting
    assert core.answer(first) is None
    core.advance(1)  # t=3000: a member arrived during the delay, wait another 3s
    assert core.answer(first) is None
    core.advance(2_999)
    assert core.answer(first) is None
    core.advance(1)  # t=6000
    assert core.answer(first).generation_id == 1
    assert core.answer(second).generation_id == 1


def test_a_new_member_rebalances_a_stable_group_and_the_rebalance_completes_when_all_rejoin() -> (
    None
):
    core = Core()
    (leader,) = core.stable_group("a")
    newcomer = core.join_new("b")
    assert core.heartbeat(leader, 1) == E.rebalance_in_progress
    assert core.answer(core.last) is None
    rejoin = core.join(leader, client="a")
    leader_answer, newcomer_answer = core.answer(rejoin), core.answer(core.last)
    assert leader_answer.generation_id == newcomer_answer.generation_id == 2
    assert {m.member_id for m in leader_answer.members} == {leader, newcomer}
    assert newcomer_answer.members == ()
    assert newcomer_answer.leader == leader


def test_the_protocol_is_chosen_by_votes_among_those_every_member_supports() -> None:
    core = Core()
    both = (("roundrobin", b"x"), ("range", b"y"))
    tickets = []
    for client, protocols in [
        ("a", (("range", b"y"), ("roundrobin", b"x"), ("sticky", b"z"))),
        ("b", both),
        ("c", (("roundrobin", b"x"), ("range", b"y"))),
    ]:
        core.join_new(client, protocols=protocols)
        tickets.append(core.last)
    core.advance(0)
    assert {core.answer(t).protocol_name for t in tickets} == {"roundrobin"}


def test_a_member_that_supports_no_common_protocol_is_refused() -> None:
    core = Core()
    core.stable_group("a")
    answer = core.answer(core.join(protocols=(("other", b""),)))
    assert answer.error == E.inconsistent_group_protocol
    answer = core.answer(core.join(protocol_type="connect"))
    assert answer.error == E.inconsistent_group_protocol


def test_session_timeouts_outside_the_broker_limits_are_refused() -> None:
    core = Core(min_session_timeout_ms=6_000, max_session_timeout_ms=60_000)
    assert core.answer(core.join(session=5_999)).error == E.invalid_session_timeout
    assert core.answer(core.join(session=60_001)).error == E.invalid_session_timeout


def test_join_errors_for_bad_group_ids_and_unknown_members() -> None:
    core = Core()
    assert core.answer(core.join(group="")).error == E.invalid_group_id
    assert core.answer(core.join("ghost")).error == E.unknown_member_id
    core.stable_group("a")
    assert core.answer(core.join("ghost")).error == E.unknown_member_id


def test_group_max_size_refuses_the_member_too_many() -> None:
    core = Core(max_size=1)
    core.stable_group("a")
    answer = core.answer(core.join("", client="b", version=3))
    assert answer == JoinResult(error=E.group_max_size_reached, member_id="")


def test_a_follower_rejoining_a_stable_group_unchanged_gets_the_current_generation() -> None:
    core = Core()
    _, follower = core.stable_group("a", "b")
    answer = core.answer(core.join(follower, client="b"))
    assert (answer.error, answer.generation_id, answer.members) == (E.none, 1, ())
    assert answer.member_id == follower


def test_the_leader_rejoining_a_stable_group_starts_a_rebalance() -> None:
    core = Core()
    leader, follower = core.stable_group("a", "b")
    ticket = core.join(leader, client="a")
    assert core.answer(ticket) is None
    assert core.heartbeat(follower, 1) == E.rebalance_in_progress


# -- SyncGroup -----------------------------------------------------------------------------


def test_the_leaders_assignment_is_written_before_any_member_learns_it() -> None:
    core = Core()
    ids = []
    tickets = []
    for client in ("a", "b"):
        ids.append(core.join_new(client))
        tickets.append(core.last)
    core.advance(0)
    leader, follower = ids
    waiting = core.sync(follower, 1)
    assert core.answer(waiting) is None  # parked until the leader syncs
    core.effects.clear()
    done = core.sync(leader, 1, assignments=((leader, b"L"), (follower, b"F")))
    kinds = [type(e) for e in core.effects]
    assert kinds == [Append, Reply, Reply]
    record = core.effects[0]
    assert isinstance(record, Append)
    value = record.records[0][1]
    assert value is not None
    stored = decode_group_metadata_value(value)
    assert {m.member_id: m.assignment for m in stored.members} == {leader: b"L", follower: b"F"}
    assert core.answer(done) == SyncResult(
        error=E.none, protocol_type="consumer", protocol_name="range", assignment=b"L"
    )
    assert core.answer(waiting).assignment == b"F"
    assert core.core.groups["g"].state is GroupState.STABLE
    assert core.heartbeat(follower, 1) == E.none


def test_sync_errors() -> None:
    core = Core()
    leader, follower = core.stable_group("a", "b")
    assert core.answer(core.sync(leader, 2)).error == E.illegal_generation
    assert core.answer(core.sync("ghost", 1)).error == E.unknown_member_id
    assert core.answer(core.sync(leader, 1, group="nope")).error == E.unknown_member_id
    assert core.answer(core.sync(leader, 1, group="")).error == E.invalid_group_id
    wrong = core.sync(leader, 1, protocol_name="roundrobin")
    assert core.answer(wrong).error == E.inconsistent_group_protocol
    core.join(leader, client="a")  # the leader asks for a rebalance
    assert core.answer(core.sync(follower, 1)).error == E.rebalance_in_progress


def test_a_stable_group_answers_sync_with_the_members_assignment() -> None:
    core = Core()
    _, follower = core.stable_group("a", "b")
    assert core.answer(core.sync(follower, 1)).assignment == f"a-{follower}".encode()


def test_a_member_that_never_syncs_is_removed_after_the_rebalance_timeout() -> None:
    core = Core()
    ids, tickets = [], []
    for client in ("a", "b"):
        ids.append(core.join_new(client, rebalance=5_000))
        tickets.append(core.last)
    core.advance(0)
    leader, follower = ids
    core.sync(leader, 1, assignments=((leader, b"L"), (follower, b"F")))
    core.advance(4_999)
    assert follower in core.core.groups["g"].members
    core.advance(1)
    assert follower not in core.core.groups["g"].members
    assert core.core.groups["g"].state is GroupState.PREPARING_REBALANCE


# -- Heartbeat and session timeouts ---------------------------------------------------------


def test_heartbeat_errors() -> None:
    core = Core()
    (member,) = core.stable_group("a")
    assert core.heartbeat(member, 1) == E.none
    assert core.heartbeat(member, 0) == E.illegal_generation
    assert core.heartbeat("ghost", 1) == E.unknown_member_id
    assert core.heartbeat(member, 1, group="other") == E.unknown_member_id
    assert core.heartbeat(member, 1, group="") == E.invalid_group_id


def test_a_silent_member_is_removed_after_its_session_timeout() -> None:
    core = Core()
    leader, follower = core.stable_group("a", "b", session=10_000)
    core.advance(6_000)
    assert core.heartbeat(leader, 1) == E.none
    core.advance(3_999)
    assert core.heartbeat(leader, 1) == E.none
    assert follower in core.core.groups["g"].members
    core.advance(1)  # the follower has been silent for 10s: gone, and the group rebalances
    assert follower not in core.core.groups["g"].members
    assert core.heartbeat(leader, 1) == E.rebalance_in_progress


def test_the_last_member_timing_out_leaves_an_empty_group_written_to_the_log() -> None:
    core = Core()
    core.stable_group("a", session=10_000)
    core.records.clear()
    core.advance(10_000)
    group = core.core.groups["g"]
    assert (group.state, group.generation) == (GroupState.EMPTY, 2)
    ((_, _, value),) = core.records
    assert value is not None
    stored = decode_group_metadata_value(value)
    assert (stored.generation, stored.members, stored.protocol) == (2, (), None)


def test_members_that_do_not_rejoin_within_the_rebalance_timeout_are_removed() -> None:
    core = Core()
    leader, follower = core.stable_group("a", "b", rebalance=20_000)
    ticket = core.join(leader, client="a", rebalance=20_000)
    core.advance(5_000)
    assert core.heartbeat(follower, 1) == E.rebalance_in_progress
    core.advance(15_000)
    answer = core.answer(ticket)
    assert (answer.generation_id, [m.member_id for m in answer.members]) == (2, [leader])


def test_a_new_leader_is_elected_when_the_leader_does_not_rejoin() -> None:
    core = Core()
    leader, follower = core.stable_group("a", "b")
    core.leave((leader, None))
    # The leader left: the follower must rejoin and becomes leader.
    ticket = core.join(follower, client="b")
    answer = core.answer(ticket)
    assert answer.leader == follower
    assert [m.member_id for m in answer.members] == [follower]


def test_a_member_id_handed_out_but_never_used_expires_after_the_session_timeout() -> None:
    core = Core()
    (leader,) = core.stable_group("a")
    pending = core.answer(core.join(client="b", session=8_000)).member_id
    rejoin = core.join(leader, client="a")
    core.advance(7_000)
    assert core.answer(rejoin) is None  # still waiting for the pending member
    core.heartbeat(leader, 1)
    core.advance(1_000)
    answer = core.answer(rejoin)
    assert answer.generation_id == 2
    assert pending not in core.core.groups["g"].members


def test_a_new_member_whose_join_is_parked_expires_after_the_new_member_timeout() -> None:
    core = Core(new_member_join_timeout_ms=60_000)
    core.stable_group("a", "b", session=120_000, rebalance=600_000)
    newcomer = core.join_new("c", rebalance=600_000)
    parked = core.last
    core.advance(60_000)
    assert core.answer(parked) == JoinResult(error=E.unknown_member_id)
    assert newcomer not in core.core.groups["g"].members


# -- LeaveGroup ----------------------------------------------------------------------------


def test_leave_group_rebalances_the_remaining_members() -> None:
    core = Core()
    leader, follower = core.stable_group("a", "b")
    result = core.leave((follower, None))
    assert result.members == ((follower, None, E.none),)
    assert core.heartbeat(leader, 1) == E.rebalance_in_progress


def test_leave_group_batch_answers_each_member() -> None:
    core = Core()
    a, b, c = core.stable_group("a", "b", "c")
    result = core.leave((a, None), ("ghost", None), (b, None))
    assert result.error == E.none
    assert result.members == (
        (a, None, E.none),
        ("ghost", None, E.unknown_member_id),
        (b, None, E.none),
    )
    assert list(core.core.groups["g"].members) == [c]


def test_leave_group_of_an_unknown_group_or_bad_id() -> None:
    core = Core()
    result = core.leave(("m", None), group="nope")
    assert (result.error, result.first_error) == (E.none, E.unknown_member_id)
    assert core.leave(("m", None), group="").error == E.invalid_group_id


def test_the_last_member_leaving_empties_the_group() -> None:
    core = Core()
    (member,) = core.stable_group("a")
    core.leave((member, None))
    assert core.core.groups["g"].state is GroupState.EMPTY


def test_a_pending_member_can_leave() -> None:
    core = Core()
    core.stable_group("a")
    pending = core.answer(core.join(client="b")).member_id
    assert core.leave((pending, None)).members == ((pending, None, E.none),)
    assert pending not in core.core.groups["g"].pending_join


# -- coordinator partitions ------------------------------------------------------------------


def test_groups_of_partitions_not_served_here_get_not_coordinator() -> None:
    core = Core(num_partitions=2)
    core.core.unload(1)
    group = next(g for g in ("g0", "g1", "g2", "g3") if core.core.partition_of(g) == 1)
    assert core.answer(core.join(group=group)).error == E.not_coordinator
    core.core.begin_load(1)
    assert core.answer(core.join(group=group)).error == E.coordinator_load_in_progress
    assert core.heartbeat("m", 1, group=group) == E.coordinator_load_in_progress
