"""Where the replicas of new partitions go: spread over racks first, then over brokers, and led
by unfenced brokers only.

The facts follow Apache Kafka's KRaft placer (StripedReplicaPlacer): every registered broker is
usable except one that is shutting down while still unfenced; brokers without `broker.rack` form
one rack of their own (racked and unracked brokers may be mixed, unlike in ZooKeeper mode); a
partition's replicas go round the racks before any rack holds a second one, even when that takes
a fenced broker; within a rack the unfenced brokers are used before the fenced ones; and a leader
is never fenced. Kafka starts each placement at a random offset; here the start is an argument,
so that every controller decides the same from the same image.

Pure: brokers in, replica lists out. It must never read the image, a clock or a random source.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from .image import BrokerState

__all__ = ["UsableBroker", "place", "usable_brokers"]


@dataclass(frozen=True, slots=True)
class UsableBroker:
    """A broker new replicas may be placed on (Kafka's UsableBroker)."""

    broker_id: int
    rack: str | None
    fenced: bool
    """True for any broker that is not active (fenced, or in controlled shutdown): it may hold
    a follower, out of the ISR, when a rack needs it, but never leads."""


def usable_brokers(brokers: Iterable[BrokerState]) -> list[UsableBroker]:
    """The registered brokers a placement may use, by id: all but those shutting down while
    still unfenced, as Kafka's BrokerHeartbeatManager.usableBrokers."""
    return [
        UsableBroker(b.broker_id, b.rack, fenced=b.fenced or b.in_controlled_shutdown)
        for b in sorted(brokers, key=lambda b: b.broker_id)
        if b.fenced or not b.in_controlled_shutdown
    ]


@dataclass(frozen=True, slots=True)
class _Rack:
    unfenced: tuple[int, ...]
    fenced: tuple[int, ...]


def place(
    brokers: Sequence[UsableBroker], *, partitions: int, factor: int, start: int
) -> list[tuple[int, ...]]:
    """Replica lists, leader first, for `partitions` new partitions, numbered from `start` in
    the cluster's sequence of placed partitions (the controller passes how many partitions the
    cluster already has, so that successive topics carry on where the last one stopped).

    It guarantees, for the brokers given:

    1. No broker holds two replicas of a partition, and every leader is unfenced.
    2. Racks before brokers: a partition's replicas go one per rack, round the racks, before
       any rack holds a second one, skipping only a rack with no broker left. With R racks, a
       partition of replication factor f spans min(f, R) racks.
    3. Within a rack, a fenced broker is taken only once the rack has no unfenced one left
       for the partition.
    4. Leaders take turns along the unfenced brokers, listed rack by rack alternately: any run
       of as many consecutive partitions as there are unfenced brokers has each of them lead
       exactly once, whatever `start` is.
    5. With racks of equal size (or no racks) and no fenced broker, each broker holds exactly
       `factor` replicas of each such run counted from the first partition placed (a topic of
       k times as many partitions as brokers is balanced on its own), and, where the racks
       leave a choice, each run pairs the brokers differently from the one before, so that
       the followers of one broker's partitions are not always the same few. Racks of unequal
       size are a user's mistake, as Kafka says: rule 2 then loads the smaller racks more.
    6. The same arguments give the same answer.

    The caller checks first that 0 < `factor` <= len(`brokers`) and that one broker is
    unfenced (Kafka's errors are the caller's to give); otherwise this raises ValueError.
    """
    racks = _racks(brokers)
    turns = [
        (index, depth)
        for depth in range(max((len(r.unfenced) for r in racks), default=0))
        for index, rack in enumerate(racks)
        if depth < len(rack.unfenced)
    ]
    if not turns or not 0 < factor <= len(brokers) or partitions < 0:
        raise ValueError(
            f"cannot place {partitions} partition(s) of {factor} replica(s) on {len(brokers)} "
            f"broker(s), {len(turns)} of them unfenced"
        )
    # The leaders' turns carry on from `start`; the laps that vary who follows whom are
    # counted from this placement's first partition, so that each whole lap is balanced.
    first_lap = start // len(turns)
    return [
        _replicas(racks, turns[(start + i) % len(turns)], first_lap + i // len(turns), factor)
        for i in range(partitions)
    ]


def _racks(brokers: Sequence[UsableBroker]) -> list[_Rack]:
    """The racks in Kafka's order: the brokers without a rack first, then by name."""
    names = sorted({b.rack for b in brokers}, key=lambda name: (name is not None, name or ""))
    return [
        _Rack(
            unfenced=tuple(sorted(b.broker_id for b in brokers if b.rack == name and not b.fenced)),
            fenced=tuple(sorted(b.broker_id for b in brokers if b.rack == name and b.fenced)),
        )
        for name in names
    ]


def _replicas(racks: list[_Rack], turn: tuple[int, int], lap: int, factor: int) -> tuple[int, ...]:
    """One partition: its leader is the unfenced broker whose `turn` it is; its followers are
    taken going round the racks from the one after the leader's, one broker per visit."""
    home, depth = turn
    replicas = [racks[home].unfenced[depth]]
    candidates = [
        _candidates(rack, depth, lap, distance=(index - home) % len(racks))
        for index, rack in enumerate(racks)
    ]
    step = 0
    while len(replicas) < factor:
        step += 1
        broker = next(candidates[(home + step) % len(racks)], None)
        if broker is not None:
            replicas.append(broker)
    return tuple(replicas)


def _candidates(rack: _Rack, depth: int, lap: int, distance: int) -> Iterator[int]:
    """A rack's brokers in the order a partition takes them: unfenced first, each list turned
    by where the leader stands in its own rack (`depth`), how far this rack is from the
    leader's (`distance`, 0 for the leader's own rack) and how many times the leaders have gone
    round (`lap`); the turn is what spreads followers evenly and varies who follows whom."""
    if distance == 0:
        # The leader's own rack: the brokers after the leader, turned by the lap so that the
        # leader never comes round again.
        size = len(rack.unfenced)
        after = [rack.unfenced[(depth + 1 + i) % size] for i in range(size - 1)]
        yield from _turned(after, lap)
    else:
        yield from _turned(rack.unfenced, depth + distance + lap)
    yield from _turned(rack.fenced, depth + distance + lap)


def _turned(items: Sequence[int], by: int) -> list[int]:
    if not items:
        return []
    by %= len(items)
    return [*items[by:], *items[:by]]
