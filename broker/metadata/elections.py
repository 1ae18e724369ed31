"""Partition leaders and ISRs as brokers come and go, as the active controller decides them
(Kafka's ReplicationControlManager on a broker fenced, unfenced or in controlled shutdown).

Also a leader's requests to change its ISR (AlterPartition, `alter_isr`): followers that lag
leave it, followers that caught up join it (and complete a reassignment once all of its
target is in sync). And elections asked for (ElectLeaders,
`elect_leaders`) or due (`rebalance`, `auto.leader.rebalance.enable`): a partition's preferred
replica, the first of its assignment, leads it again once it is back in the ISR; an unclean
election gives a leaderless partition any live replica.

Pure: the image in, PartitionChangeRecords out. A broker that leaves (its session ran out, it
asked to shut down, or a new process registered under its id) leads nothing afterwards and is
out of every ISR: each partition it led gets the first of its replicas, in assignment order,
that is in the remaining ISR and on a usable broker (registered, unfenced, not shutting down).
Eligible leader replicas (KIP-966, Kafka 4.1's default): a replica that leaves an ISR that is
then below the topic's `min.insync.replicas` (`min_isr`, resolved by the caller) joins the
partition's ELR, because the high watermark cannot move while the ISR is that small, so it
holds every committed record; the ISR may become empty. A leader comes from the ISR; with the
ISR empty, from the ELR (the new ISR is then that replica alone); with both empty, the last
leader when it returns (Kafka's balanced recovery: it held everything when it left, unless it
lost it since); else, where the topic's `unclean.leader.election.enable` allows it (`unclean`)
or an operator asks (ElectLeaders UNCLEAN), any live replica, which may lose records. A broker
that comes back from an unclean shutdown, or without a log dir it had (a replaced disk), may
have lost what it had: it leaves every ISR and ELR (`register`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from broker.protocol.errors import ErrorCode

from .image import MetadataImage, PartitionState
from .reassignments import complete_if_done
from .records import PartitionChangeRecord

__all__ = [
    "MAX_ELECTIONS_PER_REBALANCE",
    "NO_LEADER",
    "PREFERRED",
    "UNCLEAN",
    "ElectionResult",
    "IsrAnswer",
    "IsrChange",
    "alter_isr",
    "elect_leaders",
    "elect_returning",
    "elect_unclean",
    "imbalanced",
    "move_off",
    "no_unclean",
    "one_min_isr",
    "rebalance",
]

NO_LEADER = -1
_UNCHANGED = -2
PREFERRED = 0
"""ElectLeaders' election types: the preferred replica, if it is in the ISR and live..."""
UNCLEAN = 1
"""...or, for a partition without a leader, any live replica (the ISR's first, if any)."""
MAX_ELECTIONS_PER_REBALANCE = 1000
"""As Kafka's controller: at most this many preferred elections per commit; the rest next."""


def no_unclean(_topic: str) -> bool:
    """The default `unclean` rule: no topic allows unclean elections."""
    return False


def one_min_isr(_topic: str) -> int:
    """The default `min_isr` rule: Kafka's default `min.insync.replicas`, 1."""
    return 1


def _next_elr(
    state: PartitionState,
    target_isr: tuple[int, ...],
    replicas: tuple[int, ...],
    min_isr: int,
    lost: frozenset[int] = frozenset(),
) -> tuple[int, ...]:
    """The ELR once the ISR is `target_isr` (Kafka's maybePopulateTargetElr): empty while the
    ISR has `min.insync.replicas` members (or every replica, if there are fewer); else the
    earlier ELR and ISR members that leave it, but those `lost`."""
    if len(target_isr) >= min(min_isr, len(replicas)):
        return ()
    held = set(state.elr) | set(state.isr)
    return tuple(r for r in replicas if r in held and r not in target_isr and r not in lost)


@dataclass(frozen=True, slots=True)
class _Outcome:
    isr: tuple[int, ...]
    leader: int
    elr: tuple[int, ...]
    last_known_elr: tuple[int, ...]


def _decide(
    state: PartitionState,
    target_isr: tuple[int, ...],
    usable: set[int],
    min_isr: int,
    *,
    allow_unclean: bool,
    lost: frozenset[int] = frozenset(),
) -> _Outcome:
    """A partition whose ISR becomes `target_isr`: its ELR, then its leader, as Kafka's
    PartitionChangeBuilder decides them. `usable`: brokers that may lead (registered,
    unfenced, not shutting down, not leaving); `lost`: replicas that may have lost records
    (an unclean shutdown, a replaced disk), kept out of the ELR."""
    elr = _next_elr(state, target_isr, state.replicas, min_isr, lost)
    isr, leader, unclean = target_isr, NO_LEADER, False

    def valid(replica: int) -> bool:
        eligible = replica in isr or (not isr and replica in elr)
        return eligible and replica in usable

    if state.leader != NO_LEADER and valid(state.leader):
        leader = state.leader
    else:
        leader = next((r for r in state.replicas if valid(r)), NO_LEADER)
        if leader == NO_LEADER and not isr and not elr:
            last = state.last_known_elr
            if len(last) == 1 and last[0] in usable:
                leader, unclean = last[0], True  # balanced recovery: the last leader
        if leader == NO_LEADER and allow_unclean:
            leader = next((r for r in state.replicas if r in usable), NO_LEADER)
            unclean = leader != NO_LEADER
    if unclean:
        return _Outcome((leader,), leader, (), ())
    if leader != NO_LEADER and leader not in isr:  # from the ELR
        isr, elr = (leader,), tuple(r for r in elr if r != leader)
    last_known = state.last_known_elr
    if not isr and leader == NO_LEADER:
        if state.isr and state.leader != NO_LEADER:
            last_known = (state.leader,)  # the first time it is left without a leader
    elif leader != NO_LEADER:
        last_known = ()
    return _Outcome(isr, leader, elr, last_known)


