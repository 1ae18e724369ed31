"""Partition leaders and ISRs as brokers come and go, as the active controller decides them
(Kafka's ReplicationControlManager on a broker fenced, unfenced or in controlled shutdown).

Also a leader's requests to change its ISR (AlterPartition, `alter_isr`): followers that lag
leave it, followers that caught up join it.

Pure: the image in, PartitionChangeRecords out. A broker that leaves (its session ran out, it
asked to shut down, or a new process registered under its id) leads nothing afterwards and is
out of every ISR: each partition it led gets the first of its replicas, in assignment order,
that is in the remaining ISR and on a usable broker (registered, unfenced, not shutting down).
Only ISR members are elected (no unclean election): when none is usable the partition has no
leader (-1). The last member of an ISR is never removed, as in Kafka: it is the one replica
known to hold every committed record, and it becomes the leader again when its broker returns
(`elect_returning`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from broker.protocol.errors import ErrorCode

from .image import MetadataImage, PartitionState
from .records import PartitionChangeRecord

__all__ = ["NO_LEADER", "IsrAnswer", "IsrChange", "alter_isr", "elect_returning", "move_off"]

NO_LEADER = -1
_UNCHANGED = -2


def move_off(image: MetadataImage, leaving: set[int]) -> list[PartitionChangeRecord]:
    """The records that take the brokers `leaving` out of every ISR and give the partitions
    they led another leader (or none)."""
    usable = _usable(image) - leaving
    records = []
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        for index, state in sorted(topic.partitions.items()):
            if state.leader not in leaving and leaving.isdisjoint(state.isr):
                continue
            isr = tuple(r for r in state.isr if r not in leaving)
            if not isr:
                isr = state.isr[-1:]  # the last one stays, leaderless
            leader = state.leader
            if leader in leaving or leader == NO_LEADER:
                leader = _first_usable(state, isr, usable)
            records.append(_change(topic.topic_id, index, state, isr, leader))
    return records


def elect_returning(image: MetadataImage, broker_id: int) -> list[PartitionChangeRecord]:
    """A broker is usable again (unfenced): partitions left without a leader whose ISR has it
    get it as their leader."""
    records = []
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        for index, state in sorted(topic.partitions.items()):
            if state.leader == NO_LEADER and broker_id in state.isr:
                records.append(_change(topic.topic_id, index, state, state.isr, broker_id))
    return records


def _usable(image: MetadataImage) -> set[int]:
    return {
        broker.broker_id
        for broker in image.brokers.values()
        if not broker.fenced and not broker.in_controlled_shutdown
    }


def _first_usable(state: PartitionState, isr: tuple[int, ...], usable: set[int]) -> int:
    return next((r for r in state.replicas if r in isr and r in usable), NO_LEADER)


def _change(
    topic_id: uuid.UUID, index: int, state: PartitionState, isr: tuple[int, ...], leader: int
) -> PartitionChangeRecord:
    return PartitionChangeRecord(
        partition_id=index,
        topic_id=topic_id,
        isr=None if isr == state.isr else isr,
        leader=_UNCHANGED if leader == state.leader else leader,
    )


@dataclass(frozen=True, slots=True)
class IsrChange:
    """One partition of an AlterPartition request: the ISR its leader wants, each member with
    the broker epoch the leader knows it by (KIP-903), and the epochs the leader has."""

    topic_id: uuid.UUID
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[tuple[int, int], ...]
    """(broker id, broker epoch or -1) per member."""


@dataclass(frozen=True, slots=True)
class IsrAnswer:
    error: ErrorCode
    leader: int = NO_LEADER
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()
    partition_epoch: int = -1


def alter_isr(
    image: MetadataImage, broker_id: int, broker_epoch: int, changes: list[IsrChange]
) -> tuple[list[PartitionChangeRecord], ErrorCode, list[IsrAnswer]]:
    """Kafka's checks of an AlterPartition, in its order: the sender is registered with that
    epoch (STALE_BROKER_EPOCH), the partition exists, the sender leads it in that leader epoch
    (FENCED_LEADER_EPOCH, INVALID_REQUEST), the partition has not changed since the leader
    last heard (INVALID_UPDATE_VERSION), and the new ISR keeps the leader, holds only the
    partition's replicas, and adds only usable brokers of the epoch the leader names
    (INELIGIBLE_REPLICA). The answer names the partition as it is after the change."""
    registered = image.brokers.get(broker_id)
    if registered is None or registered.epoch != broker_epoch:
        return [], ErrorCode.stale_broker_epoch, []
    usable = _usable(image)
    records: list[PartitionChangeRecord] = []
    answers = []
    for change in changes:
        topic = image.topics_by_id.get(change.topic_id)
        if topic is None:
            answers.append(IsrAnswer(ErrorCode.unknown_topic_id))
            continue
        state = topic.partitions.get(change.partition)
        if state is None:
            answers.append(IsrAnswer(ErrorCode.unknown_topic_or_partition))
            continue
        error = _refusal(image, usable, broker_id, state, change)
        if error is not None:
            answers.append(_answer(error, state))
            continue
        isr = tuple(member for member, _ in change.new_isr)
        if isr == state.isr:
            answers.append(_answer(ErrorCode.none, state))
            continue
        records.append(_change(change.topic_id, change.partition, state, isr, state.leader))
        answers.append(
            IsrAnswer(
                ErrorCode.none, state.leader, state.leader_epoch, isr, state.partition_epoch + 1
            )
        )
    return records, ErrorCode.none, answers


def _refusal(
    image: MetadataImage,
    usable: set[int],
    broker_id: int,
    state: PartitionState,
    change: IsrChange,
) -> ErrorCode | None:
    if change.leader_epoch != state.leader_epoch:
        return ErrorCode.fenced_leader_epoch
    if state.leader != broker_id:
        return ErrorCode.invalid_request
    if change.partition_epoch != state.partition_epoch:
        return ErrorCode.invalid_update_version
    members = [member for member, _ in change.new_isr]
    if broker_id not in members or len(set(members)) != len(members):
        return ErrorCode.invalid_request
    for member, epoch in change.new_isr:
        if member not in state.replicas:
            return ErrorCode.invalid_request
        if member in state.isr:
            continue
        broker = image.brokers.get(member)
        if broker is None or member not in usable or epoch not in (-1, broker.epoch):
            return ErrorCode.ineligible_replica
    return None


def _answer(error: ErrorCode, state: PartitionState) -> IsrAnswer:
    return IsrAnswer(error, state.leader, state.leader_epoch, state.isr, state.partition_epoch)
