"""Leaders and ISRs as brokers come and go (the active controller's decisions): a fenced broker
or one shutting down leads nothing and leaves every ISR, its partitions led by the next in-sync
replica; the last in-sync replica becomes an eligible leader replica (KIP-966) of a leaderless
partition, and leads again when its broker returns. Below `min.insync.replicas` the replicas
that leave the ISR are eligible leaders; one that may have lost records (an unclean shutdown,
a replaced disk) is not.
A leader changes its ISR with AlterPartition, checked as Kafka checks it. Preferred elections
(asked for with ElectLeaders, or the controller's rebalance) give a partition back to its first
replica once it is in sync; unclean ones give a leaderless partition any live replica."""

from __future__ import annotations

import uuid

from broker.metadata.brokers import Heartbeat, Registration, fence, heartbeat, register
from broker.metadata.controller import QuorumController, TopicRequest
from broker.metadata.elections import (
    MAX_ELECTIONS_PER_REBALANCE,
    PREFERRED,
    UNCLEAN,
    IsrChange,
    alter_isr,
    elect_leaders,
    elect_returning,
    elect_unclean,
    imbalanced,
    rebalance,
)
from broker.metadata.image import PartitionState
from broker.protocol import ErrorCode
from tests.unit.metadata.test_brokers import CLUSTER, LISTENERS, Cluster


def _cluster(brokers: int = 3) -> Cluster:
    cluster = Cluster()
    for broker_id in range(1, brokers + 1):
        cluster.register_live(broker_id)
    controller = QuorumController(cluster.image, num_partitions=3, replication_factor=3)
    records, results = controller.create_topics([TopicRequest("t", replication_factor=3)])
    assert results[0].error == 0
    cluster.commit(records)
    return cluster


def _partitions(cluster: Cluster) -> dict[int, PartitionState]:
    return dict(cluster.image.topics["t"].partitions)


def _heartbeat(cluster: Cluster, broker_id: int, **wants: bool) -> None:
    epoch = cluster.image.brokers[broker_id].epoch
    records, _ = heartbeat(
        cluster.image,
        cluster.sessions,
        Heartbeat(broker_id, epoch, cluster.next_offset, **wants),
        now_ms=0,
    )
    cluster.commit(records)


def test_a_fenced_brokers_partitions_get_the_next_in_sync_replica_as_leader() -> None:
    cluster = _cluster()
    before = _partitions(cluster)
    led_by_one = [p for p, state in before.items() if state.leader == 1]
    assert led_by_one

    cluster.commit(fence(cluster.image, [1]))

    after = _partitions(cluster)
    for index, state in after.items():
        assert 1 not in state.isr
        assert state.leader != 1
        assert state.leader in state.isr
        old = before[index]
        if index in led_by_one:
            # The first of the replicas, in assignment order, still in sync; a new epoch.
            assert state.leader == next(r for r in old.replicas if r != 1)
            assert state.leader_epoch == old.leader_epoch + 1
        else:
            assert (state.leader, state.leader_epoch) == (old.leader, old.leader_epoch)
        assert state.partition_epoch == old.partition_epoch + 1


def test_a_controlled_shutdown_moves_leaderships_before_it_is_let_go() -> None:
    cluster = _cluster()
    _heartbeat(cluster, 2, want_shut_down=True)
    for state in _partitions(cluster).values():
        assert state.leader != 2
        assert 2 not in state.isr


def test_the_last_in_sync_replica_stays_leaderless_and_leads_again_when_back() -> None:
    cluster = _cluster()
    cluster.commit(fence(cluster.image, [2]))
    cluster.commit(fence(cluster.image, [3]))
    cluster.commit(fence(cluster.image, [1]))
    for state in _partitions(cluster).values():
        assert state.leader == -1
        # Broker 1 was the last to have every committed record: the ISR is empty and it is
        # the partition's eligible leader replica, as in Kafka 4.1+.
        assert (state.isr, state.elr) == ((), (1,))

    # Broker 3 returns first: it is not in sync, so it is not elected (no unclean election).
    _heartbeat(cluster, 3)
    assert all(state.leader == -1 for state in _partitions(cluster).values())
    _heartbeat(cluster, 1)
    assert all(state.leader == 1 for state in _partitions(cluster).values())