def move_off(
    image: MetadataImage,
    leaving: set[int],
    unclean: Callable[[str], bool] = no_unclean,
    min_isr: Callable[[str], int] = one_min_isr,
    *,
    lost: frozenset[int] = frozenset(),
) -> list[PartitionChangeRecord]:
    """The records that take the brokers `leaving` out of every ISR and give the partitions
    they led another leader (`_decide`: the ISR, the ELR, the last leader, or, where
    `unclean(topic)` allows it, any live replica); and the replicas `lost` (a broker back from
    an unclean shutdown or with a replaced disk) out of every ISR and ELR."""
    usable = image.usable_broker_ids() - leaving
    gone = leaving | lost
    records = []
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        for index, state in sorted(topic.partitions.items()):
            touched = state.leader in leaving or not gone.isdisjoint(state.isr)
            if not touched and lost.isdisjoint(state.elr):
                continue
            isr = tuple(r for r in state.isr if r not in gone)
            outcome = _decide(
                state,
                isr,
                usable,
                min_isr(topic.name),
                allow_unclean=unclean(topic.name),
                lost=lost,
            )
            record = _record(topic.topic_id, index, state, outcome)
            if record is not None:
                records.append(record)
    return records


def elect_returning(
    image: MetadataImage,
    broker_id: int,
    unclean: Callable[[str], bool] = no_unclean,
    min_isr: Callable[[str], int] = one_min_isr,
) -> list[PartitionChangeRecord]:
    """A broker is usable again (unfenced): partitions left without a leader that it may
    lead get it (in their ISR or, the ISR empty, their ELR; or their last leader; or, where
    `unclean` allows it, any live replica)."""
    usable = image.usable_broker_ids() | {broker_id}
    records = []
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        for index, state in sorted(topic.partitions.items()):
            if state.leader != NO_LEADER or broker_id not in state.replicas:
                continue
            outcome = _decide(
                state, state.isr, usable, min_isr(topic.name), allow_unclean=unclean(topic.name)
            )
            if outcome.leader == NO_LEADER:
                continue
            record = _record(topic.topic_id, index, state, outcome)
            if record is not None:
                records.append(record)
    return records


def elect_unclean(
    image: MetadataImage, unclean: Callable[[str], bool]
) -> list[PartitionChangeRecord]:
    """The controller's periodic unclean elections (`unclean.leader.election.interval.ms`):
    every leaderless partition of a topic `unclean` allows gets a live replica, if any."""
    wanted = [
        (name, [i for i, state in sorted(topic.partitions.items()) if state.leader == NO_LEADER])
        for name, topic in sorted(image.topics.items())
        if unclean(name)
    ]
    records, _ = elect_leaders(image, UNCLEAN, [(name, p) for name, p in wanted if p])
    return records


