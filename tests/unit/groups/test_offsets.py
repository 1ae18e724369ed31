"""Committed offsets and the administrative group APIs in the pure coordinator."""

from __future__ import annotations

from broker.groups import (
    CommitOffset,
    GroupState,
    ListedGroup,
    OffsetCommitRequest,
    OffsetDeleteRequest,
)
from broker.groups.records import (
    OffsetCommitValue,
    decode_key,
    decode_offset_commit_value,
    encode_offset_commit_key,
)
from broker.protocol import ErrorCode as E

from .harness import Core, subscription

DAY = 24 * 3600 * 1000


def simple_commit(
    *offsets: CommitOffset, group: str = "g", retention: int = -1
) -> OffsetCommitRequest:
    return OffsetCommitRequest(group_id=group, retention_time_ms=retention, offsets=offsets)


def member_commit(
    member_id: str, generation: int, *offsets: CommitOffset, instance: str | None = None
) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id="g",
        member_id=member_id,
        generation_id=generation,
        group_instance_id=instance,
        offsets=offsets,
    )


def consumer(*topics: str) -> tuple[tuple[str, bytes], ...]:
    return (("range", subscription(*topics)),)


# -- OffsetCommit ----------------------------------------------------------------------------


def test_a_simple_consumer_commits_without_a_group_and_reads_it_back() -> None:
    core = Core()
    result = core.commit(
        simple_commit(CommitOffset("t", 0, 42, 3, "meta"), CommitOffset("t", 1, 7))
    )
    assert result.errors == ((("t", 0), E.none), (("t", 1), E.none))
    ((_, _, value),) = [r for r in core.records if r[1] == encode_offset_commit_key("g", "t", 0)]
    assert value is not None
    assert decode_offset_commit_value(value) == OffsetCommitValue(42, "meta", core.now, 3)
    fetched = core.core.fetch_offsets("g", [("t", 0), ("t", 1), ("t", 2)])
    assert [(o.partition, o.offset, o.leader_epoch, o.metadata) for o in fetched.offsets] == [
        (0, 42, 3, "meta"),
        (1, 7, -1, ""),
        (2, -1, -1, ""),
    ]


def test_fetch_of_all_partitions_and_of_an_unknown_group() -> None:
    core = Core()
    core.commit(simple_commit(CommitOffset("b", 0, 1), CommitOffset("a", 1, 2)))
    every = core.core.fetch_offsets("g", None)
    assert [(o.topic, o.partition, o.offset) for o in every.offsets] == [("a", 1, 2), ("b", 0, 1)]
    assert core.core.fetch_offsets("other", None).offsets == ()
    (unknown,) = core.core.fetch_offsets("other", [("a", 0)]).offsets
    assert (unknown.offset, unknown.error) == (-1, E.none)


def test_group_members_commit_with_their_generation() -> None:
    core = Core()
    leader, _ = core.stable_group("a", "b")
    ok = core.commit(member_commit(leader, 1, CommitOffset("t", 0, 5)))
    assert ok.errors == ((("t", 0), E.none),)
    assert core.commit(member_commit(leader, 0, CommitOffset("t", 0, 6))).errors[0][1] == (
        E.illegal_generation
    )
    assert core.commit(member_commit("ghost", 1, CommitOffset("t", 0, 6))).errors[0][1] == (
        E.unknown_member_id
    )
    # A plain commit while the group has members is refused.
    assert core.commit(simple_commit(CommitOffset("t", 0, 6))).errors[0][1] == E.unknown_member_id
    assert core.core.fetch_offsets("g", [("t", 0)]).offsets[0].offset == 5


def test_commit_with_a_generation_to_an_unknown_group_is_illegal_generation() -> None:
    core = Core()
    result = core.commit(member_commit("m", 3, CommitOffset("t", 0, 1)))
    assert result.errors == ((("t", 0), E.illegal_generation),)
    assert "g" not in core.core.groups


def test_commit_while_the_group_awaits_its_assignment_is_rebalance_in_progress() -> None:
    core = Core()
    member = core.join_new("a")
    core.advance(0)
    result = core.commit(member_commit(member, 1, CommitOffset("t", 0, 1)))
    assert result.errors == ((("t", 0), E.rebalance_in_progress),)


