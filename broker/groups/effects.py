"""What the pure coordinator asks its driver to do: append records, deliver answers, and wake
it up at deadlines.

The coordinator never waits. A request that must wait (a JoinGroup parked until the
rebalance completes, a SyncGroup until the leader's assignment is written) gets a ticket; its
answer is a `Reply` that some later call puts in the outbox. The outbox is ordered: the driver
appends each `Append` to the log before it delivers any `Reply` queued after it, so an answer
that depends on a write is never sent before the write is in the log.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from broker.protocol import ErrorCode

__all__ = ["Append", "Deadlines", "Effect", "Outbox", "Reply", "Result"]

Record = tuple[bytes, bytes | None]


class Result(Protocol):
    """Every answer that goes through the outbox: it can be turned into the answer to send
    when a write it reports on did not reach the log."""

    def failed(self, error: ErrorCode) -> Result: ...


@dataclass(frozen=True, slots=True)
class Reply:
    ticket: int
    result: Result
    depends_on: frozenset[int] = frozenset()
    """The `__consumer_offsets` partitions whose earlier writes this answer reports on."""


@dataclass(frozen=True, slots=True)
class Append:
    partition: int
    records: tuple[Record, ...]


Effect = Reply | Append


class Outbox:
    def __init__(self) -> None:
        self._effects: list[Effect] = []
        self.appended = 0
        """Records queued so far: lets an operation tell whether it wrote anything."""

    def reply(self, ticket: int, result: Result, *partitions: int) -> None:
        self._effects.append(Reply(ticket, result, frozenset(partitions)))

    def append(self, partition: int, records: list[Record]) -> None:
        if not records:
            return
        self.appended += len(records)
        last = self._effects[-1] if self._effects else None
        if isinstance(last, Append) and last.partition == partition:
            self._effects[-1] = Append(partition, last.records + tuple(records))
        else:
            self._effects.append(Append(partition, tuple(records)))

    def take(self) -> list[Effect]:
        effects, self._effects = self._effects, []
        return effects


class Deadlines:
    """Named deadlines in milliseconds; scheduling a name again moves its deadline."""

    def __init__(self) -> None:
        self._due: dict[Hashable, int] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._sequence = 0

    def schedule(self, name: Hashable, at_ms: int) -> None:
        self._due[name] = at_ms
        self._sequence += 1
        heapq.heappush(self._heap, (at_ms, self._sequence, name))

    def cancel(self, name: Hashable) -> None:
        self._due.pop(name, None)

    def __contains__(self, name: Hashable) -> bool:
        return name in self._due

    def next_deadline(self) -> int | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> Hashable | None:
        """The earliest name due at `now_ms`, removed; None when nothing is due."""
        self._drop_stale()
        if not self._heap or self._heap[0][0] > now_ms:
            return None
        _, _, name = heapq.heappop(self._heap)
        del self._due[name]
        return name

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