def test_fencing_two_brokers_at_once_elects_the_third() -> None:
    cluster = _cluster()
    cluster.commit(fence(cluster.image, [1, 2]))
    for state in _partitions(cluster).values():
        assert (state.leader, state.isr) == (3, (3,))


def _isr_change(
    cluster: Cluster, index: int, members: tuple[int, ...], **overrides: int
) -> IsrChange:
    state = _partitions(cluster)[index]
    epochs = {b: cluster.image.brokers[b].epoch for b in members}
    return IsrChange(
        cluster.image.topics["t"].topic_id,
        index,
        overrides.get("leader_epoch", state.leader_epoch),
        overrides.get("partition_epoch", state.partition_epoch),
        tuple((b, overrides.get("member_epoch", epochs[b])) for b in members),
    )


def test_a_leader_shrinks_and_grows_its_isr() -> None:
    cluster = _cluster()
    state = _partitions(cluster)[0]
    leader = state.leader
    epoch = cluster.image.brokers[leader].epoch
    follower = next(r for r in state.replicas if r != leader)
    smaller = tuple(r for r in state.isr if r != follower)

    records, error, [answer] = alter_isr(
        cluster.image, leader, epoch, [_isr_change(cluster, 0, smaller)]
    )
    assert (error, answer.error, answer.isr) == (ErrorCode.none, ErrorCode.none, smaller)
    assert answer.partition_epoch == state.partition_epoch + 1
    cluster.commit(records)
    assert _partitions(cluster)[0].isr == smaller
    assert _partitions(cluster)[0].leader_epoch == state.leader_epoch  # the leader stays

    records, _, [answer] = alter_isr(
        cluster.image, leader, epoch, [_isr_change(cluster, 0, (*smaller, follower))]
    )
    cluster.commit(records)
    assert set(_partitions(cluster)[0].isr) == set(state.replicas)


def test_an_isr_change_is_refused_when_stale_or_not_from_the_leader() -> None:
    cluster = _cluster()
    state = _partitions(cluster)[0]
    leader = state.leader
    epoch = cluster.image.brokers[leader].epoch
    other = next(r for r in state.replicas if r != leader)
    shrink = tuple(r for r in state.isr if r != other)

    def answer(broker: int, broker_epoch: int, change: IsrChange) -> ErrorCode:
        records, error, answers = alter_isr(cluster.image, broker, broker_epoch, [change])
        assert records == [] or answers[0].error == ErrorCode.none
        return error if error != ErrorCode.none else answers[0].error

    assert answer(leader, epoch + 1, _isr_change(cluster, 0, shrink)) == (
        ErrorCode.stale_broker_epoch
    )
    other_epoch = cluster.image.brokers[other].epoch
    assert answer(other, other_epoch, _isr_change(cluster, 0, (other,))) == (
        ErrorCode.invalid_request
    )
    old_epoch = _isr_change(cluster, 0, shrink, leader_epoch=state.leader_epoch - 1)
    assert answer(leader, epoch, old_epoch) == ErrorCode.fenced_leader_epoch
    stale = _isr_change(cluster, 0, shrink, partition_epoch=state.partition_epoch - 1)
    assert answer(leader, epoch, stale) == ErrorCode.invalid_update_version
    assert answer(leader, epoch, _isr_change(cluster, 0, (other,))) == ErrorCode.invalid_request


