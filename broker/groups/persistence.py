"""Where the coordinator's records go: the partitions of `__consumer_offsets`.

`GroupLog` is the interface the service needs; `LogGroupLog` implements it on the broker's
own commit log (`broker.storage.Log`), one uncompressed batch per append, as Kafka's
coordinator writes them. A tombstone is a record with a null value, so that compaction keeps
it for `delete.retention.ms` and then drops the key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Protocol

from broker.protocol.records import Record, build_batch, iter_records
from broker.storage import Log

__all__ = ["GroupLog", "GroupLogUnavailable", "GroupLogWriteFailed", "LogGroupLog"]


class GroupLog(Protocol):
    async def append(
        self, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> int | None:
        """Write the records; the partition's offset after them (None: not tracked)."""

    async def replicated(self, partition: int, end_offset: int) -> bool:
        """Whether every in-sync replica got the partition up to `end_offset` (within the
        commit timeout): an answer that reports on a write waits for this."""

    def replay(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]: ...


class GroupLogUnavailable(Exception):
    """This node does not lead the partition (any more) or has no log for it (the topic does
    not exist yet), so its groups are not served here: a leadership that moved, as in a
    controlled shutdown, is routine, never an error. Any other failure to write is another
    exception, and the service reloads the partition from its log."""


class GroupLogWriteFailed(Exception):
    """The partition's leader, this node, refused or failed the coordinator's write (a full
    disk, a record too large): the service answers NOT_COORDINATOR and reloads the partition
    from its log, which stays the truth."""


class LogGroupLog:
    def __init__(
        self,
        log_for: Callable[[int], Log | None],
        now_ms: Callable[[], int],
        *,
        leader_epoch: Callable[[int], int] = lambda partition: 0,
        append_batch: Callable[[int, bytes], int] | None = None,
        replicated: Callable[[int, int], Awaitable[bool]] | None = None,
        leads: Callable[[int], bool] | None = None,
    ) -> None:
        """`log_for(partition)`: the partition's log, or None when `__consumer_offsets` has
        no such partition here yet (replay then finds nothing, append raises).
        `append_batch(partition, batch)`: the leader's append when the partition is
        replicated (it raises GroupLogUnavailable where this node does not lead, any other
        error where the append failed here), returning
        the offset after the batch; `replicated(partition, end_offset)`: whether the ISR got
        that far. Without them, batches go straight into the log and count as replicated.
        `leads(partition)`: whether this node leads it; a replay where it does not raises
        GroupLogUnavailable, so that a follower never serves its groups."""
        self._log_for = log_for
        self._now_ms = now_ms
        self._leader_epoch = leader_epoch
        self._append_batch = append_batch
        self._replicated = replicated
        self._leads = leads

    async def append(
        self, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> int | None:
        if not records:
            return None
        now = self._now_ms()
        batch = build_batch(
            [Record(i, now, key, value) for i, (key, value) in enumerate(records)],
            base_timestamp=now,
        )
        if self._append_batch is not None:
            return self._append_batch(partition, batch)
        log = self._log_for(partition)
        if log is None:
            raise GroupLogUnavailable("it has no log here")
        info = log.append_as_leader(batch, leader_epoch=self._leader_epoch(partition), now_ms=now)
        return info.last_offset + 1

    async def replicated(self, partition: int, end_offset: int) -> bool:
        return True if self._replicated is None else await self._replicated(partition, end_offset)

    def replay(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]:
        """Every keyed record of the partition from its log start, in offset order."""
        if self._leads is not None and not self._leads(partition):
            raise GroupLogUnavailable("this node does not lead it")
        log = self._log_for(partition)
        if log is None:
            return
        for segment, position, header in log.batches(log.log_start_offset):
            if header.is_control:
                continue
            data = segment.read_batch(position, header)
            for record in iter_records(data):
                if record.key is not None and record.offset >= log.log_start_offset:
                    yield record.key, record.value
