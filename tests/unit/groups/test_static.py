"""Static membership (KIP-345): a group.instance.id keeps its place across restarts."""

from __future__ import annotations

from broker.groups import GroupState, JoinResult, SyncResult
from broker.groups.records import decode_group_metadata_value
from broker.protocol import ErrorCode as E

from .harness import Core


def static_group(core: Core, *instances: str, **kwargs: object) -> list[str]:
    tickets = [core.join(instance=i, client=i, **kwargs) for i in instances]  # type: ignore[arg-type]
    core.advance(0)
    answers = [core.answer(t) for t in tickets]
    ids = [a.member_id for a in answers]
    generation = answers[0].generation_id
    core.sync(
        ids[0], generation, assignments=tuple((m, m.encode()) for m in ids), instance=instances[0]
    )
    for member_id, instance in zip(ids[1:], instances[1:], strict=True):
        core.sync(member_id, generation, instance=instance)
    core.drain()
    core.answers.clear()
    return ids


def test_a_static_member_joins_without_member_id_required() -> None:
    core = Core()
    ticket = core.join(instance="i-1", version=5)
    core.advance(0)
    answer = core.answer(ticket)
    assert (answer.error, answer.member_id) == (E.none, "i-1-id1")


def test_a_restarted_static_member_takes_over_without_a_rebalance() -> None:
    core = Core()
    leader, follower = static_group(core, "i-1", "i-2")
    core.records.clear()
    answer = core.answer(core.join(instance="i-2", client="i-2"))
    assert answer.error == E.none
    assert answer.generation_id == 1  # no rebalance
    assert answer.member_id != follower
    assert core.core.groups["g"].state is GroupState.STABLE
    # The new member id is in the log before the member hears of it.
    ((_, _, value),) = core.records
    assert value is not None
    stored = decode_group_metadata_value(value)
    assert answer.member_id in {m.member_id for m in stored.members}
    # It keeps its assignment; the old id is fenced.
    assert (
        core.answer(core.sync(answer.member_id, 1, instance="i-2")).assignment == follower.encode()
    )
    assert core.heartbeat(follower, 1, instance="i-2") == E.fenced_instance_id
    assert core.heartbeat(leader, 1, instance="i-1") == E.none


def test_the_fenced_member_parked_join_is_answered_fenced_instance_id() -> None:
    core = Core()
    leader, follower = static_group(core, "i-1", "i-2")
    core.join(leader, instance="i-1", client="i-1")  # the leader starts a rebalance
    parked = core.join(follower, instance="i-2", client="i-2")
    assert core.answer(parked) is not None  # all rejoined: generation 2
    follower_sync = core.sync(follower, 2, instance="i-2")
    assert core.answer(follower_sync) is None  # waits for the leader's assignment
    # A second process with the same instance id appears while the first awaits its sync.
    core.join(instance="i-2", client="i-2")
    assert core.answer(follower_sync) == SyncResult(error=E.fenced_instance_id)


def test_a_static_leader_rejoining_is_told_to_skip_the_assignment_from_v9() -> None:
    core = Core()
    _, follower = static_group(core, "i-1", "i-2")
    answer = core.answer(core.join(instance="i-1", client="i-1", version=9))
    assert answer.skip_assignment
    assert answer.leader == answer.member_id
    assert {m.member_id for m in answer.members} == {answer.member_id, follower}


def test_before_v9_a_static_leader_rejoining_is_told_the_old_leader_id() -> None:
    core = Core()
    leader, _ = static_group(core, "i-1", "i-2")
    answer = core.answer(core.join(instance="i-1", client="i-1", version=8))
    assert (answer.leader, answer.members, answer.skip_assignment) == (leader, (), False)


def test_a_static_member_with_a_stale_member_id_is_fenced() -> None:
    core = Core()
    _, follower = static_group(core, "i-1", "i-2")
    answer = core.answer(core.join("i-2-old", instance="i-2", client="i-2"))
    assert answer == JoinResult(error=E.fenced_instance_id, member_id="i-2-old")
    answer = core.answer(core.join(follower, instance="i-9", client="i-2"))
    assert answer.error == E.unknown_member_id


def test_static_members_that_miss_a_rebalance_stay_but_dynamic_ones_go() -> None:
    core = Core()
    tickets = [core.join(instance="s", client="s"), core.join(version=3, client="d")]
    core.advance(0)
    static_id, dynamic_id = (core.answer(t).member_id for t in tickets)
    leader = core.core.groups["g"].leader_id
    assert leader == static_id
    core.sync(static_id, 1, instance="s", assignments=())
    core.sync(dynamic_id, 1)
    # A third member joins; neither old member rejoins before the rebalance timeout.
    newcomer = core.join(version=3, client="n", rebalance=30_000)
    for _ in range(6):
        assert core.heartbeat(static_id, 1, instance="s") == E.rebalance_in_progress
        assert core.heartbeat(dynamic_id, 1) == E.rebalance_in_progress
        core.advance(5_000)
    members = core.core.groups["g"].members
    assert static_id in members
    assert dynamic_id not in members
    assert core.answer(newcomer).generation_id == 2


def test_a_static_member_leaves_by_instance_id_alone() -> None:
    core = Core()
    _, follower = static_group(core, "i-1", "i-2")
    result = core.leave(("", "i-2"))
    assert result.members == (("", "i-2", E.none),)
    assert follower not in core.core.groups["g"].members
    assert core.leave(("", "i-9")).members == (("", "i-9", E.unknown_member_id),)
    assert core.leave(("wrong", "i-1")).members == (("wrong", "i-1", E.fenced_instance_id),)


def test_a_static_member_whose_session_expires_is_removed() -> None:
    core = Core()
    leader, follower = static_group(core, "i-1", "i-2", session=10_000)
    core.advance(6_000)
    core.heartbeat(leader, 1, instance="i-1")
    core.advance(4_000)
    assert follower not in core.core.groups["g"].members
    assert "i-2" not in core.core.groups["g"].static_members
