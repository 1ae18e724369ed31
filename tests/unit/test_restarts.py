"""The restart verdict's rules (`broker.restarts`), case by case and over random clusters: a set
of nodes the verdict lets stop never takes a partition below `min.insync.replicas` nor away
from its last in-sync replica, nor the quorum below a caught-up majority; and what blocks a
set blocks every larger one (what parallel restarts in batches will rely on)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.restarts import (
    PartitionView,
    QuorumView,
    caught_up_voters,
    partitions_at_risk,
    quorum_at_risk,
    verdict,
)


def view(replicas: tuple[int, ...], isr: tuple[int, ...], min_isr: int = 2) -> PartitionView:
    return PartitionView("t", 0, replicas, isr, min_isr)


def rules(partition: PartitionView, *stopping: int) -> list[str]:
    return [found.rule for found in partitions_at_risk([partition], stopping)]


def test_a_partition_with_no_replica_among_the_stopping_nodes_never_blocks() -> None:
    assert rules(view((1, 2, 3), (1,)), 4) == []


def test_one_in_sync_replica_of_three_may_stop_with_min_isr_two() -> None:
    assert rules(view((1, 2, 3), (1, 2, 3)), 1) == []


def test_the_last_in_sync_replica_above_min_isr_may_not_stop() -> None:
    assert rules(view((1, 2, 3), (1, 2)), 1) == ["P3"]


def test_a_replica_of_a_partition_already_below_min_isr_may_not_stop_even_out_of_sync() -> None:
    assert rules(view((1, 2, 3), (1,)), 3) == ["P2"]


def test_the_only_in_sync_replica_may_not_stop_while_others_could_catch_up() -> None:
    assert rules(view((1, 2), (1,), min_isr=1), 1) == ["P1"]
    assert rules(view((1, 2), (1, 2), min_isr=2), 1, 2) == ["P1"]


def test_partitions_that_no_restart_can_keep_writable_never_block() -> None:
    """RF 1, and RF ≤ min ISR (acks=all is refused through any restart of theirs): blocking
    would stall every roll and gain nothing."""
    assert rules(view((1,), (1,), min_isr=1), 1) == []
    assert rules(view((1, 2), (1, 2), min_isr=2), 1) == []
    assert rules(view((1, 2), (2,), min_isr=2), 1) == []


def test_an_empty_isr_is_held_only_by_min_isr() -> None:
    assert rules(view((1, 2, 3), ()), 1) == ["P2"]
    assert rules(view((1, 2), (), min_isr=2), 1) == []


def test_two_in_sync_replicas_of_three_may_not_stop_together() -> None:
    assert rules(view((1, 2, 3), (1, 2, 3)), 1, 2) == ["P3"]


def quorum(voters: int, caught_up: set[int], leader: int = 1) -> QuorumView:
    return QuorumView(leader, leader, tuple(range(1, voters + 1)), frozenset(caught_up))


def test_one_voter_of_three_may_stop_while_the_other_two_are_caught_up() -> None:
    assert quorum_at_risk(quorum(3, {1, 2, 3}), [3]) is None
    assert quorum_at_risk(quorum(3, {1, 2, 3}), [1]) is None


def test_a_voter_may_not_stop_while_another_lags() -> None:
    said = quorum_at_risk(quorum(3, {1, 2}), [2])
    assert said == "1 caught-up voter(s) would stay (1), a majority of 3 is 2; not caught up: 3"


def test_a_quorum_no_wait_can_keep_up_blocks_only_while_the_other_voter_lags() -> None:
    assert quorum_at_risk(quorum(1, {1}), [1]) is None
    assert quorum_at_risk(quorum(2, {1, 2}), [2]) is None
    assert quorum_at_risk(quorum(2, {1}), [1]) is not None


def test_caught_up_means_at_the_high_watermark_at_a_recent_fetch() -> None:
    progress = {1: (100, -1), 2: (100, 9_000), 3: (100, 7_000), 4: (90, 9_500)}
    found = caught_up_voters(
        progress, leader=1, high_watermark=100, now_ms=10_000, fetch_timeout_ms=2_000
    )
    assert found == {1, 2}


def test_a_follower_gives_no_quorum_verdict_and_so_no_safe_one_for_a_voter() -> None:
    follower = QuorumView(2, 1, (1, 2, 3), frozenset())
    answer = verdict(lambda: [], follower, [3])
    assert answer["safe"] is False
    assert answer["quorum"]["judged"] is False
    assert answer["quorum"]["leader"] == 1
    assert verdict(lambda: [], follower, [7])["safe"] is True  # a broker-only node


# -- over random clusters ---------------------------------------------------------------------

NODES = 6


@st.composite
def partitions(draw: st.DrawFn) -> PartitionView:
    rf = draw(st.integers(1, 4))
    replicas = tuple(draw(st.permutations(range(1, NODES + 1)))[:rf])
    isr = tuple(r for r in replicas if draw(st.booleans()))
    return PartitionView("t", draw(st.integers(0, 9)), replicas, isr, draw(st.integers(1, 3)))


stopping_sets = st.sets(st.integers(1, NODES), min_size=1, max_size=NODES)


@given(st.lists(partitions(), max_size=20), stopping_sets)
def test_a_set_the_verdict_allows_costs_no_partition_its_availability(
    views: list[PartitionView], stopping: set[int]
) -> None:
    if partitions_at_risk(views, stopping):
        return
    for p in views:
        if stopping.isdisjoint(p.replicas):
            continue
        staying = [r for r in p.isr if r not in stopping]
        if len(p.replicas) > 1 and p.isr:
            assert staying, p  # never the last in-sync replica
        if len(p.replicas) > p.min_isr:
            assert len(staying) >= p.min_isr, p  # never below min ISR


@given(st.lists(partitions(), max_size=20), stopping_sets, stopping_sets)
def test_what_blocks_a_set_blocks_every_larger_set(
    views: list[PartitionView], stopping: set[int], more: set[int]
) -> None:
    if partitions_at_risk(views, stopping):
        assert partitions_at_risk(views, stopping | more)


@given(
    st.integers(1, 5).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.sets(st.integers(1, n)),
            st.sets(st.integers(1, n), min_size=1),
        )
    )
)
def test_a_voter_set_the_verdict_allows_leaves_a_caught_up_majority(
    drawn: tuple[int, set[int], set[int]],
) -> None:
    voters, caught_up, stopping = drawn
    view = quorum(voters, caught_up)
    if quorum_at_risk(view, stopping) is None:
        staying = caught_up - stopping
        one_of_two = voters <= 2 and len(stopping) == 1
        others = set(range(1, voters + 1)) - stopping
        assert len(staying) > voters // 2 or (one_of_two and staying == others)