def test_a_fenced_broker_cannot_join_an_isr() -> None:
    cluster = _cluster()
    state = _partitions(cluster)[0]
    leader = state.leader
    other = next(r for r in state.replicas if r != leader)
    cluster.commit(fence(cluster.image, [other]))
    state = _partitions(cluster)[0]
    epoch = cluster.image.brokers[leader].epoch
    grow = _isr_change(cluster, 0, (*state.isr, other))
    _, _, [answer] = alter_isr(cluster.image, leader, epoch, [grow])
    assert answer.error == ErrorCode.ineligible_replica


def _back_in_sync(cluster: Cluster, broker_id: int) -> None:
    """Broker `broker_id` returns (unfenced) and every leader adds it to its ISR again."""
    _heartbeat(cluster, broker_id)
    for index, state in _partitions(cluster).items():
        if broker_id in state.isr or state.leader < 0:
            continue
        leader_epoch = cluster.image.brokers[state.leader].epoch
        change = _isr_change(cluster, index, (*state.isr, broker_id))
        records, _, [answer] = alter_isr(cluster.image, state.leader, leader_epoch, [change])
        assert answer.error == ErrorCode.none
        cluster.commit(records)


def test_a_preferred_election_gives_partitions_back_to_their_first_replica() -> None:
    cluster = _cluster()
    preferred = {i: s.replicas[0] for i, s in _partitions(cluster).items()}
    assert all(s.leader == preferred[i] for i, s in _partitions(cluster).items())
    cluster.commit(fence(cluster.image, [1]))
    moved = [i for i, s in _partitions(cluster).items() if preferred[i] == 1]
    assert moved
    assert all(_partitions(cluster)[i].leader != 1 for i in moved)

    # Back, but not yet in sync: its partitions cannot have it yet.
    _heartbeat(cluster, 1)
    records, results = elect_leaders(cluster.image, PREFERRED, [("t", moved)])
    assert records == []
    assert {r.error for r in results} == {ErrorCode.preferred_leader_not_available}
    assert all("not in the ISR" in (r.message or "") for r in results)
    assert imbalanced(cluster.image) == []

    _back_in_sync(cluster, 1)
    assert imbalanced(cluster.image) == [("t", moved)]
    before = _partitions(cluster)
    records, results = elect_leaders(cluster.image, PREFERRED, [("t", [0, 1, 2])])
    cluster.commit(records)
    after = _partitions(cluster)
    for result in results:
        index = result.partition
        if index in moved:
            assert result.error == ErrorCode.none
            assert after[index].leader == 1
            assert after[index].leader_epoch == before[index].leader_epoch + 1
            assert after[index].isr == before[index].isr
        else:
            assert result.error == ErrorCode.election_not_needed
            assert after[index] == before[index]
    assert imbalanced(cluster.image) == []


def test_electing_every_partition_reports_only_those_not_already_led_as_asked() -> None:
    cluster = _cluster()
    cluster.commit(fence(cluster.image, [2]))
    _back_in_sync(cluster, 2)
    records, results = elect_leaders(cluster.image, PREFERRED, None)
    led_by_two = [i for i, s in _partitions(cluster).items() if s.replicas[0] == 2]
    assert [(r.topic, r.partition, r.error) for r in results] == [
        ("t", i, ErrorCode.none) for i in led_by_two
    ]
    assert len(records) == len(led_by_two)


def test_unknown_partitions_and_a_dead_preferred_replica_are_named() -> None:
    cluster = _cluster()
    cluster.commit(fence(cluster.image, [3]))
    on_three = next(i for i, s in _partitions(cluster).items() if s.replicas[0] == 3)
    # Fenced: out of the ISR, so not available, whatever the ISR would say.
    _, results = elect_leaders(cluster.image, PREFERRED, [("t", [on_three, 7]), ("nope", [0])])
    assert [(r.topic, r.partition, r.error) for r in results] == [
        ("t", on_three, ErrorCode.preferred_leader_not_available),
        ("t", 7, ErrorCode.unknown_topic_or_partition),
        ("nope", 0, ErrorCode.unknown_topic_or_partition),
    ]
    assert results[1].message == "No such partition as t-7"


