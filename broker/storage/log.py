"""One partition's log: an ordered run of segments in `<log dir>/<topic>-<partition>/`.

What it owns: offsets (log start, log end, recovery point), appends as leader (assigning offsets
by patching batch headers) and as follower (offsets already assigned), reads as file slices,
lookups by offset, timestamp and leader epoch, truncation, roll, retention and flushing; and it
keeps its idempotent producers' state (`producer_state`) in step with all of these: a leader
checks each batch with a producer id before writing it, a duplicate is answered with its original
offsets, a snapshot is written on roll and on close, and a load or truncation rebuilds the state.
What it never does: networking, replication decisions, or reading a clock — the caller passes
`now_ms`, so every time-based rule is tested without waiting.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import NamedTuple

from broker.protocol.errors import MalformedInput
from broker.protocol.records import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    check_batch,
    iter_batches,
    read_batch_header,
)

from .cleaner import complete_interrupted_swaps
from .config import LogConfig
from .epochs import LeaderEpochCache
from .errors import (
    CorruptRecordError,
    LogDirFailure,
    LogOffline,
    OffsetOutOfRange,
    RecordTooLarge,
)
from .files import fsync_file
from .producer_state import (
    PRODUCER_ID_EXPIRATION_MS,
    BatchMetadata,
    ProducerStateManager,
)
from .segments import DELETED_SUFFIX, FileSlice, LogSegment, write_one
from .validation import check_client_batch, check_max_timestamp, prepare

__all__ = ["AppendInfo", "Log", "PendingAppend", "parse_partition_dir"]

_PREFIX = struct.Struct(">qii")
_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_SEGMENT_LOG = re.compile(r"^(?P<base>\d{20})\.log$")


def parse_partition_dir(name: str) -> tuple[str, int]:
    """`orders-3` → ("orders", 3); raises ValueError for anything else."""
    match = _PARTITION_DIR.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a <topic>-<partition> directory")
    return match["topic"], int(match["partition"])


class AppendInfo(NamedTuple):
    """What a produce response reports about an append.

    `duplicate`: the batch was a producer's retry of one already in the log, so nothing was
    written; the offsets and max timestamp are those of the original, and `record_count` is 0.
    The produce response is the same as for a fresh append (error NONE, the original base
    offset), as in Kafka."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_start_offset: int
    record_count: int
    duplicate: bool = False
    log_append_time: int = -1
    """The broker time the batches were stamped with, on a `LogAppendTime` topic."""


class _Planned(NamedTuple):
    """A single batch's append up to its write (`Log._plan_one`)."""

    segment: LogSegment
    position: int
    prefix: bytes
    size: int
    header: BatchHeader
    first_offset: int
    now_ms: int


class PendingAppend:
    """One batch being appended with its write on another thread (`Log.start_append`).

    `write` may run on any thread: it writes through a descriptor of its own, so a segment
    closed meanwhile (topic deleted, log dir failed, shutdown) is never written through a
    descriptor number reused by another file. `finish` must run on the log's own thread."""

    __slots__ = ("_fd", "_log", "_view", "_written", "planned")

    def __init__(self, log: Log, planned: _Planned, view: memoryview) -> None:
        self._log = log
        self.planned = planned
        self._view = view
        self._fd = os.dup(planned.segment.fd)
        self._written: int | OSError | None = None

    def write(self) -> None:
        try:
            self._written = write_one(
                self._fd, self._view, self.planned.prefix, self.planned.position
            )
        finally:
            os.close(self._fd)
            self._fd = -1

    def finish(self) -> AppendInfo:
        """Take the written batch into the log (or raise as `append_as_leader` would)."""
        if self._fd >= 0:  # never written (the caller gave up): let go of the descriptor
            os.close(self._fd)
            self._fd = -1
        return self._log._finish_pending(self, self._written)


