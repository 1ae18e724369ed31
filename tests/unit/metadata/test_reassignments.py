"""Partition reassignments as the active controller decides them (KIP-455): the new replicas
join first, the old ones leave once every replica of the target is in the ISR, the leader
moves if it was one of them; a cancel goes back; bad requests are refused partition by
partition with Kafka's errors and messages."""

from __future__ import annotations

import uuid

from broker.metadata.elections import IsrChange, alter_isr
from broker.metadata.image import MetadataImage, PartitionState
from broker.metadata.reassignments import Reassignment, alter_reassignments, ongoing
from broker.metadata.records import PartitionChangeRecord, PartitionRecord, TopicRecord
from broker.protocol import ErrorCode
from tests.unit.metadata.test_brokers import Cluster

TOPIC_ID = uuid.UUID(int=7)


def _cluster(brokers: int = 4, replicas: tuple[int, ...] = (1, 2, 3)) -> Cluster:
    cluster = Cluster()
    for broker_id in range(1, brokers + 1):
        cluster.register_live(broker_id)
    cluster.commit(
        [
            TopicRecord("t", TOPIC_ID),
            PartitionRecord(0, TOPIC_ID, replicas, replicas, replicas[0]),
            PartitionRecord(1, TOPIC_ID, replicas, replicas, replicas[0]),
        ]
    )
    return cluster


def _state(cluster: Cluster, index: int = 0) -> PartitionState:
    return cluster.image.topics["t"].partitions[index]


def _reassign(cluster: Cluster, *wanted: Reassignment) -> list[tuple[ErrorCode, str | None]]:
    records, results = alter_reassignments(cluster.image, list(wanted))
    cluster.commit(records)
    return [(result.error, result.message) for result in results]


def _join_isr(cluster: Cluster, member: int, index: int = 0) -> ErrorCode:
    """The partition's leader adds `member` to its ISR, as it does once `member` caught up."""
    state = _state(cluster, index)
    image = cluster.image
    change = IsrChange(
        TOPIC_ID,
        index,
        state.leader_epoch,
        state.partition_epoch,
        tuple((r, image.brokers[r].epoch) for r in (*state.isr, member)),
    )
    records, error, [answer] = alter_isr(
        image, state.leader, image.brokers[state.leader].epoch, [change]
    )
    assert error == ErrorCode.none
    cluster.commit(records)
    return answer.error


def test_new_replicas_join_first_and_the_old_leave_once_the_target_is_in_sync() -> None:
    cluster = _cluster()
    before = _state(cluster)

    assert _reassign(cluster, Reassignment("t", 0, (2, 3, 4))) == [(ErrorCode.none, None)]

    moving = _state(cluster)
    assert (moving.replicas, moving.adding, moving.removing) == ((2, 3, 4, 1), (4,), (1,))
    assert (moving.isr, moving.leader, moving.leader_epoch) == ((1, 2, 3), 1, before.leader_epoch)
    assert [(name, index) for name, index, _ in ongoing(cluster.image, None)] == [("t", 0)]
    assert ongoing(cluster.image, [("t", [1]), ("gone", [0])]) == []

    # The leader (1, which is being removed) adds 4 once it caught up: that completes the
    # reassignment, and the leadership moves to the first of the target in sync.
    assert _join_isr(cluster, 4) == ErrorCode.new_leader_elected
    done = _state(cluster)
    assert (done.replicas, done.isr, done.leader) == ((2, 3, 4), (2, 3, 4), 2)
    assert done.leader_epoch == before.leader_epoch + 1
    assert (done.adding, done.removing) == ((), ())
    assert ongoing(cluster.image, None) == []
    assert _state(cluster, 1) == before  # the other partition was not asked to move


def test_a_leader_that_stays_keeps_leading_and_is_answered_with_the_new_isr() -> None:
    cluster = _cluster()
    _reassign(cluster, Reassignment("t", 0, (1, 2, 4)))
    assert _join_isr(cluster, 4) == ErrorCode.none
    done = _state(cluster)
    assert (done.replicas, done.isr, done.leader, done.reassigning) == (
        (1, 2, 4),
        (1, 2, 4),
        1,
        False,
    )


def test_a_target_already_in_sync_completes_at_once() -> None:
    cluster = _cluster()
    epoch = _state(cluster).partition_epoch
    assert _reassign(cluster, Reassignment("t", 0, (2, 3))) == [(ErrorCode.none, None)]
    done = _state(cluster)
    assert (done.replicas, done.isr, done.leader, done.reassigning) == ((2, 3), (2, 3), 2, False)
    assert done.partition_epoch == epoch + 1  # one record did it all


def test_asking_again_for_the_same_target_changes_nothing() -> None:
    cluster = _cluster()
    _reassign(cluster, Reassignment("t", 0, (2, 3, 4)))
    offset = cluster.next_offset
    assert _reassign(cluster, Reassignment("t", 0, (2, 3, 4))) == [(ErrorCode.none, None)]
    assert _reassign(cluster, Reassignment("t", 1, (1, 2, 3))) == [(ErrorCode.none, None)]
    assert cluster.next_offset == offset