def _record(
    topic_id: uuid.UUID, index: int, state: PartitionState, outcome: _Outcome
) -> PartitionChangeRecord | None:
    """The change from `state` to `outcome`, naming only what changes; None if nothing does."""
    if (outcome.isr, outcome.leader, outcome.elr, outcome.last_known_elr) == (
        state.isr,
        state.leader,
        state.elr,
        state.last_known_elr,
    ):
        return None
    return PartitionChangeRecord(
        partition_id=index,
        topic_id=topic_id,
        isr=None if outcome.isr == state.isr else outcome.isr,
        leader=_UNCHANGED if outcome.leader == state.leader else outcome.leader,
        eligible_leader_replicas=None if outcome.elr == state.elr else outcome.elr,
        last_known_elr=(
            None if outcome.last_known_elr == state.last_known_elr else outcome.last_known_elr
        ),
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
    image: MetadataImage,
    broker_id: int,
    broker_epoch: int,
    changes: list[IsrChange],
    min_isr: Callable[[str], int] = one_min_isr,
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
    usable = image.usable_broker_ids()
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
        record = complete_if_done(image, change.topic_id, change.partition, state, isr)
        replicas = state.replicas if record.replicas is None else record.replicas
        elr = _next_elr(
            state, isr if record.isr is None else record.isr, replicas, min_isr(topic.name)
        )
        if elr != state.elr:  # a shrink below min.insync.replicas, or back above it
            record = replace(record, eligible_leader_replicas=elr)
        records.append(record)
        if record.leader != _UNCHANGED:
            # The ISR completed a reassignment that took the leader off the partition: the
            # leader learns of its successor from the metadata (Kafka's answer too).
            answers.append(IsrAnswer(ErrorCode.new_leader_elected))
            continue
        new_isr = isr if record.isr is None else record.isr
        answers.append(
            IsrAnswer(
                ErrorCode.none, state.leader, state.leader_epoch, new_isr, state.partition_epoch + 1
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


@dataclass(frozen=True, slots=True)
class ElectionResult:
    """One partition of an ElectLeaders answer."""

    topic: str
    partition: int
    error: ErrorCode
    message: str | None = None


def elect_leaders(
    image: MetadataImage, election_type: int, wanted: list[tuple[str, list[int]]] | None
) -> tuple[list[PartitionChangeRecord], list[ElectionResult]]:
    """An ElectLeaders request, decided as Kafka's controller does: for each partition asked
    (every partition of every topic when `wanted` is None, leaving out those already led as
    asked), the election or why there is none: UNKNOWN_TOPIC_OR_PARTITION, ELECTION_NOT_NEEDED
    (the preferred replica leads; or, unclean, the partition has a leader),
    PREFERRED_LEADER_NOT_AVAILABLE (it is out of the ISR or not live),
    ELIGIBLE_LEADERS_NOT_AVAILABLE (no live replica at all). An unclean election is the
    operator's explicit choice, so it needs no `unclean.leader.election.enable`."""
    usable = image.usable_broker_ids()
    records: list[PartitionChangeRecord] = []
    results: list[ElectionResult] = []
    every = wanted is None
    if wanted is None:
        wanted = [(name, sorted(topic.partitions)) for name, topic in sorted(image.topics.items())]
    for name, partitions in wanted:
        topic = image.topics.get(name)
        for index in partitions:
            state = None if topic is None else topic.partitions.get(index)
            if topic is None or state is None:
                results.append(
                    ElectionResult(
                        name,
                        index,
                        ErrorCode.unknown_topic_or_partition,
                        f"No such partition as {name}-{index}",
                    )
                )
                continue
            error, message, outcome = _elect(state, election_type, usable)
            if outcome is not None:
                record = _record(topic.topic_id, index, state, outcome)
                if record is not None:
                    records.append(record)
            if not (every and error == ErrorCode.election_not_needed):
                results.append(ElectionResult(name, index, error, message))
    return records, results


def _elect(
    state: PartitionState, election_type: int, usable: set[int]
) -> tuple[ErrorCode, str | None, _Outcome | None]:
    """(error, message, what the partition becomes, or None) for one partition."""
    if election_type == PREFERRED:
        preferred = state.replicas[0] if state.replicas else NO_LEADER
        if state.leader == preferred:
            return ErrorCode.election_not_needed, None, None
        if preferred not in state.isr:
            why = f"the preferred replica {preferred} is not in the ISR {list(state.isr)}"
            return ErrorCode.preferred_leader_not_available, why, None
        if preferred not in usable:
            why = f"the preferred replica {preferred} is not a live broker"
            return ErrorCode.preferred_leader_not_available, why, None
        return ErrorCode.none, None, _Outcome(state.isr, preferred, state.elr, ())
    if state.leader != NO_LEADER:
        return ErrorCode.election_not_needed, None, None
    # The operator's choice: the ISR's, the ELR's, the last leader, else any live replica.
    outcome = _decide(state, state.isr, usable, len(state.replicas), allow_unclean=True)
    if outcome.leader == NO_LEADER:
        why = f"none of the replicas {list(state.replicas)} is a live broker"
        return ErrorCode.eligible_leaders_not_available, why, None
    return ErrorCode.none, None, outcome


def imbalanced(image: MetadataImage) -> list[tuple[str, list[int]]]:
    """The partitions a preferred election would move: led by another replica than their
    preferred one, which is in the ISR and live."""
    usable = image.usable_broker_ids()
    found = []
    for name, topic in sorted(image.topics.items()):
        partitions = [
            index
            for index, state in sorted(topic.partitions.items())
            if state.replicas
            and state.leader != state.replicas[0]
            and state.replicas[0] in state.isr
            and state.replicas[0] in usable
        ]
        if partitions:
            found.append((name, partitions))
    return found


def rebalance(image: MetadataImage) -> list[PartitionChangeRecord]:
    """`auto.leader.rebalance.enable`'s step, as Kafka's KRaft controller takes it: preferred
    elections for the imbalanced partitions, at most `MAX_ELECTIONS_PER_REBALANCE`. Kafka's
    KRaft controller has no imbalance ratio (`leader.imbalance.per.broker.percentage` was the
    ZooKeeper controller's): any imbalanced partition whose preferred replica can lead is
    moved, every `leader.imbalance.check.interval.seconds`."""
    records, _ = elect_leaders(image, PREFERRED, imbalanced(image))
    return records[:MAX_ELECTIONS_PER_REBALANCE]