class Log:
    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        *,
        now_ms: int,
        clean_shutdown: bool = True,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        high_watermark: int = 0,
        producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
    ) -> None:
        """`producer_id_expiration_ms`: Kafka's `producer.id.expiration.ms`, how long an idle
        producer's state is kept (applied on load and by `remove_expired_producers`).
        `high_watermark`: as the replication checkpoint last had it."""
        self.directory = directory
        self.topic, self.partition = parse_partition_dir(directory.name)
        self.topic_id: uuid.UUID | None = None
        """The topic this log was created for (its `partition.metadata`, set by the log
        manager); None for a log from before topic ids."""
        self.config = config
        directory.mkdir(parents=True, exist_ok=True)
        self.epochs = LeaderEpochCache(directory)
        self.segments: list[LogSegment] = []
        self._bases: list[int] = []
        self.recovered_bytes = 0
        self._load(now_ms, clean_shutdown, recovery_point, log_start_offset)
        self.log_start_offset = min(
            max(log_start_offset, self.segments[0].base_offset), self.log_end_offset
        )
        self.epochs.truncate_from_end(self.log_end_offset)
        # A checkpoint written after retention may not have reached the disk (it is written
        # on the flush thread): its epochs below the log start go again here.
        self.epochs.truncate_from_start(self.log_start_offset)
        if not clean_shutdown:
            # What recovery kept is now the log: make it durable before serving it.
            for segment in self.segments:
                if segment.next_offset > recovery_point:
                    segment.flush()
        self.recovery_point = self.log_end_offset
        self.loaded_high_watermark = max(
            self.log_start_offset, min(high_watermark, self.log_end_offset)
        )
        """The high watermark the replication checkpoint had, within this log's offsets:
        where a replica of it starts (Kafka's `replication-offset-checkpoint`)."""
        self.committed: Callable[[], int] | None = None
        """The high watermark as replication moves it, once a replica manager holds this log:
        retention deletes only below it, and the log manager checkpoints it. None: every
        record counts as committed (a log no replica manager holds)."""
        self._unflushed_records = 0
        self._last_flush_ms = now_ms
        self._flusher: Executor | None = None
        self.flushing: Future[None] | None = None
        """The newest `flush.messages`/`flush.ms` flush under way on the flush thread."""
        self._pending: PendingAppend | None = None
        """The one append whose write is under way on another thread (`start_append`)."""
        self._flushes: list[tuple[Future[None], int, str]] = []
        """Background writes under way, each with the recovery point it makes true (-1: none)
        and what it is."""
        # After the recovery flush: a snapshot written here describes data already on disk.
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.producer_state = ProducerStateManager(directory)
        self._reload_producer_state()
        self.remove_expired_producers(now_ms)

    def _reload_producer_state(self) -> None:
        self.producer_state.load(
            self.log_start_offset,
            self.log_end_offset,
            lambda start: (header for _, _, header in self.batches(start)),
        )

    # -- loading and recovery ----------------------------------------------------------------

    def _load(
        self, now_ms: int, clean_shutdown: bool, recovery_point: int, log_start_offset: int
    ) -> None:
        for leftover in self.directory.iterdir():
            if leftover.name.endswith((DELETED_SUFFIX, ".cleaned", ".tmp")):
                leftover.unlink()
        complete_interrupted_swaps(self.directory)
        bases = sorted(
            int(m["base"])
            for m in (_SEGMENT_LOG.match(p.name) for p in self.directory.iterdir())
            if m is not None
        )
        for base in bases:
            self._add_segment(LogSegment(self.directory, base, self.config, now_ms))
        if not self.segments:
            segment = LogSegment(self.directory, log_start_offset, self.config, now_ms)
            segment.next_offset = log_start_offset
            self._add_segment(segment)
            return
        for i, segment in enumerate(self.segments):
            needs_recovery = not clean_shutdown and (
                i == len(self.segments) - 1 or self.segments[i + 1].base_offset > recovery_point
            )
            if needs_recovery:
                cut = segment.recover()
                self.recovered_bytes += cut
                # Past the recovery point, a new epoch's checkpoint may not have reached the
                # disk (it is written on the flush thread): the batches say where it began.
                for _, header in segment.batches():
                    self.epochs.assign(header.partition_leader_epoch, header.base_offset)
                if cut:
                    # Nothing after a torn or corrupt batch can be trusted to follow on.
                    for later in self.segments[i + 1 :]:
                        self.recovered_bytes += later.size
                        later.delete()
                    del self.segments[i + 1 :]
                    del self._bases[i + 1 :]
                    break
            else:
                segment.load_clean()

    def _add_segment(self, segment: LogSegment) -> None:
        self.segments.append(segment)
        self._bases.append(segment.base_offset)

    # -- offsets --------------------------------------------------------------------------

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.active_segment.next_offset

    @property
    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self.segments)

    # -- appending ------------------------------------------------------------------------

    def append_as_leader(self, records: bytes, *, leader_epoch: int, now_ms: int) -> AppendInfo:
        """Validate the batches, assign them the next offsets and stamp the leader epoch.

        The topic's config may first rewrite them (`validation.prepare`): recompression to
        `compression.type`, or `LogAppendTime` stamps, reported back in `log_append_time`."""
        if self._pending is not None:
            raise RuntimeError(f"{self}: an append is already under way")
        if self.config.rewrites_batches:
            records = prepare(records, self.config, now_ms)
            if self.config.log_append_time:
                info = self._append_as_leader(records, leader_epoch, now_ms)
                return info if info.duplicate else info._replace(log_append_time=now_ms)
        return self._append_as_leader(records, leader_epoch, now_ms)

    def _append_as_leader(self, records: bytes, leader_epoch: int, now_ms: int) -> AppendInfo:
        view = memoryview(records)
        if len(view) >= BATCH_HEADER_SIZE:
            # One batch per partition is what producers send: its own, leaner path.
            try:
                header = read_batch_header(view)
            except MalformedInput as exc:
                raise CorruptRecordError(str(exc)) from exc
            if header.batch_length + LOG_OVERHEAD == len(view):
                return self._append_one(view, header, leader_epoch, now_ms)
        batches = self._validated(view)
        log_end_offset = next_offset = self.segments[-1].next_offset
        assigned: list[tuple[int, BatchHeader]] = []
        prefixes: list[bytes] = []
        idempotent = False
        compacted = self.config.compact
        for position, header in batches:
            check_max_timestamp(view, position, header, self.config, now_ms)
            check_client_batch(view, position, header, compacted=compacted)
            count = header.last_offset_delta + 1
            prefixes.append(_PREFIX.pack(next_offset, header.batch_length, leader_epoch))
            assigned.append((position, _with_offsets(header, next_offset, leader_epoch)))
            next_offset += count
            idempotent |= header.producer_id >= 0
        if idempotent:
            duplicate = self.producer_state.check_all([(h, h.base_offset) for _, h in assigned])
            if duplicate is not None:
                return self._duplicate(duplicate)
        self.epochs.assign(leader_epoch, log_end_offset)
        info = self._append(view, assigned, prefixes, now_ms)
        if idempotent:
            self._update_producer_state(assigned)
        return info

    def _duplicate(self, batch: BatchMetadata) -> AppendInfo:
        """What a producer's retry of a batch already in the log gets: the original's offsets."""
        has_timestamp = batch.max_timestamp > -1
        return AppendInfo(
            batch.first_offset,
            batch.last_offset,
            batch.max_timestamp if has_timestamp else -1,
            batch.last_offset if has_timestamp else batch.first_offset,
            self.log_start_offset,
            0,
            True,
        )

    def _update_producer_state(self, batches: list[tuple[int, BatchHeader]]) -> None:
        for _, header in batches:
            if header.producer_id >= 0:
                self.producer_state.update(header, header.base_offset)

    def _append_one(
        self, view: memoryview, header: BatchHeader, leader_epoch: int, now_ms: int
    ) -> AppendInfo:
        """`append_as_leader` for a request holding exactly one batch, without the lists."""
        planned = self._plan_one(view, header, leader_epoch, now_ms, prechecked=False)
        if isinstance(planned, AppendInfo):
            return planned
        segment = planned.segment
        written = write_one(segment.fd, view, planned.prefix, planned.position)
        return self._finish_one(planned, written)

    def _plan_one(
        self,
        view: memoryview,
        header: BatchHeader,
        leader_epoch: int,
        now_ms: int,
        *,
        prechecked: bool,
    ) -> _Planned | AppendInfo:
        """Everything of a single batch's append before the write: its checks, its offsets,
        the roll it may need. A producer's retry of a batch in the log returns its AppendInfo.
        `prechecked`: `precheck` passed (the CRC and the record walk)."""
        size = self._check(view, 0, header, crc=not prechecked)
        if size > self.config.segment_bytes:
            raise RecordTooLarge(f"{size} bytes do not fit in segment.bytes")
        # The header's check first: a late batch is walked once, to name its late records.
        check_max_timestamp(view, 0, header, self.config, now_ms)
        if not prechecked:
            check_client_batch(view, 0, header, compacted=self.config.compact)
        segment = self.segments[-1]
        first_offset = segment.next_offset
        if header.producer_id >= 0:
            duplicate = self.producer_state.check(header, first_offset)
            if duplicate is not None:
                return self._duplicate(duplicate)
        last_offset = first_offset + header.last_offset_delta
        self.epochs.assign(leader_epoch, first_offset)
        if (
            segment.should_roll(size, now_ms, header.max_timestamp)
            or last_offset - segment.base_offset > 2**31 - 1
        ):
            segment = self.roll(now_ms, first_offset)
        prefix = _PREFIX.pack(first_offset, header.batch_length, leader_epoch)
        return _Planned(segment, segment.size, prefix, size, header, first_offset, now_ms)

    def _finish_one(self, planned: _Planned, written: int | OSError) -> AppendInfo:
        header, first_offset = planned.header, planned.first_offset
        last_offset = first_offset + header.last_offset_delta
        planned.segment.finish_one(
            planned.position, written, planned.size, header.max_timestamp, last_offset
        )
        if header.producer_id >= 0:
            self.producer_state.update(header, first_offset)
        count = header.last_offset_delta + 1
        self._unflushed_records += count
        has_timestamp = header.max_timestamp > -1
        info = AppendInfo(  # positional: this runs once per produced batch
            first_offset,
            last_offset,
            header.max_timestamp if has_timestamp else -1,
            last_offset if has_timestamp else first_offset,
            self.log_start_offset,
            count,
        )
        self.maybe_flush(planned.now_ms)
        return info

    # -- appending with the write on another thread -----------------------------------------

    def single_batch(self, records: bytes) -> bool:
        """Whether `start_append` can leave the write of `records` to another thread: exactly
        one batch, on a topic that keeps batches as they come."""
        if self.config.rewrites_batches or len(records) < BATCH_HEADER_SIZE:
            return False
        try:
            header = read_batch_header(memoryview(records))
        except MalformedInput:
            return False
        return header.batch_length + LOG_OVERHEAD == len(records)

    def precheck(self, records: bytes, now_ms: int) -> None:
        """The checks of a single batch (`single_batch`) that read only its bytes, for any
        thread before `start_append`: the CRC, and Kafka's record walk (`check_client_batch`),
        which decompresses a compressed batch: a megabyte of zstd can hold a million records,
        and walking them takes the loop 140 ms. Raises as `append_as_leader` would."""
        view = memoryview(records)
        try:
            header = read_batch_header(view)
        except MalformedInput as exc:
            raise CorruptRecordError(str(exc)) from exc
        # Cheapest first, as the one-step append: the sizes, the CRC, the header's timestamp,
        # and only then the walk that may decompress.
        if self._check(view, 0, header) > self.config.segment_bytes:
            raise RecordTooLarge(f"{header.size} bytes do not fit in segment.bytes")
        check_max_timestamp(view, 0, header, self.config, now_ms)
        check_client_batch(view, 0, header, compacted=self.config.compact)

    @property
    def appending(self) -> bool:
        """A `PendingAppend` is under way: no other append may start until it finishes."""
        return self._pending is not None

    def start_append(
        self, records: bytes, *, leader_epoch: int, now_ms: int
    ) -> PendingAppend | AppendInfo:
        """`append_as_leader` for one batch (`single_batch`) that passed `precheck` (on any
        thread), with the write left to `PendingAppend.write` on
        another thread: a large batch's copy into the page cache, and the wait when the kernel
        throttles writers, then do not hold the caller's thread. Everything else happens here
        and now (checks, offsets, roll); `PendingAppend.finish`, back on this thread, takes
        the batch in and returns its AppendInfo. A producer's retry of a batch in the log gets
        its AppendInfo at once."""
        if self._pending is not None:
            raise RuntimeError(f"{self}: an append is already under way")
        view = memoryview(records)
        try:
            header = read_batch_header(view)
        except MalformedInput as exc:
            raise CorruptRecordError(str(exc)) from exc
        planned = self._plan_one(view, header, leader_epoch, now_ms, prechecked=True)
        if isinstance(planned, AppendInfo):
            return planned
        try:
            self._pending = PendingAppend(self, planned, view)
        except OSError:
            # No descriptor to spare for the thread (EMFILE): write here, as the one-step
            # append does, rather than call the disk failed.
            written = write_one(planned.segment.fd, view, planned.prefix, planned.position)
            return self._finish_one(planned, written)
        return self._pending

    def _finish_pending(self, pending: PendingAppend, written: int | OSError | None) -> AppendInfo:
        self._pending = None
        if written is None:
            raise LogOffline(f"{self}: the batch was never written")
        if pending.planned.segment.closed:
            # Deleted, closed for shutdown, or its dir failed while the batch was written.
            raise LogOffline(f"{self} was closed while a batch was being written to it")
        return self._finish_one(pending.planned, written)

    def append_as_follower(self, records: bytes, *, now_ms: int) -> AppendInfo:
        """Append batches that already carry their offsets and epochs (replication)."""
        view = memoryview(records)
        batches = self._validated(view)
        expected = self.log_end_offset
        for position, header in batches:
            if header.base_offset < expected:
                raise CorruptRecordError(
                    f"batch at byte {position} starts at offset {header.base_offset}, "
                    f"below the log end offset {expected}"
                )
            expected = header.next_offset
        # Only batches that will be written may change the epoch cache.
        for _, header in batches:
            self.epochs.assign(header.partition_leader_epoch, header.base_offset)
        prefixes = [bytes(view[p : p + _PREFIX.size]) for p, _ in batches]
        info = self._append(view, batches, prefixes, now_ms)
        # As in Kafka, a follower records what its leader accepted, without checking it.
        self._update_producer_state(batches)
        return info

    def _validated(self, view: memoryview) -> list[tuple[int, BatchHeader]]:
        try:
            batches = list(iter_batches(view))
        except MalformedInput as exc:
            raise CorruptRecordError(str(exc)) from exc
        if not batches:
            raise CorruptRecordError("no record batch to append")
        total = 0
        for position, header in batches:
            total += self._check(view, position, header)
        if total > self.config.segment_bytes:
            raise RecordTooLarge(f"{total} bytes do not fit in segment.bytes")
        return batches

    def _check(
        self, view: memoryview, position: int, header: BatchHeader, *, crc: bool = True
    ) -> int:
        """The checks every appended batch passes (whole, CRC, size); returns its size.
        `crc=False`: the caller checked the CRC already (`start_append`)."""
        size = header.batch_length + LOG_OVERHEAD
        if size > self.config.max_message_bytes:
            # Before the CRC, as Kafka's validation: a batch too large is not read through.
            raise RecordTooLarge(
                f"batch at byte {position} is {size} bytes, more than "
                f"max.message.bytes={self.config.max_message_bytes}"
            )
        if crc:
            try:
                check_batch(view, position, header)
            except MalformedInput as exc:
                raise CorruptRecordError(str(exc)) from exc
        elif position + header.size > len(view):
            raise CorruptRecordError(f"batch of {header.size} bytes is truncated")
        return size

    def _append(
        self,
        view: memoryview,
        batches: list[tuple[int, BatchHeader]],
        prefixes: list[bytes],
        now_ms: int,
    ) -> AppendInfo:
        first = batches[0][1]
        total = records = 0
        max_timestamp, offset_of_max = -1, first.base_offset
        for _, header in batches:
            total += header.batch_length
            records += header.records_count
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
                offset_of_max = header.base_offset + header.last_offset_delta
        total += LOG_OVERHEAD * len(batches)
        last = batches[-1][1]
        last_offset = last.base_offset + last.last_offset_delta
        segment = self.segments[-1]
        if (
            segment.should_roll(total, now_ms, max_timestamp)
            or last_offset - segment.base_offset > 2**31 - 1
        ):
            segment = self.roll(now_ms, first.base_offset)
        segment.append(view, batches, prefixes)
        self._unflushed_records += records
        info = AppendInfo(
            first_offset=first.base_offset,
            last_offset=last_offset,
            max_timestamp=max_timestamp,
            offset_of_max_timestamp=offset_of_max,
            log_start_offset=self.log_start_offset,
            record_count=records,
        )
        self.maybe_flush(now_ms)
        return info

    def roll(self, now_ms: int, base_offset: int | None = None) -> LogSegment:
        """Start a new active segment at the log end offset; fsync the one it replaces."""
        base = self.log_end_offset if base_offset is None else max(base_offset, self.log_end_offset)
        previous = self.active_segment
        if previous.size == 0 and previous.base_offset == base:
            return previous
        fsyncs: Callable[[], None] | None = None
        if self.flusher is None or previous.size == 0:
            previous.flush()
            # Every segment before the new one is now on disk: recovery can start from here.
            self.recovery_point = max(self.recovery_point, previous.next_offset)
        else:
            fsyncs = previous.flush_detached()
        if previous.size == 0:
            # An empty segment carries nothing: replace it rather than leave a hole.
            self.segments.pop()
            self._bases.pop()
            previous.delete()
        segment = LogSegment(self.directory, base, self.config, now_ms)
        segment.next_offset = base
        self._add_segment(segment)
        # A restart then replays at most the new segment (Kafka snapshots at each roll).
        if fsyncs is None or self.flusher is None:
            self.producer_state.take_snapshot(base)
            return segment
        # As Kafka's roll, which schedules the old segment's flush and the snapshot's: the
        # recovery point moves once both are on disk (`complete_flushes`).
        snapshot = self.producer_state.take_snapshot(base, sync=False)
        flush = self.flusher.submit(_and_fsync(fsyncs, snapshot))
        self._flushes.append((flush, previous.next_offset, "fsync of a rolled segment"))
        return segment

    # -- flushing -------------------------------------------------------------------------

    def maybe_flush(self, now_ms: int) -> None:
        """Apply `flush.messages` and `flush.ms`; by default neither ever triggers. With a
        flush thread the fsyncs run there and the recovery point moves once they are done;
        `flushing` is then what a produce waits for before it is answered, as Kafka's append
        flushes before it returns."""
        if self._unflushed_records == 0:
            return
        if not (
            self._unflushed_records >= self.config.flush_messages
            or now_ms - self._last_flush_ms >= self.config.flush_ms
        ):
            return
        if self._flusher is None:
            self.flush(now_ms)
            return
        fsyncs = [
            segment.flush_detached()
            for segment in self.segments
            if segment.next_offset > self.recovery_point or segment is self.active_segment
        ]

        def run() -> None:
            for fsync in fsyncs:
                fsync()

        self.flushing = self._flusher.submit(run)
        self._flushes.append((self.flushing, self.log_end_offset, "flush"))
        self._unflushed_records = 0
        self._last_flush_ms = now_ms

    @property
    def flusher(self) -> Executor | None:
        """Where a rolled segment is fsynced (the log manager's flush thread), so that a roll
        does not wait for the disk, and where the leader-epoch checkpoint is written after
        retention moves the log start; None: at once, in the caller's thread."""
        return self._flusher

    @flusher.setter
    def flusher(self, executor: Executor | None) -> None:
        self._flusher = executor
        self.epochs.write_later = None if executor is None else self._write_later

    def _write_later(self, write: Callable[[], None]) -> None:
        if self._flusher is None:
            write()
            return
        self._flushes.append((self._flusher.submit(write), -1, "leader-epoch checkpoint"))

    def complete_flushes(self) -> None:
        """Take in the background fsyncs that are done: the recovery point moves past each
        segment on disk; one that failed raises LogDirFailure (the disk let it down)."""
        pending = []
        for flush, offset, what in self._flushes:
            if not flush.done():
                pending.append((flush, offset, what))
                continue
            error = flush.exception()
            if error is not None:
                self._flushes = pending
                raise LogDirFailure(f"{self.directory.name}: {what}: {error}")
            self.recovery_point = max(self.recovery_point, offset)
        self._flushes = pending

    def flush(self, now_ms: int) -> None:
        """fsync every segment holding data past the recovery point, then move it."""
        for segment in self.segments:
            if segment.next_offset > self.recovery_point or segment is self.active_segment:
                segment.flush()
        self.recovery_point = self.log_end_offset
        self._unflushed_records = 0
        self._last_flush_ms = now_ms

    # -- reading --------------------------------------------------------------------------

    def _segment_index(self, offset: int) -> int:
        return max(bisect.bisect_right(self._bases, offset) - 1, 0)

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> FileSlice | None:
        """Batches from `offset`, at most `max_bytes` (but at least one whole batch with
        `min_one_batch`), none at or past `max_offset` (the high watermark for consumers).

        None when there is nothing to read yet; `OffsetOutOfRange` outside the log.
        """
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRange(offset, self.log_start_offset, self.log_end_offset)
        if max_offset is not None and offset >= max_offset:
            return None
        for i in range(self._segment_index(offset), len(self.segments)):
            segment = self.segments[i]
            max_position = None
            if max_offset is not None and max_offset < segment.next_offset:
                max_position = segment.position_of(max_offset)
            found = segment.read(offset, max_bytes, max_position, min_one_batch)
            if found is not None:
                return found if found.size else None
        return None

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first record at or after `timestamp`."""
        for segment in self.segments:
            if segment.max_timestamp < timestamp:
                continue
            found = segment.find_offset_by_timestamp(timestamp, self.log_start_offset)
            if found is not None:
                offset, record_timestamp = found
                return offset, record_timestamp, self.epochs.epoch_for_offset(offset)
        return None

    def max_timestamp_record(self) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first record with the log's largest
        timestamp (ListOffsets MAX_TIMESTAMP, KIP-734): the segment from each segment's
        bookkeeping, then one batch read, never a scan of the log."""
        best = max(self.segments, key=lambda segment: segment.max_timestamp)
        found = best.max_timestamp_record()
        if found is None or found[0] < self.log_start_offset:
            return None
        offset, timestamp = found
        return offset, timestamp, self.epochs.epoch_for_offset(offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epochs.end_offset_for(epoch, self.log_end_offset)

    def batches(self, start_offset: int = 0) -> Iterator[tuple[LogSegment, int, BatchHeader]]:
        """Every batch from `start_offset` on, with the segment and position it lives at."""
        first = self._segment_index(start_offset)
        for i in range(first, len(self.segments)):
            segment = self.segments[i]
            start = 0
            if i == first:
                # The offset index finds where to start without reading the segment's head.
                found = segment.find_batch(start_offset)
                if found is None:
                    continue
                start = found[0]
            for position, header in segment.batches(start):
                if header.last_offset >= start_offset:
                    yield segment, position, header

    # -- truncation and log start ---------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch at or after `offset` (a follower diverged from its leader); a
        batch holding `offset` goes whole, so the log may end below `offset`, never inside a
        batch.

        The epoch cache loses the epochs that start at or after the new log end even when no
        record goes (Kafka's truncateTo): a replica elected leader that wrote nothing before
        the next election keeps an epoch starting at its log end that no other replica has;
        left there, its every fetch says that epoch, the leader answers with the same
        DivergingEpoch, and the cut to the same offset changes nothing, forever."""
        if offset >= self.log_end_offset:
            self.epochs.truncate_from_end(self.log_end_offset)
            return
        while len(self.segments) > 1 and self.active_segment.base_offset >= offset:
            self.segments.pop().delete()
            self._bases.pop()
        self.active_segment.truncate_to(offset)
        self.epochs.truncate_from_end(self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
        self._reload_producer_state()

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        """Empty the log and restart it at `offset` (a follower too far behind its leader)."""
        for segment in self.segments:
            segment.delete()
        self.segments, self._bases = [], []
        self._add_segment(LogSegment(self.directory, offset, self.config, now_ms))
        self.active_segment.next_offset = offset
        self.epochs.clear()
        self.log_start_offset = offset
        self.recovery_point = offset
        self.producer_state.truncate_fully()

    def delete_records(self, offset: int) -> int:
        """DeleteRecords: move the log start offset up to `offset`; returns the new start."""
        if offset < 0 or offset > self.log_end_offset:
            raise OffsetOutOfRange(offset, self.log_start_offset, self.log_end_offset)
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            self.epochs.truncate_from_start(offset)
        return self.log_start_offset

    # -- retention ------------------------------------------------------------------------

    def retention_candidates(self, now_ms: int) -> list[LogSegment]:
        """Closed segments that retention would delete now (never the active one)."""
        closed = self.segments[:-1]
        doomed: set[int] = set()
        # Segments wholly below the log start offset (DeleteRecords, or earlier retention).
        for i in range(len(closed)):
            if self.segments[i + 1].base_offset <= self.log_start_offset:
                doomed.add(i)
        if self.config.delete:
            if self.config.retention_ms >= 0:
                for i, segment in enumerate(closed):
                    if now_ms - segment.max_timestamp <= self.config.retention_ms:
                        break
                    doomed.add(i)
            if self.config.retention_bytes >= 0:
                excess = self.size_in_bytes - self.config.retention_bytes
                for i, segment in enumerate(closed):
                    if excess < segment.size:
                        break
                    excess -= segment.size
                    doomed.add(i)
        # Only what every in-sync replica has may go (Kafka's deletableSegments): a segment
        # goes once the high watermark has reached the next one.
        bound = self.log_end_offset if self.committed is None else self.committed()
        count = 0
        while count in doomed and self.segments[count + 1].base_offset <= bound:
            count += 1
        return closed[:count]

    def delete_old_segments(self, now_ms: int) -> list[LogSegment]:
        """Apply retention: the doomed segments leave the log and their files become
        `*.deleted`; the caller closes and removes them after `file.delete.delay.ms`."""
        doomed = self.retention_candidates(now_ms)
        if not doomed:
            return []
        del self.segments[: len(doomed)]
        del self._bases[: len(doomed)]
        for segment in doomed:
            segment.mark_deleted()
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        self.epochs.truncate_from_start(self.log_start_offset)
        self.producer_state.delete_snapshots_before(self.log_start_offset)
        return doomed

    def replace_segments(self, new: list[LogSegment], old: list[LogSegment]) -> None:
        """Swap `old` (consecutive segments) for `new` covering the same offsets (compaction)."""
        start = self.segments.index(old[0])
        self.segments[start : start + len(old)] = new
        self._bases = [segment.base_offset for segment in self.segments]

    # -- producers ------------------------------------------------------------------------

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Forget producers idle for `producer.id.expiration.ms` (their last batch's max
        timestamp is that old); returns their ids. The log manager calls this periodically."""
        return self.producer_state.remove_expired(now_ms, self.producer_id_expiration_ms)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self, now_ms: int) -> None:
        """Flush everything to disk, snapshot the producer state at the log end so the next
        start replays nothing, and close the files (clean shutdown)."""
        self.flush(now_ms)
        self.producer_state.take_snapshot(self.log_end_offset)
        for segment in self.segments:
            segment.close()

    def sync_to_os(self) -> None:
        for segment in self.segments:
            segment.flush_to_os()

    def update_config(self, config: LogConfig) -> None:
        """New topic settings (AlterConfigs): they apply to the active segment from now on
        and to every segment rolled later; closed segments are not rewritten."""
        self.config = config
        self.active_segment.update_config(config)

    def __repr__(self) -> str:
        return (
            f"Log({self.topic}-{self.partition}, start={self.log_start_offset}, "
            f"end={self.log_end_offset}, segments={len(self.segments)})"
        )


def _and_fsync(fsyncs: Callable[[], None], snapshot: Path | None) -> Callable[[], None]:
    """A rolled segment's fsyncs, then its producer snapshot's (if one was written)."""

    def run() -> None:
        fsyncs()
        if snapshot is not None:
            fsync_file(snapshot)

    return run


def _with_offsets(header: BatchHeader, base_offset: int, leader_epoch: int) -> BatchHeader:
    return BatchHeader._make((base_offset, header.batch_length, leader_epoch, *header[3:]))