def test_a_fenced_static_member_cannot_commit() -> None:
    core = Core()
    ticket = core.join(instance="i", client="i")
    core.advance(0)
    member = core.answer(ticket).member_id
    core.sync(member, 1, instance="i", assignments=((member, b"x"),))
    result = core.commit(member_commit("stale", 1, CommitOffset("t", 0, 1), instance="i"))
    assert result.errors == ((("t", 0), E.fenced_instance_id),)
    ok = core.commit(member_commit(member, 1, CommitOffset("t", 0, 1), instance="i"))
    assert ok.errors == ((("t", 0), E.none),)


def test_metadata_over_the_limit_fails_only_its_partition() -> None:
    core = Core(offset_metadata_max_bytes=4)
    result = core.commit(
        simple_commit(CommitOffset("t", 0, 1, -1, "12345"), CommitOffset("t", 1, 1, -1, "1234"))
    )
    assert result.errors == ((("t", 0), E.offset_metadata_too_large), (("t", 1), E.none))
    assert core.core.fetch_offsets("g", [("t", 0)]).offsets[0].offset == -1


# -- OffsetDelete ----------------------------------------------------------------------------


def test_offset_delete_refuses_topics_the_group_consumes() -> None:
    core = Core()
    (member,) = core.stable_group("a", protocols=consumer("orders"))
    core.commit(member_commit(member, 1, CommitOffset("orders", 0, 1), CommitOffset("old", 0, 1)))
    core.records.clear()
    ticket = core.core.delete_offsets(
        OffsetDeleteRequest(group_id="g", partitions=(("orders", 0), ("old", 0), ("never", 0))),
        core.now,
    )
    core.drain()
    result = core.answer(ticket)
    assert result.error == E.none
    assert result.errors == (
        (("orders", 0), E.group_subscribed_to_topic),
        (("old", 0), E.none),
        (("never", 0), E.none),
    )
    assert core.records == [(0, encode_offset_commit_key("g", "old", 0), None)]
    assert [o.topic for o in core.core.fetch_offsets("g", None).offsets] == ["orders"]


def test_offset_delete_errors() -> None:
    core = Core()
    ticket = core.core.delete_offsets(OffsetDeleteRequest(group_id="nope", partitions=()), core.now)
    core.drain()
    assert core.answer(ticket).error == E.group_id_not_found
    core.stable_group("a", protocol_type="connect")
    ticket = core.core.delete_offsets(
        OffsetDeleteRequest(group_id="g", partitions=(("t", 0),)), core.now
    )
    core.drain()
    assert core.answer(ticket).error == E.non_empty_group


# -- DescribeGroups, ListGroups, DeleteGroups -------------------------------------------------


def test_describe_a_stable_group_and_an_unknown_one() -> None:
    core = Core()
    leader, follower = core.stable_group("a", "b")
    described, unknown, invalid = core.core.describe_groups(["g", "nope", ""])
    assert (described.state, described.protocol_type, described.protocol) == (
        "Stable",
        "consumer",
        "range",
    )
    assert [
        (m.member_id, m.client_id, m.client_host, m.metadata, m.assignment)
        for m in described.members
    ] == [
        (leader, "a", "/127.0.0.1", b"r-meta", f"a-{leader}".encode()),
        (follower, "b", "/127.0.0.1", b"r-meta", f"a-{follower}".encode()),
    ]
    assert (unknown.error, unknown.state, unknown.members) == (E.group_id_not_found, "Dead", ())
    assert invalid.error == E.invalid_group_id


def test_describe_a_rebalancing_group_hides_metadata() -> None:
    core = Core()
    leader, _ = core.stable_group("a", "b")
    core.join(leader, client="a")
    (described,) = core.core.describe_groups(["g"])
    assert (described.state, described.protocol) == ("PreparingRebalance", "")
    assert {m.metadata for m in described.members} == {b""}


