"""The verdict on one topic incarnation: what its producers were told against what its
partitions hold. Pure: the ledger's sends and the records read back go in, a verdict comes
out; nothing here talks to a cluster.

The checks, each a list of evidence (empty when it holds):

- `lost`: an acknowledged record is not in its partition;
- `duplicated`: a record (acknowledged or not) is in its partition more than once, twice
  under one producer id and epoch (or where the batches were not looked at): the broker
  failed to deduplicate a retry;
- `duplicated_across_epochs`: a record is there more than once, each copy under another
  producer epoch (or id). The idempotent producer deduplicates within one epoch only: when
  librdkafka cannot tell whether a record it sent was written (OUT_OF_ORDER_SEQUENCE_NUMBER
  from a new leader that lacks the batch before it), it bumps its epoch (KIP-360) and sends
  the record again with a new sequence number. That is the client's behaviour, reported apart;
- `wrong_topic`: a record of another topic, of an earlier (or later) topic of the same name,
  or of another partition;
- `unknown`: a value this run never sent to this incarnation (not a stamp, or a sequence
  number the ledger does not have);
- `moved`: an acknowledged record is not at the offset its acknowledgement gave (the
  committed log was rewritten under it);
- `out_of_order`: acknowledged records of a partition are not in the order they were sent
  (the producer's order: sequence numbers grow in the order records were handed to it).

A record whose send failed may or may not be there (the broker may have written it before the
client gave up); once is fine, twice is a duplicate.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tests.faults.stamps import Incarnation, Send, parse_stamp

__all__ = ["CHECKS", "ProducerMark", "Verdict", "check", "duplicates"]

CHECKS = (
    "lost",
    "duplicated",
    "duplicated_across_epochs",
    "wrong_topic",
    "unknown",
    "moved",
    "out_of_order",
)

ProducerMark = tuple[int, int, int]
"""The producer id, producer epoch and sequence number a record's batch carries."""


@dataclass
class Verdict:
    incarnation: str
    acknowledged: int
    failed: int
    read: int
    failed_but_written: int
    """Sends reported failed whose record is there once: allowed, and worth knowing."""
    problems: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CHECKS})

    @property
    def ok(self) -> bool:
        return not any(self.problems.values())

    def counts(self) -> dict[str, int]:
        return {check: len(evidence) for check, evidence in self.problems.items()}

    def summary(self) -> str:
        failing = ", ".join(f"{c} {n}" for c, n in self.counts().items() if n)
        return (
            f"{self.incarnation}: {self.acknowledged} acknowledged, {self.failed} failed "
            f"({self.failed_but_written} written anyway), {self.read} read: " + (failing or "ok")
        )

    def as_json(self, evidence: int = 50) -> dict[str, object]:
        """The verdict with at most `evidence` lines of evidence per check."""
        return {
            "incarnation": self.incarnation,
            "acknowledged": self.acknowledged,
            "failed": self.failed,
            "read": self.read,
            "failed_but_written": self.failed_but_written,
            "ok": self.ok,
            "counts": self.counts(),
            "evidence": {c: lines[:evidence] for c, lines in self.problems.items() if lines},
        }


def check(
    incarnation: Incarnation,
    sends: Mapping[int, Send],
    records: Mapping[int, Sequence[tuple[int, bytes | None]]],
    marks: Mapping[tuple[int, int], ProducerMark] | None = None,
) -> Verdict:
    """`sends` by sequence number; `records` by partition, each (offset, value) in offset
    order, read from the partition's log start to its high watermark; `marks` by (partition,
    offset), the batches' producer ids and epochs where they were looked at (`duplicates`
    says where to look)."""
    verdict = Verdict(
        str(incarnation),
        acknowledged=sum(1 for s in sends.values() if s.acknowledged),
        failed=sum(1 for s in sends.values() if not s.acknowledged),
        read=sum(len(r) for r in records.values()),
        failed_but_written=0,
    )
    problems = verdict.problems
    found: dict[int, list[tuple[int, int]]] = defaultdict(list)  # sequence -> (partition, offset)
    for partition, partition_records in sorted(records.items()):
        where = f"{incarnation.topic}-{partition}"
        last_acknowledged: tuple[int, int] | None = None  # (offset, sequence)
        for offset, value in partition_records:
            stamp = parse_stamp(value)
            if stamp is None:
                problems["unknown"].append(f"{where}@{offset}: {value!r} is not this run's")
                continue
            if stamp.incarnation != incarnation or stamp.partition != partition:
                problems["wrong_topic"].append(
                    f"{where}@{offset}: {value!r} was sent to {stamp.incarnation}-{stamp.partition}"
                )
                continue
            send = sends.get(stamp.sequence)
            if send is None:
                problems["unknown"].append(f"{where}@{offset}: {value!r} was never sent here")
                continue
            found[stamp.sequence].append((partition, offset))
            if not send.acknowledged:
                continue
            if last_acknowledged is not None and last_acknowledged[1] > stamp.sequence:
                problems["out_of_order"].append(
                    f"{where}@{offset}: sequence {stamp.sequence} after sequence "
                    f"{last_acknowledged[1]} at offset {last_acknowledged[0]}"
                )
            last_acknowledged = (offset, stamp.sequence)
    for sequence, send in sorted(sends.items()):
        places = found.get(sequence, [])
        if len(places) > 1:
            known = [(marks or {}).get(place) for place in places]
            at = ", ".join(
                f"{incarnation.topic}-{p}@{o}"
                + ("" if mark is None else f" (producer {mark[0]} epoch {mark[1]} seq {mark[2]})")
                for (p, o), mark in zip(places, known, strict=True)
            )
            state = (
                f"acknowledged at {_clock(send)}"
                if send.acknowledged
                else f"failed ({send.error}) at {_clock(send)}"
            )
            epochs = {mark[:2] for mark in known if mark is not None}
            across = None not in known and len(epochs) == len(places)
            problems["duplicated_across_epochs" if across else "duplicated"].append(
                f"sequence {sequence} ({state}) at {at}"
            )
        acknowledged_at = (send.partition, send.offset)
        if send.acknowledged and places and send.offset >= 0 and acknowledged_at not in places:
            at = ", ".join(f"{incarnation.topic}-{p}@{o}" for p, o in places)
            problems["moved"].append(
                f"sequence {sequence} was acknowledged at {incarnation.topic}-"
                f"{send.partition}@{send.offset} ({_clock(send)}), found at {at}"
            )
        if send.acknowledged and not places:
            problems["lost"].append(
                f"sequence {sequence} acknowledged at {incarnation.topic}-{send.partition}"
                f"@{send.offset} ({_clock(send)}), not there"
            )
        if not send.acknowledged and len(places) == 1:
            verdict.failed_but_written += 1
    return verdict


def _clock(send: Send) -> str:
    """When the send was settled, in UTC as the nodes' logs have it."""
    moment = datetime.datetime.fromtimestamp(send.settled_at, datetime.UTC)
    return moment.strftime("%H:%M:%S.%f")[:-3]


def duplicates(
    records: Mapping[int, Sequence[tuple[int, bytes | None]]],
) -> set[tuple[int, int]]:
    """(partition, offset) of every copy of a stamp found more than once: where `check` wants
    `marks`."""
    places: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for partition, partition_records in records.items():
        for offset, value in partition_records:
            if value is not None and parse_stamp(value) is not None:
                places[value].append((partition, offset))
    return {place for copies in places.values() if len(copies) > 1 for place in copies}
