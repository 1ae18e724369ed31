"""Idempotent producers' state for one partition: Kafka's `ProducerStateManager`, without
transactions.

What it owns: per producer id, its epoch, the time of its last batch and the metadata of its
last five batches (first and last sequence, first and last offset, max timestamp); the checks a
leader applies to a producer's batch before writing it (a retried batch is a duplicate and keeps
its original offsets, an older epoch is fenced, a sequence must follow the last one, wrapping
from 2^31-1 to 0, and a new epoch must start at 0); and the snapshot files
`<20-digit offset>.snapshot` in the partition directory, in Kafka's format, that let a restart
skip replaying the log.

What it must never do: read segments itself (the log hands it batch headers), decide what gets
written, or read a clock: expiration takes `now_ms` and the expiration from the caller.

Kafka's rules, as of 2.5 (KIP-360) and still in 4.x for producers without transactions: a
producer id with no state here (new, expired, or whose batches retention removed) may start at
any sequence, so UNKNOWN_PRODUCER_ID is never the answer; followers and log replays record
batches without checking them.

Snapshot format (big-endian), one file per snapshot offset, the state *before* that offset:
  int16 version (1) · uint32 CRC-32C of every byte after it · int32 entry count, then per entry
  int64 producer_id · int16 epoch · int32 last_sequence · int64 last_offset · int32 offset_delta
  (last offset - first offset of the last batch) · int64 timestamp · int32 coordinator_epoch ·
  int64 current_txn_first_offset (-1: none).
A snapshot keeps only each producer's last batch, as Kafka's does; batches replayed after it
restore the rest.
"""

from __future__ import annotations

import os
import re
import struct
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import google_crc32c

from broker.protocol.records import NO_PRODUCER_EPOCH, NO_SEQUENCE, BatchHeader

from .errors import InvalidProducerEpoch, OutOfOrderSequence, StorageError
from .segments import segment_file_name

__all__ = [
    "BATCHES_TO_RETAIN",
    "PRODUCER_ID_EXPIRATION_MS",
    "SNAPSHOT_SUFFIX",
    "BatchMetadata",
    "CorruptSnapshot",
    "ProducerStateEntry",
    "ProducerStateManager",
    "read_snapshot",
    "write_snapshot",
]

BATCHES_TO_RETAIN = 5
"""Kafka keeps the last five batches per producer: a producer has at most five requests in
flight per partition (`max.in.flight.requests.per.connection` with idempotence), so any retry
is one of them."""
PRODUCER_ID_EXPIRATION_MS = 24 * 3600 * 1000
"""Kafka's `producer.id.expiration.ms` default: a producer silent this long is forgotten (and
the cleaner no longer keeps its last batch)."""
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
NO_OFFSET = -1
NO_COORDINATOR_EPOCH = -1
_SEQUENCES = 2**31
_CONTROL = 0x20
"""Attributes bit 5: a control batch (a transaction marker); `BatchHeader.is_control` without
the property call, on the path every idempotent batch takes."""
_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
_CRC_START = 6
_SNAPSHOT_FILE = re.compile(r"^(?P<offset>\d{20})\.snapshot$")


class CorruptSnapshot(StorageError):
    """A snapshot file that cannot be trusted (version, CRC, length); loading falls back to an
    older one, or to replaying the log."""