def test_list_groups_filters_by_state_and_type() -> None:
    core = Core()
    core.stable_group("a", group="busy")
    core.commit(simple_commit(CommitOffset("t", 0, 1), group="simple"))
    everything = core.core.list_groups()
    assert set(everything.groups) == {
        ListedGroup("busy", "consumer", "Stable"),
        ListedGroup("simple", "", "Empty"),
    }
    assert [g.group_id for g in core.core.list_groups(states=["stable"]).groups] == ["busy"]
    assert core.core.list_groups(types=["consumer"]).groups == ()
    assert len(core.core.list_groups(types=["Classic"]).groups) == 2


def test_delete_groups_writes_tombstones_for_the_group_and_its_offsets() -> None:
    core = Core()
    core.commit(simple_commit(CommitOffset("t", 0, 1), CommitOffset("t", 1, 2)))
    core.stable_group("a", group="busy")
    core.records.clear()
    ticket = core.core.delete_groups(["g", "busy", "nope", ""], core.now)
    core.drain()
    assert core.answer(ticket).results == (
        ("g", E.none),
        ("busy", E.non_empty_group),
        ("nope", E.group_id_not_found),
        ("", E.invalid_group_id),
    )
    assert [(decode_key(k), v) for _, k, v in core.records] == [
        (("g", "t", 0), None),
        (("g", "t", 1), None),
        (("g",), None),
    ]
    assert "g" not in core.core.groups
    assert core.core.fetch_offsets("g", None).offsets == ()


# -- offset expiry ----------------------------------------------------------------------------


def test_offsets_of_an_empty_group_expire_after_retention_since_it_emptied() -> None:
    core = Core(offsets_retention_ms=7 * DAY, offsets_retention_check_interval_ms=600_000)
    (member,) = core.stable_group("a", protocols=consumer("t"))
    core.commit(member_commit(member, 1, CommitOffset("t", 0, 1)))
    core.advance(30 * DAY)  # a stable group that consumes the topic keeps its offsets
    assert core.core.fetch_offsets("g", [("t", 0)]).offsets[0].offset == 1
    core.heartbeat(member, 1)  # (the member's session long expired: it is gone)
    group = core.core.groups["g"]
    assert group.state is GroupState.EMPTY
    emptied = group.state_timestamp
    assert emptied is not None
    core.records.clear()
    core.advance(7 * DAY - (core.now - emptied) - 600_000)
    assert "g" in core.core.groups
    core.advance(600_000)
    assert "g" not in core.core.groups
    assert [(decode_key(k), v) for _, k, v in core.records] == [
        (("g", "t", 0), None),
        (("g",), None),
    ]


def test_simple_consumer_offsets_expire_per_commit() -> None:
    core = Core(offsets_retention_ms=DAY, offsets_retention_check_interval_ms=3_600_000)
    core.commit(simple_commit(CommitOffset("t", 0, 1)))
    core.advance(12 * 3_600_000)
    core.commit(simple_commit(CommitOffset("t", 1, 1)))
    core.advance(12 * 3_600_000)
    assert [o.partition for o in core.core.fetch_offsets("g", None).offsets] == [1]
    core.advance(12 * 3_600_000)
    assert "g" not in core.core.groups


def test_a_commit_with_its_own_retention_expires_at_its_time() -> None:
    core = Core(offsets_retention_ms=30 * DAY, offsets_retention_check_interval_ms=60_000)
    core.commit(simple_commit(CommitOffset("t", 0, 1), retention=120_000))
    core.advance(60_000)
    assert core.core.fetch_offsets("g", [("t", 0)]).offsets[0].offset == 1
    core.advance(60_000)
    assert core.core.fetch_offsets("g", [("t", 0)]).offsets[0].offset == -1


def test_a_stable_group_expires_offsets_of_topics_it_no_longer_consumes() -> None:
    core = Core(offsets_retention_ms=DAY, offsets_retention_check_interval_ms=3_600_000)
    (member,) = core.stable_group("a", protocols=consumer("new"), session=1_800_000)
    core.commit(member_commit(member, 1, CommitOffset("new", 0, 1), CommitOffset("old", 0, 1)))
    for _ in range(75):  # 25 hours, heartbeating every 20 minutes
        core.advance(1_200_000)
        assert core.heartbeat(member, 1) == E.none
    assert [o.topic for o in core.core.fetch_offsets("g", None).offsets] == ["new"]
