"""What each record of the run says about itself, and the ledger of what was sent.

A record's value is its stamp: the topic and the topic's incarnation it was sent to, its
partition and a sequence number unique in the whole run. A topic deleted and created again is
a new incarnation under the same name, so a record read back names the topic it was written
to, whatever the broker serves it as.

The ledger is written by the producers' delivery callbacks (in the workload's thread, or in
the thread that flushes a producer) and read by the checker once an incarnation's producer is
closed; one lock guards it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Incarnation", "Ledger", "Send", "Stamp", "parse_stamp"]

_PREFIX = b"faults"


@dataclass(frozen=True, slots=True, order=True)
class Incarnation:
    """A topic as one CreateTopics made it: a name and the how-many-th topic of that name."""

    topic: str
    number: int

    def __str__(self) -> str:
        return f"{self.topic}#{self.number}"


@dataclass(frozen=True, slots=True)
class Stamp:
    incarnation: Incarnation
    partition: int
    sequence: int

    def value(self) -> bytes:
        fields = (self.incarnation.topic, self.incarnation.number, self.partition, self.sequence)
        return b"|".join([_PREFIX, *(str(each).encode() for each in fields)])

    def key(self) -> bytes:
        """The partition key: one per partition, as a keyed producer's records would be."""
        return b"key-%d" % self.partition


def parse_stamp(value: bytes | None) -> Stamp | None:
    """The stamp a value carries, or None for a value this run did not write."""
    if value is None:
        return None
    parts = value.split(b"|")
    if len(parts) != 5 or parts[0] != _PREFIX:
        return None
    try:
        topic = parts[1].decode()
        number, partition, sequence = int(parts[2]), int(parts[3]), int(parts[4])
    except (UnicodeDecodeError, ValueError):
        return None
    return Stamp(Incarnation(topic, number), partition, sequence)


@dataclass(slots=True)
class Send:
    """One record handed to a producer: pending until its delivery report, then acknowledged
    (with the offset the leader gave it) or failed (with the error's name)."""

    partition: int
    acknowledged: bool = False
    offset: int = -1
    error: str | None = None
    settled_at: float = 0.0
    """When its delivery report came (seconds since the epoch): to line evidence up with the
    faults and the nodes' logs."""

    @property
    def pending(self) -> bool:
        return not self.acknowledged and self.error is None


@dataclass
class Ledger:
    """Every record sent, by incarnation and sequence number; counts survive an incarnation's
    records being dropped (`forget`) once it has been checked."""

    _sends: dict[Incarnation, dict[int, Send]] = field(default_factory=dict)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    acknowledged: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def send(self, incarnation: Incarnation, partition: int) -> Stamp:
        """A new stamp, recorded as pending before the producer gets it."""
        with self._lock:
            self._next += 1
            self._sends.setdefault(incarnation, {})[self._next] = Send(partition)
            return Stamp(incarnation, partition, self._next)

    def unsent(self, stamp: Stamp) -> None:
        """The producer refused the record (its queue was full): it was never sent."""
        with self._lock:
            del self._sends[stamp.incarnation][stamp.sequence]

    def delivered(self, stamp: Stamp, error: str | None, offset: int) -> None:
        with self._lock:
            send = self._sends[stamp.incarnation][stamp.sequence]
            send.settled_at = time.time()
            if error is None:
                send.acknowledged, send.offset = True, offset
                self.acknowledged += 1
            else:
                send.error = error
                self.failed += 1
                self.errors[error] += 1

    def sends(self, incarnation: Incarnation) -> Mapping[int, Send]:
        """A copy of what was sent to `incarnation`, by sequence number."""
        with self._lock:
            return dict(self._sends.get(incarnation, {}))

    def forget(self, incarnation: Incarnation) -> None:
        with self._lock:
            self._sends.pop(incarnation, None)