def last_sequence_of(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record: sequences wrap from 2^31-1 to 0."""
    if base_sequence < 0:
        return NO_SEQUENCE
    return (base_sequence + last_offset_delta) % _SEQUENCES


def _first_sequence_of(last_sequence: int, offset_delta: int) -> int:
    if last_sequence < 0:
        return NO_SEQUENCE
    return (last_sequence - offset_delta) % _SEQUENCES


def _in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (
        next_sequence == 0 and last_sequence == _SEQUENCES - 1
    )


class BatchMetadata(NamedTuple):
    """One of a producer's recent batches: enough to answer a retry with its original offsets."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp: int


class ProducerStateEntry:
    """What a partition knows about one producer id.

    `batches` holds the last five as (first sequence, last sequence, first offset, last offset,
    max timestamp) tuples, `BatchMetadata` without the cost of building one per append."""

    __slots__ = (
        "batches",
        "last_sequence",
        "last_timestamp",
        "next_sequence",
        "producer_epoch",
        "producer_id",
    )

    def __init__(
        self, producer_id: int, producer_epoch: int = NO_PRODUCER_EPOCH, last_timestamp: int = -1
    ) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.last_timestamp = last_timestamp
        self.batches: deque[tuple[int, int, int, int, int]] = deque(maxlen=BATCHES_TO_RETAIN)
        self.last_sequence = NO_SEQUENCE
        self.next_sequence = 0
        """The last sequence + 1: what the next batch in this epoch starts with, except across
        the wrap to 0, which the full check handles."""

    @property
    def last_offset(self) -> int:
        """Offset of the producer's last record here (the cleaner keeps that batch)."""
        return self.batches[-1][3] if self.batches else NO_OFFSET

    def recent_batches(self) -> list[BatchMetadata]:
        """The last five batches, oldest first."""
        return [BatchMetadata._make(batch) for batch in self.batches]

    def copy(self) -> ProducerStateEntry:
        entry = ProducerStateEntry(self.producer_id, self.producer_epoch, self.last_timestamp)
        entry.batches.extend(self.batches)
        entry.last_sequence = self.last_sequence
        entry.next_sequence = self.next_sequence
        return entry

    def duplicate_of(self, header: BatchHeader) -> BatchMetadata | None:
        """The recent batch `header` repeats (same epoch, same sequence range), if any."""
        if header.producer_epoch != self.producer_epoch:
            return None
        first = header.base_sequence
        last = last_sequence_of(first, header.last_offset_delta)
        for batch in self.batches:
            if batch[0] == first and batch[1] == last:
                return BatchMetadata._make(batch)
        return None

    def check(self, header: BatchHeader, first_offset: int) -> None:
        """Kafka's `checkProducerEpoch` and `checkSequence` for a batch about to be written at
        `first_offset`; raises `InvalidProducerEpoch` or `OutOfOrderSequence`."""
        epoch = header.producer_epoch
        if epoch < self.producer_epoch:
            raise InvalidProducerEpoch(
                f"producer {self.producer_id} sent epoch {epoch} at offset {first_offset}, "
                f"older than its current epoch {self.producer_epoch}",
                producer_id=self.producer_id,
                offset=first_offset,
            )
        if header.is_control:
            return
        first = header.base_sequence
        if epoch != self.producer_epoch:
            if first != 0 and self.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequence(
                    f"producer {self.producer_id} starts epoch {epoch} (after "
                    f"{self.producer_epoch}) at sequence {first}, not 0",
                    producer_id=self.producer_id,
                    offset=first_offset,
                )
        elif self.producer_epoch != NO_PRODUCER_EPOCH and not _in_sequence(
            self.last_sequence, first
        ):
            raise OutOfOrderSequence(
                f"producer {self.producer_id} (epoch {epoch}) sent sequence {first} at offset "
                f"{first_offset}; its last sequence is {self.last_sequence}",
                producer_id=self.producer_id,
                offset=first_offset,
            )

    def add(self, header: BatchHeader, first_offset: int) -> None:
        """Record a written batch (Kafka's `addBatch`); a transaction marker moves the epoch."""
        if header.producer_epoch != self.producer_epoch:
            self.producer_epoch = header.producer_epoch
            self.batches.clear()
            self.last_sequence = NO_SEQUENCE
            self.next_sequence = 0
        self.last_timestamp = header.max_timestamp
        if header.attributes & _CONTROL:
            return
        first = header.base_sequence
        delta = header.last_offset_delta
        last = (first + delta) % _SEQUENCES if first >= 0 else NO_SEQUENCE
        self.batches.append((first, last, first_offset, first_offset + delta, header.max_timestamp))
        self.last_sequence = last
        self.next_sequence = last + 1

    def add_metadata(self, batch: BatchMetadata) -> None:
        """Restore a batch read from a snapshot."""
        self.batches.append(batch)
        self.last_sequence = batch.last_sequence
        self.next_sequence = batch.last_sequence + 1

    def __repr__(self) -> str:
        return (
            f"ProducerStateEntry(id={self.producer_id}, epoch={self.producer_epoch}, "
            f"last_timestamp={self.last_timestamp}, batches={self.recent_batches()})"
        )


class ProducerStateManager:
    """The producers of one partition, and its snapshot files."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.producers: dict[int, ProducerStateEntry] = {}
        self._snapshots = sorted(
            int(m["offset"])
            for m in (_SNAPSHOT_FILE.match(p.name) for p in directory.iterdir())
            if m is not None
        )
        self.remove_later: Callable[[list[Path]], None] | None = None
        """Removes retired snapshot files elsewhere (the log manager's deletion thread)."""

    # -- a leader's checks and every append's update --------------------------------------------

    def check(self, header: BatchHeader, first_offset: int) -> BatchMetadata | None:
        """Check one batch with a producer id that a leader is about to write at `first_offset`:
        the metadata of the batch it duplicates (then it must not be written), or None if it may
        be written; raises `InvalidProducerEpoch` or `OutOfOrderSequence` otherwise."""
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return None
        if (
            header.base_sequence == entry.next_sequence
            and header.producer_epoch == entry.producer_epoch
        ):
            # What producers send nearly always: the next batch. It cannot also be a retry,
            # since five batches never span all 2^31 sequences.
            return None
        if not header.is_control:
            duplicate = entry.duplicate_of(header)
            if duplicate is not None:
                return duplicate
        entry.check(header, first_offset)
        return None

    def check_all(self, batches: Sequence[tuple[BatchHeader, int]]) -> BatchMetadata | None:
        """`check` for several batches (header, first offset) written together: each is checked
        against the state the ones before it leave; a duplicate of any means none is written."""
        pending: dict[int, ProducerStateEntry] = {}
        for header, first_offset in batches:
            producer_id = header.producer_id
            if producer_id < 0:
                continue
            current = self.producers.get(producer_id)
            if current is not None and not header.is_control:
                duplicate = current.duplicate_of(header)
                if duplicate is not None:
                    return duplicate
            entry = pending.get(producer_id)
            if entry is None:
                entry = current.copy() if current is not None else ProducerStateEntry(producer_id)
                pending[producer_id] = entry
            # An unknown producer's first batch is taken as it comes (KIP-360), as in `check`.
            if current is not None or len(entry.batches) > 0:
                entry.check(header, first_offset)
            entry.add(header, first_offset)
        return None

    def update(self, header: BatchHeader, first_offset: int) -> None:
        """Record a batch now in the log at `first_offset`, without checking it (after a leader's
        checks, and as is for followers and replays)."""
        entry = self.producers.get(header.producer_id)
        if entry is None:
            entry = self.producers[header.producer_id] = ProducerStateEntry(header.producer_id)
        entry.add(header, first_offset)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers whose last batch is `expiration_ms` old (Kafka's
        `producer.id.expiration.ms`, measured on the batches' max timestamps); their ids."""
        expired = [
            producer_id
            for producer_id, entry in self.producers.items()
            if now_ms - entry.last_timestamp >= expiration_ms
        ]
        for producer_id in expired:
            del self.producers[producer_id]
        return expired

    # -- snapshots, loading and truncation ------------------------------------------------------

    @property
    def snapshot_offsets(self) -> list[int]:
        return list(self._snapshots)

    def snapshot_path(self, offset: int) -> Path:
        return self.directory / segment_file_name(offset, SNAPSHOT_SUFFIX)

    def take_snapshot(self, offset: int, *, sync: bool = True) -> Path | None:
        """Write the state as of `offset` (the log end offset, or a new segment's base) unless
        a snapshot of that offset exists: the log before it has not changed since. With
        `sync=False` the file is not fsynced: the caller does it (`files.fsync_file`) off its
        thread, as Kafka's roll does; a crash before then leaves a torn snapshot, which `load`
        drops for the one before it. Returns the file written, if one was."""
        if offset in self._snapshots:
            return None
        path = self.snapshot_path(offset)
        write_snapshot(path, self.producers.values(), sync=sync)
        self._snapshots.append(offset)
        self._snapshots.sort()
        return path

    def delete_snapshots_before(self, offset: int) -> None:
        """Retention: snapshots of offsets below the log start describe data no longer there.
        They leave the state at once; their files are removed by `remove_later` when the log
        manager set it (its deletion thread: an unlink waits for a busy disk's journal, 60 ms
        and more on the event loop under a produce flood), else here."""
        doomed = [s for s in self._snapshots if s < offset]
        if self.remove_later is None:
            for snapshot in doomed:
                self._delete_snapshot(snapshot)
            return
        for snapshot in doomed:
            self._snapshots.remove(snapshot)
        self.remove_later([self.snapshot_path(s) for s in doomed])

    def load(
        self,
        log_start_offset: int,
        log_end_offset: int,
        batches_from: Callable[[int], Iterable[BatchHeader]],
    ) -> None:
        """Rebuild the state of the log [log start, log end): read the newest snapshot in that
        range (dropping corrupt ones and those outside it) and replay the batches after it from
        `batches_from(offset)`; then snapshot the log end if anything was replayed. Also what a
        truncation calls, so that the state rewinds with the log."""
        for snapshot in [s for s in self._snapshots if not log_start_offset <= s <= log_end_offset]:
            self._delete_snapshot(snapshot)
        self.producers = {}
        start = log_start_offset
        while self._snapshots:
            offset = self._snapshots[-1]
            try:
                entries = read_snapshot(self.snapshot_path(offset))
            except (CorruptSnapshot, OSError):
                self._delete_snapshot(offset)
                continue
            self.producers = {entry.producer_id: entry for entry in entries}
            start = offset
            break
        if start >= log_end_offset:
            return
        for header in batches_from(start):
            if header.producer_id >= 0:
                self.update(header, header.base_offset)
        self.take_snapshot(log_end_offset)

    def truncate_fully(self) -> None:
        """The log was emptied (a follower restarting from its leader's log start)."""
        self.producers = {}
        for snapshot in list(self._snapshots):
            self._delete_snapshot(snapshot)

    def _delete_snapshot(self, offset: int) -> None:
        self._snapshots.remove(offset)
        self.snapshot_path(offset).unlink(missing_ok=True)


def write_snapshot(path: Path, entries: Iterable[ProducerStateEntry], *, sync: bool = True) -> None:
    """Write a snapshot in Kafka's format: to a temporary file, fsynced, then renamed, so a crash
    leaves the old name absent or the whole file (the CRC catches anything else)."""
    body = bytearray(_HEADER.size)
    count = 0
    for entry in sorted(entries, key=lambda e: e.producer_id):
        last = BatchMetadata._make(entry.batches[-1]) if entry.batches else None
        body += _ENTRY.pack(
            entry.producer_id,
            entry.producer_epoch,
            NO_SEQUENCE if last is None else last.last_sequence,
            NO_OFFSET if last is None else last.last_offset,
            0 if last is None else last.last_offset - last.first_offset,
            entry.last_timestamp,
            NO_COORDINATOR_EPOCH,
            NO_OFFSET,
        )
        count += 1
    struct.pack_into(">i", body, _CRC_START, count)
    crc = int(google_crc32c.value(bytes(body[_CRC_START:])))
    struct.pack_into(">hI", body, 0, SNAPSHOT_VERSION, crc)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(body)
        out.flush()
        if sync:
            os.fsync(out.fileno())
    os.replace(tmp, path)


def read_snapshot(path: Path) -> list[ProducerStateEntry]:
    """The entries of a snapshot file; `CorruptSnapshot` if it is not a whole, valid one."""
    data = path.read_bytes()
    if len(data) < _HEADER.size:
        raise CorruptSnapshot(f"{path}: {len(data)} bytes cannot hold a snapshot header")
    version, crc, count = _HEADER.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshot(f"{path}: unknown snapshot version {version}")
    actual = int(google_crc32c.value(data[_CRC_START:]))
    if actual != crc:
        raise CorruptSnapshot(f"{path}: CRC mismatch: file says {crc:#010x}, data {actual:#010x}")
    if count < 0 or len(data) != _HEADER.size + count * _ENTRY.size:
        raise CorruptSnapshot(f"{path}: {len(data)} bytes do not hold {count} entries")
    entries = []
    for i in range(count):
        producer_id, epoch, last_sequence, last_offset, offset_delta, timestamp, _, _ = (
            _ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)
        )
        entry = ProducerStateEntry(producer_id, epoch, timestamp)
        if last_offset >= 0:
            entry.add_metadata(
                BatchMetadata(
                    _first_sequence_of(last_sequence, offset_delta),
                    last_sequence,
                    last_offset - offset_delta,
                    last_offset,
                    timestamp,
                )
            )
        entries.append(entry)
    return entries