def test_an_unclean_election_gives_a_leaderless_partition_a_live_replica() -> None:
    cluster = _cluster()
    for broker_id in (2, 3, 1):
        cluster.commit(fence(cluster.image, [broker_id]))
    assert all(s.leader == -1 and s.elr == (1,) for s in _partitions(cluster).values())
    _, results = elect_leaders(cluster.image, UNCLEAN, [("t", [0])])
    assert results[0].error == ErrorCode.eligible_leaders_not_available

    _heartbeat(cluster, 3)  # not in sync: only an unclean election can pick it
    records, results = elect_leaders(cluster.image, UNCLEAN, [("t", [0, 1, 2])])
    assert {r.error for r in results} == {ErrorCode.none}
    cluster.commit(records)
    for state in _partitions(cluster).values():
        assert (state.leader, state.isr) == (3, (3,))
    _, results = elect_leaders(cluster.image, UNCLEAN, [("t", [0])])
    assert results[0].error == ErrorCode.election_not_needed


def test_a_rebalance_is_bounded_per_step() -> None:
    cluster = Cluster()
    for broker_id in (1, 2):
        epoch = cluster.register(broker_id, now=0)
        cluster.commit(
            heartbeat(
                cluster.image, cluster.sessions, Heartbeat(broker_id, epoch, epoch), now_ms=0
            )[0]
        )
    controller = QuorumController(cluster.image, num_partitions=1, replication_factor=2)
    count = 2 * MAX_ELECTIONS_PER_REBALANCE + 100  # half of them preferred on broker 1
    records, _ = controller.create_topics(
        [TopicRequest("many", num_partitions=count, replication_factor=2)]
    )
    cluster.commit(records)
    cluster.commit(fence(cluster.image, [1]))
    _heartbeat(cluster, 1)
    partitions = cluster.image.topics["many"].partitions
    for index, state in partitions.items():
        if 1 not in state.isr:
            epoch = cluster.image.brokers[state.leader].epoch
            change = IsrChange(
                cluster.image.topics["many"].topic_id,
                index,
                state.leader_epoch,
                state.partition_epoch,
                tuple((b, cluster.image.brokers[b].epoch) for b in (*state.isr, 1)),
            )
            cluster.commit(alter_isr(cluster.image, state.leader, epoch, [change])[0])
    waiting = sum(len(p) for _, p in imbalanced(cluster.image))
    assert waiting > MAX_ELECTIONS_PER_REBALANCE
    first = rebalance(cluster.image)
    assert len(first) == MAX_ELECTIONS_PER_REBALANCE
    cluster.commit(first)
    cluster.commit(rebalance(cluster.image))
    assert imbalanced(cluster.image) == []


def _allowed(topic: str) -> bool:
    return topic == "t"


def test_unclean_leader_election_enable_lets_an_out_of_sync_replica_lead() -> None:
    """Where the topic allows it: the last in-sync replica's fencing hands its partitions to
    a live replica out of the ISR (its ISR is cut to it), and a replica returning to a
    leaderless partition leads it at once; elsewhere they stay leaderless."""
    cluster = _cluster()
    cluster.commit(fence(cluster.image, [2]))
    cluster.commit(fence(cluster.image, [3]))
    _heartbeat(cluster, 3)  # back, out of every ISR
    cluster.commit(fence(cluster.image, [1], _allowed))
    for state in _partitions(cluster).values():
        assert (state.leader, state.isr) == (3, (3,))

    other = _cluster()
    other.commit(fence(other.image, [2]))
    other.commit(fence(other.image, [3]))
    other.commit(fence(other.image, [1], _allowed))
    assert all(s.leader == -1 and s.elr == (1,) for s in _partitions(other).values())
    _heartbeat(other, 2)  # unfenced without the rule: still leaderless
    assert all(s.leader == -1 for s in _partitions(other).values())
    records = elect_unclean(other.image, _allowed)
    other.commit(records)
    for state in _partitions(other).values():
        assert (state.leader, state.isr) == (2, (2,))
    assert elect_unclean(other.image, _allowed) == []


