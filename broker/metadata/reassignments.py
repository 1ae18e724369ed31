"""Partition reassignments (KIP-455: AlterPartitionReassignments, ListPartitionReassignments),
as Kafka's KRaft controller decides them.

A reassignment gives a partition a target replica set. The replicas it adds join first: the
partition's replicas become the target followed by the replicas being removed, the new ones
`adding`, the old ones `removing`. Once every replica of the target is in the ISR (the leader
adds the new ones through AlterPartition as they catch up, `complete_if_done`), one record
makes the target the assignment: the removed replicas leave the replicas and the ISR, and the
partition gets a new leader if its leader was one of them. A cancel (a target of None) goes
back to the replicas as they were, without those being added.

Pure: the image in, PartitionChangeRecords out.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from broker.protocol.errors import ErrorCode

from .image import MetadataImage, PartitionState
from .records import PartitionChangeRecord

__all__ = [
    "Reassignment",
    "ReassignmentResult",
    "alter_reassignments",
    "complete_if_done",
    "ongoing",
]

_NO_LEADER = -1
_UNCHANGED = -2


@dataclass(frozen=True, slots=True)
class Reassignment:
    """One partition of an AlterPartitionReassignments: its target replicas, or None to
    cancel the reassignment under way."""

    topic: str
    partition: int
    target: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class ReassignmentResult:
    topic: str
    partition: int
    error: ErrorCode
    message: str | None = None


def alter_reassignments(
    image: MetadataImage,
    wanted: list[Reassignment],
    *,
    allow_replication_factor_change: bool = True,
) -> tuple[list[PartitionChangeRecord], list[ReassignmentResult]]:
    """Start, replace or cancel the reassignments `wanted`, each partition on its own: one
    that is refused (an unknown partition, a replica list that is empty, names a broker twice
    or one that is not registered, changes the replication factor when that is not allowed,
    a cancel with nothing to cancel) leaves the others be."""
    records: list[PartitionChangeRecord] = []
    results = []
    usable = image.usable_broker_ids()
    for asked in wanted:
        topic = image.topics.get(asked.topic)
        state = None if topic is None else topic.partitions.get(asked.partition)
        if topic is None or state is None:
            results.append(
                ReassignmentResult(
                    asked.topic,
                    asked.partition,
                    ErrorCode.unknown_topic_or_partition,
                    f"No such partition as {asked.topic}-{asked.partition}",
                )
            )
            continue
        if asked.target is None:
            error, message, record = _cancel(topic.topic_id, asked.partition, state, usable)
        else:
            error, message, record = _start(
                image,
                topic.topic_id,
                asked.partition,
                state,
                asked.target,
                usable=usable,
                allow_replication_factor_change=allow_replication_factor_change,
            )
        if record is not None:
            records.append(record)
        results.append(ReassignmentResult(asked.topic, asked.partition, error, message))
    return records, results


def _start(
    image: MetadataImage,
    topic_id: uuid.UUID,
    index: int,
    state: PartitionState,
    target: tuple[int, ...],
    *,
    usable: set[int],
    allow_replication_factor_change: bool,
) -> tuple[ErrorCode, str | None, PartitionChangeRecord | None]:
    refusal = _invalid(image, target)
    if refusal is not None:
        return ErrorCode.invalid_replica_assignment, refusal, None
    # A new target replaces one under way, from the replicas the partition had before it.
    original = tuple(r for r in state.replicas if r not in state.adding)
    if not allow_replication_factor_change and len(target) != len(original):
        message = f"The replication factor is changed from {len(original)} to {len(target)}"
        return ErrorCode.invalid_replication_factor, message, None
    if state.reassigning and state.target == target:
        return ErrorCode.none, None, None  # the same target again: nothing to change
    removing = tuple(r for r in original if r not in target)
    adding = tuple(r for r in target if r not in original)
    replicas = target + removing
    isr = tuple(r for r in state.isr if r in replicas)
    if replicas == state.replicas and not adding and not removing and not state.reassigning:
        return ErrorCode.none, None, None  # already its assignment
    if not isr:
        message = "None of the replicas the partition keeps is in its ISR."
        return ErrorCode.invalid_replica_assignment, message, None
    started = _assigned(state, replicas, isr, usable, adding=adding, removing=removing)
    return ErrorCode.none, None, _record(topic_id, index, state, _completed(started, usable))


def _cancel(
    topic_id: uuid.UUID, index: int, state: PartitionState, usable: set[int]
) -> tuple[ErrorCode, str | None, PartitionChangeRecord | None]:
    if not state.reassigning:
        message = "No reassignment is in progress for this partition."
        return ErrorCode.no_reassignment_in_progress, message, None
    replicas = tuple(r for r in state.replicas if r not in state.adding)
    isr = tuple(r for r in state.isr if r in replicas)
    if not isr:
        # As Kafka: only the replicas being added are in sync; going back would need an
        # unclean election.
        message = (
            "Unable to revert the partition assignment because it would require an unclean "
            "leader election."
        )
        return ErrorCode.invalid_replica_assignment, message, None
    reverted = _assigned(state, replicas, isr, usable)
    return ErrorCode.none, None, _record(topic_id, index, state, reverted)


def _assigned(
    state: PartitionState,
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    usable: set[int],
    *,
    adding: tuple[int, ...] = (),
    removing: tuple[int, ...] = (),
) -> PartitionState:
    """`state` with these replicas and ISR (and a reassignment's `adding` and `removing`,
    if any), its leader kept if it is still a replica, and its eligible leader replicas only
    those still replicas and out of the ISR (as Kafka's PartitionChangeBuilder keeps them)."""
    leader = _leader(state.leader, replicas, isr, usable)
    return replace(
        state,
        replicas=replicas,
        isr=isr,
        leader=leader,
        adding=adding,
        removing=removing,
        elr=tuple(r for r in state.elr if r in replicas and r not in isr),
        last_known_elr=tuple(r for r in state.last_known_elr if r in replicas),
    )


def _leader(leader: int, replicas: tuple[int, ...], isr: tuple[int, ...], usable: set[int]) -> int:
    """The leader stays if it is still a replica; else the first replica in the ISR that is
    usable, if any."""
    if leader in replicas:
        return leader
    return next((r for r in replicas if r in isr and r in usable), _NO_LEADER)


def _invalid(image: MetadataImage, target: tuple[int, ...]) -> str | None:
    """Kafka's checks of a manual assignment, with its messages."""
    if not target:
        return "The manual partition assignment includes an empty replica list."
    seen: set[int] = set()
    for broker_id in sorted(target):
        if broker_id not in image.brokers:
            return (
                f"The manual partition assignment includes broker {broker_id}, "
                "but no such broker is registered."
            )
        if broker_id in seen:
            return (
                f"The manual partition assignment includes the broker {broker_id} more than once."
            )
        seen.add(broker_id)
    return None


def complete_if_done(
    image: MetadataImage,
    topic_id: uuid.UUID,
    index: int,
    state: PartitionState,
    isr: tuple[int, ...],
) -> PartitionChangeRecord:
    """The record that gives the partition `state` the ISR `isr`, and that completes its
    reassignment if every target replica is then in sync."""
    changed = replace(state, isr=isr)
    return _record(topic_id, index, state, _completed(changed, image.usable_broker_ids()))


def _completed(state: PartitionState, usable: set[int]) -> PartitionState:
    """`state` with its reassignment completed, if every target replica is in the ISR and
    one of them can lead; else as it is."""
    if not state.reassigning:
        return state
    target = state.target
    if any(r not in state.isr for r in target):
        return state
    isr = tuple(r for r in state.isr if r in target)
    completed = _assigned(state, target, isr, usable)
    if completed.leader == _NO_LEADER and state.leader != _NO_LEADER:
        return state  # none of the target can lead yet: the old replicas stay
    return completed


def _record(
    topic_id: uuid.UUID, index: int, old: PartitionState, new: PartitionState
) -> PartitionChangeRecord:
    return PartitionChangeRecord(
        partition_id=index,
        topic_id=topic_id,
        isr=None if new.isr == old.isr else new.isr,
        leader=_UNCHANGED if new.leader == old.leader else new.leader,
        replicas=None if new.replicas == old.replicas else new.replicas,
        adding_replicas=None if new.adding == old.adding else new.adding,
        removing_replicas=None if new.removing == old.removing else new.removing,
        eligible_leader_replicas=None if new.elr == old.elr else new.elr,
        last_known_elr=None if new.last_known_elr == old.last_known_elr else new.last_known_elr,
    )


def ongoing(
    image: MetadataImage, wanted: list[tuple[str, list[int]]] | None
) -> list[tuple[str, int, PartitionState]]:
    """The partitions with a reassignment under way, of those `wanted` (all when None), by
    topic and partition; unknown ones are left out, as Kafka does."""
    found = []
    if wanted is None:
        wanted = [(name, sorted(topic.partitions)) for name, topic in sorted(image.topics.items())]
    for name, partitions in wanted:
        topic = image.topics.get(name)
        if topic is None:
            continue
        for index in partitions:
            state = topic.partitions.get(index)
            if state is not None and state.reassigning:
                found.append((name, index, state))
    return found