def test_a_cancel_goes_back_without_the_replicas_being_added() -> None:
    cluster = _cluster()
    _reassign(cluster, Reassignment("t", 0, (2, 3, 4)))
    assert _reassign(cluster, Reassignment("t", 0, None)) == [(ErrorCode.none, None)]
    back = _state(cluster)
    # Kafka's order: the replicas as they were during the reassignment, the added ones out.
    assert (back.replicas, back.isr, back.leader, back.reassigning) == (
        (2, 3, 1),
        (1, 2, 3),
        1,
        False,
    )

    error, message = _reassign(cluster, Reassignment("t", 0, None))[0]
    assert error == ErrorCode.no_reassignment_in_progress
    assert message is not None
    assert "No reassignment is in progress" in message


def test_a_new_target_replaces_the_one_under_way() -> None:
    cluster = _cluster(brokers=5)
    _reassign(cluster, Reassignment("t", 0, (2, 3, 4)))
    _reassign(cluster, Reassignment("t", 0, (1, 2, 5)))
    state = _state(cluster)
    # Judged against the replicas before the first one: 4 is no longer added, 3 is removed.
    assert (state.replicas, state.adding, state.removing) == ((1, 2, 5, 3), (5,), (3,))
    assert state.isr == (1, 2, 3)


def test_bad_targets_are_refused_one_partition_at_a_time_with_kafkas_messages() -> None:
    cluster = _cluster()
    results = _reassign(
        cluster,
        Reassignment("t", 0, ()),
        Reassignment("t", 0, (2, 2, 3)),
        Reassignment("t", 0, (2, 3, 9)),
        Reassignment("t", 7, (1, 2, 3)),
        Reassignment("nope", 0, (1, 2, 3)),
        Reassignment("t", 1, (2, 3, 4)),
    )
    assert results == [
        (
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes an empty replica list.",
        ),
        (
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes the broker 2 more than once.",
        ),
        (
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes broker 9, but no such broker is registered.",
        ),
        (ErrorCode.unknown_topic_or_partition, "No such partition as t-7"),
        (ErrorCode.unknown_topic_or_partition, "No such partition as nope-0"),
        (ErrorCode.none, None),
    ]
    assert not _state(cluster, 0).reassigning
    assert _state(cluster, 1).adding == (4,)


def test_a_reassignment_under_way_survives_a_snapshot() -> None:
    cluster = _cluster()
    _reassign(cluster, Reassignment("t", 0, (2, 3, 4)))
    rebuilt = MetadataImage()
    rebuilt.load(cluster.image.snapshot_records(), cluster.next_offset - 1)
    assert rebuilt.topics["t"].partitions == cluster.image.topics["t"].partitions


def test_a_change_of_replication_factor_can_be_forbidden() -> None:
    cluster = _cluster()
    records, results = alter_reassignments(
        cluster.image,
        [Reassignment("t", 0, (2, 3)), Reassignment("t", 1, (2, 3, 4))],
        allow_replication_factor_change=False,
    )
    assert [(r.error, r.message) for r in results] == [
        (ErrorCode.invalid_replication_factor, "The replication factor is changed from 3 to 2"),
        (ErrorCode.none, None),
    ]
    cluster.commit(records)
    assert (_state(cluster, 0).reassigning, _state(cluster, 1).adding) == (False, (4,))


def test_a_reassignment_to_a_stopped_broker_completes_once_it_is_back_in_sync() -> None:
    """A cleanly stopped broker stays registered, fenced (issue 25): a reassignment may name
    it, as in Kafka; it joins the ISR, and so completes the move, only once its next process
    has registered and been unfenced."""
    cluster = _cluster()
    cluster.shut_down(4, cluster.image.brokers[4].epoch)
    assert _reassign(cluster, Reassignment("t", 0, (2, 3, 4))) == [(ErrorCode.none, None)]
    assert _state(cluster).adding == (4,)
    assert _join_isr(cluster, 4) == ErrorCode.ineligible_replica

    cluster.register_live(4)
    assert _join_isr(cluster, 4) == ErrorCode.new_leader_elected
    done = _state(cluster)
    assert (done.replicas, done.isr, done.leader, done.reassigning) == (
        (2, 3, 4),
        (2, 3, 4),
        2,
        False,
    )


def test_replicas_reassigned_away_leave_the_eligible_leader_replicas() -> None:
    """KIP-966: a replica taken out of a partition is no longer one of its eligible leaders
    (an ELR naming a broker that is not a replica could elect it). Found by the controller
    simulation, seed 731 of 1,500."""
    cluster = _cluster()
    shrunk = PartitionChangeRecord(
        partition_id=0,
        topic_id=TOPIC_ID,
        isr=(1, 2),
        eligible_leader_replicas=(3,),
        last_known_elr=(3,),
    )
    cluster.commit([shrunk])
    assert (_state(cluster).elr, _state(cluster).last_known_elr) == ((3,), (3,))
    assert _reassign(cluster, Reassignment("t", 0, (1, 2))) == [(ErrorCode.none, None)]
    done = _state(cluster)
    assert (done.replicas, done.isr, done.elr, done.last_known_elr) == ((1, 2), (1, 2), (), ())