def test_a_returning_replica_leads_a_leaderless_partition_only_where_unclean_is_allowed() -> None:
    cluster = _cluster()
    for broker_id in (2, 3, 1):
        cluster.commit(fence(cluster.image, [broker_id]))
    assert elect_returning(cluster.image, 2) == []
    records = elect_returning(cluster.image, 2, _allowed)
    cluster.commit(records)
    for state in _partitions(cluster).values():
        assert (state.leader, state.isr) == (2, (2,))


def _min_isr_two(_topic: str) -> int:
    return 2


def _fence(cluster: Cluster, broker_id: int) -> None:
    """Its session ran out (it stopped): fenced, and a new process may register."""
    cluster.commit(fence(cluster.image, [broker_id], min_isr=_min_isr_two))
    cluster.sessions.end(broker_id)


def _return(
    cluster: Cluster,
    broker_id: int,
    *,
    clean: bool = True,
    log_dirs: tuple[uuid.UUID, ...] | None = None,
) -> None:
    """A new process of `broker_id` registers (after a clean stop, or not; with its old log
    dirs, or `log_dirs`), catches up and is unfenced."""
    old = cluster.image.registration(broker_id)
    assert old is not None
    request = Registration(
        broker_id,
        uuid.uuid4(),
        CLUSTER,
        LISTENERS,
        log_dirs=old.log_dirs if log_dirs is None else log_dirs,
        previous_broker_epoch=old.broker_epoch if clean else -1,
    )
    records, answer = register(
        cluster.image,
        cluster.sessions,
        request,
        cluster_id=CLUSTER,
        next_offset=cluster.next_offset,
        now_ms=0,
        min_isr=_min_isr_two,
    )
    assert answer.error == ErrorCode.none
    cluster.commit(records)
    beat = Heartbeat(broker_id, answer.broker_epoch, cluster.next_offset)
    cluster.commit(
        heartbeat(cluster.image, cluster.sessions, beat, now_ms=0, min_isr=_min_isr_two)[0]
    )


def test_below_min_isr_the_replicas_that_leave_are_eligible_leaders() -> None:
    cluster = _cluster()
    state = _partitions(cluster)[0]
    leader, second, third = state.leader, *[r for r in state.replicas if r != state.leader]
    _fence(cluster, third)
    assert (_partitions(cluster)[0].isr, _partitions(cluster)[0].elr) == (
        tuple(r for r in state.replicas if r != third),
        (),
    ), "the ISR still has min.insync.replicas members: no ELR"
    _fence(cluster, second)
    after = _partitions(cluster)[0]
    assert after.isr == (leader,)
    assert set(after.elr) == {second}, "it left an ISR below min.insync.replicas"
    _fence(cluster, leader)
    after = _partitions(cluster)[0]
    assert (after.leader, after.isr, set(after.elr)) == (-1, (), {leader, second})

    _return(cluster, second)  # an eligible leader: it has every committed record
    after = _partitions(cluster)[0]
    assert (after.leader, after.isr, after.elr) == (second, (second,), (leader,))


def test_a_replica_that_lost_its_disk_is_never_elected_and_the_eligible_one_is() -> None:
    """The review's reproduction: the follower stops, then the leader, the last in-sync
    replica; the leader's volume is replaced by an empty one. Kafka 4 elects the follower
    when it returns; the empty replica never leads."""
    cluster = _cluster()
    state = _partitions(cluster)[0]
    leader, follower, other = state.leader, *[r for r in state.replicas if r != state.leader]
    _fence(cluster, other)
    _fence(cluster, follower)
    _fence(cluster, leader)
    # A new, empty volume: no clean-shutdown marker, and a log dir of a new directory id.
    _return(cluster, leader, clean=False, log_dirs=(uuid.uuid4(),))
    after = _partitions(cluster)[0]
    assert after.leader == -1, "the replica with the new disk must not lead"
    assert leader not in after.elr
    _return(cluster, follower)
    after = _partitions(cluster)[0]
    assert (after.leader, after.isr) == (follower, (follower,))


