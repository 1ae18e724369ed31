"""Leaders and ISRs as brokers come and go (the active controller's decisions): a fenced broker
or one shutting down leads nothing and leaves every ISR, its partitions led by the next in-sync
replica; the last in-sync replica stays, leaderless, and leads again when its broker returns.
A leader changes its ISR with AlterPartition, checked as Kafka checks it."""

from __future__ import annotations

from broker.metadata.brokers import Heartbeat, fence, heartbeat
from broker.metadata.controller import QuorumController, TopicRequest
from broker.metadata.elections import IsrChange, alter_isr
from broker.metadata.image import PartitionState
from broker.protocol import ErrorCode
from tests.unit.metadata.test_brokers import Cluster


def _cluster(brokers: int = 3) -> Cluster:
    cluster = Cluster()
    for broker_id in range(1, brokers + 1):
        epoch = cluster.register(broker_id, now=0)
        cluster.commit(
            heartbeat(
                cluster.image, cluster.sessions, Heartbeat(broker_id, epoch, epoch), now_ms=0
            )[0]
        )
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
        assert state.isr == (1,)  # broker 1 was the last to have every committed record

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