def test_a_crashed_replica_leaves_the_elr_and_the_clean_one_leads() -> None:
    cluster = _cluster()
    state = _partitions(cluster)[0]
    leader, follower, other = state.leader, *[r for r in state.replicas if r != state.leader]
    _fence(cluster, other)
    _fence(cluster, follower)
    _fence(cluster, leader)
    _return(cluster, leader, clean=False)  # no clean-shutdown marker: it may have lost some
    assert _partitions(cluster)[0].leader == -1
    assert leader not in _partitions(cluster)[0].elr
    _return(cluster, follower)
    assert _partitions(cluster)[0].leader == follower


def test_with_no_eligible_replica_left_the_last_leader_leads_when_it_returns() -> None:
    """Kafka's balanced recovery: the ISR and ELR both empty (every eligible replica crashed),
    the last leader is elected when it comes back rather than leaving the partition without
    a leader for good."""
    cluster = _cluster()
    for broker_id in (1, 2, 3):
        _fence(cluster, broker_id)
    before = _partitions(cluster)[0]
    assert (before.leader, before.isr, before.last_known_elr) == (-1, (), (3,))
    for broker_id in (1, 2):
        _return(cluster, broker_id, clean=False)
        assert _partitions(cluster)[0].leader == -1, "broker 3 is still an eligible leader"
    _return(cluster, 3, clean=False)
    after = _partitions(cluster)[0]
    assert (after.leader, after.isr, after.elr, after.last_known_elr) == (3, (3,), (), ())


def test_back_at_min_isr_the_elr_is_cleared() -> None:
    cluster = _cluster()
    state = _partitions(cluster)[0]
    leader = state.leader
    followers = [r for r in state.replicas if r != leader]
    for follower in followers:
        _fence(cluster, follower)
    assert set(_partitions(cluster)[0].elr) == {followers[1]}
    _return(cluster, followers[0])
    grown = _isr_change(cluster, 0, (leader, followers[0]))
    epoch = cluster.image.brokers[leader].epoch
    records, error, _ = alter_isr(cluster.image, leader, epoch, [grown], _min_isr_two)
    assert error == ErrorCode.none
    cluster.commit(records)
    assert (_partitions(cluster)[0].isr, _partitions(cluster)[0].elr) == (
        (leader, followers[0])
        if state.replicas.index(leader) < state.replicas.index(followers[0])
        else (followers[0], leader),
        (),
    )


def test_a_log_dir_gone_since_the_last_registration_counts_as_lost_records() -> None:
    """KIP-858's signal on its own: the broker stopped cleanly, but one of the directories it
    registered with is not among its directories now."""
    cluster = _cluster()
    state = _partitions(cluster)[0]
    leader = state.leader
    other = next(r for r in reversed(state.replicas) if r != leader)
    disks = (uuid.uuid4(), uuid.uuid4())
    _fence(cluster, other)
    _return(cluster, other, log_dirs=disks)  # now registered with two directories
    back = _isr_change(cluster, 0, tuple(r for r in state.replicas))
    epoch = cluster.image.brokers[leader].epoch
    cluster.commit(alter_isr(cluster.image, leader, epoch, [back], _min_isr_two)[0])
    for broker_id in (r for r in state.replicas if r != other):
        _fence(cluster, broker_id)
    _fence(cluster, other)  # the last in sync: an eligible leader
    assert other in _partitions(cluster)[0].elr
    _return(cluster, other, log_dirs=disks[:1])
    after = _partitions(cluster)[0]
    assert other not in after.elr
    assert after.leader != other
