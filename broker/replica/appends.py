"""Appends: a produce's records onto the partition this node leads, and the guard every
append (a follower's too) runs under.

What it owns: produce appends (`append`, `append_offloaded`: large batches checked and written
on threads, one append per partition at a time, in arrival order; answered after the flush
they started), acks=all's `min.insync.replicas` check before appending, the mapping of
storage refusals and failures to Kafka error codes (`_guarded`), and taking a failed log dir's
partitions offline (`log_dir_failed`).

What it must never do: wait for replication (acks=all waits in `leader`, after the append),
decode a produce request, or let a storage exception out: every refusal is an `AppendResult`.

`on_append`, when set (the metrics), hears of every produce append once it is decided: the topic,
the result and the size of the record batches in bytes — once per partition, never per record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from broker.protocol.errors import ErrorCode
from broker.protocol.records import is_compressed
from broker.storage import (
    AppendInfo,
    CorruptRecordError,
    InvalidProducerEpoch,
    InvalidRecord,
    InvalidTimestamp,
    LogDirFailure,
    LogOffline,
    OutOfOrderSequence,
    PendingAppend,
    RecordTooLarge,
    StorageError,
)

from .leader import LeaderReplication
from .partition import AppendObserver, AppendResult, Partition, TopicPartition

__all__ = ["OFFLOAD_BYTES", "OFFLOAD_COMPRESSED_BYTES", "Appends"]

OFFLOAD_BYTES = 1024 * 1024
"""Produce record batches this large are checked and written on threads (`append_offloaded`):
an 8 MiB batch held the event loop 5 ms for its CRC and 8-15 ms for its write, more when the
kernel throttles writers of dirty pages; below this size the thread hops cost more than they
save."""
OFFLOAD_COMPRESSED_BYTES = 64 * 1024
"""A compressed batch this large too: its record walk decompresses it, and 64 KiB of zstd can
hold 80 000 records (12 ms of walking), a megabyte a million (140 ms)."""

_T = TypeVar("_T")

_ERRORS: tuple[tuple[type[Exception], ErrorCode], ...] = (
    (CorruptRecordError, ErrorCode.corrupt_message),
    (RecordTooLarge, ErrorCode.message_too_large),
    (OutOfOrderSequence, ErrorCode.out_of_order_sequence_number),
    (InvalidProducerEpoch, ErrorCode.invalid_producer_epoch),
    (LogOffline, ErrorCode.kafka_storage_error),
    (StorageError, ErrorCode.kafka_storage_error),
)
"""What an append's refusal or failure answers (InvalidRecord, InvalidTimestamp and I/O errors
have their own: the first two name their records)."""
_REFUSALS: tuple[type[Exception], ...] = (
    InvalidRecord,
    InvalidTimestamp,
    LogDirFailure,
    OSError,
    *(kind for kind, _ in _ERRORS),
)


class Appends(LeaderReplication):
    """Built on `LeaderReplication`: a failed log dir fails the acks=all produces waiting on
    its partitions."""

    _appending: dict[TopicPartition, asyncio.Event]
    """Partitions with an append on threads under way, set when it is done."""
    _finishing: set[TopicPartition]
    """Partitions whose cancelled append's write is still to be taken in."""
    on_append: AppendObserver | None

    def append(self, topic: str, index: int, records: bytes, acks: int) -> AppendResult:
        """Append on this thread, start to end. Not while `append_offloaded` writes to the same
        partition (the log refuses): produce requests go through `append_offloaded`."""
        result = self._append(topic, index, records, acks)
        if self.on_append is not None:
            self.on_append(topic, result, len(records))
        return result

    async def append_offloaded(
        self, topic: str, index: int, records: bytes, acks: int
    ) -> AppendResult:
        """A produce's append. One of `OFFLOAD_BYTES` or more has its CRC checked and its write
        done on a thread (both release the GIL), so that the event loop serves others
        meanwhile; appends to one partition still happen one at a time, in arrival order."""
        key = (topic, index)
        while (busy := self._appending.get(key)) is not None:
            await busy.wait()
        if len(records) < OFFLOAD_BYTES and not (
            len(records) >= OFFLOAD_COMPRESSED_BYTES and is_compressed(records)
        ):
            return await self._flushed(topic, index, self.append(topic, index, records, acks))
        self._appending[key] = asyncio.Event()
        try:
            result = await self._append_on_threads(topic, index, records, acks)
        finally:
            if key not in self._finishing:
                self._next_turn(key)
        if self.on_append is not None:
            self.on_append(topic, result, len(records))
        return await self._flushed(topic, index, result)

    async def _flushed(self, topic: str, index: int, result: AppendResult) -> AppendResult:
        """`result`, once the `flush.messages`/`flush.ms` flush its append started (on the
        flush thread) is done: a produce is answered after its fsync, as in Kafka."""
        partition = self.partitions.get((topic, index))
        if result.error != ErrorCode.none or partition is None:
            return result
        flushing, partition.log.flushing = partition.log.flushing, None
        if flushing is None:
            return result
        try:
            await asyncio.wrap_future(flushing)
        except OSError as exc:
            self.log_dir_failed(topic, index, exc)
            return AppendResult(ErrorCode.kafka_storage_error, message=f"flush failed: {exc}")
        return result

    async def _append_on_threads(
        self, topic: str, index: int, records: bytes, acks: int
    ) -> AppendResult:
        found = self._appendable(topic, index, acks)
        if isinstance(found, AppendResult):
            return found
        if not found.log.single_batch(records):
            return self._append(topic, index, records, acks)
        loop = asyncio.get_running_loop()
        checked = loop.run_in_executor(None, found.log.precheck, records, self._clock())
        refused = await self._guarded_async(topic, index, checked)
        if refused is not None:
            return refused
        found = self._appendable(topic, index, acks)  # it may have gone meanwhile
        if isinstance(found, AppendResult):
            return found
        log_ = found.log
        started = self._guarded(
            topic,
            index,
            lambda: log_.start_append(
                records, leader_epoch=found.leader_epoch, now_ms=self._clock()
            ),
        )
        if isinstance(started, AppendResult):
            return started
        if isinstance(started, AppendInfo):  # a producer's retry of a batch in the log
            return AppendResult(ErrorCode.none, started)
        pending = started
        written = loop.run_in_executor(None, pending.write)
        try:
            # Shielded: once the write has started it completes, and is taken in, even if
            # this request is cancelled meanwhile (the log would otherwise keep it pending).
            await asyncio.shield(written)
        except asyncio.CancelledError:
            # The partition's turn passes on only once the write is taken in: until then the
            # log refuses every other append.
            self._finishing.add((topic, index))
            written.add_done_callback(lambda _: self._finish_quietly(topic, index, pending))
            raise
        gone = self.get_leader(topic, index)
        result = self._guarded(topic, index, pending.finish)
        if isinstance(gone, ErrorCode):
            # Deleted, or no longer led here, while the batch was written: the producer goes
            # to the new leader (an idempotent one's retry is recognised there if it got it).
            return AppendResult(gone)
        return result if isinstance(result, AppendResult) else AppendResult(ErrorCode.none, result)

    def _finish_quietly(self, topic: str, index: int, pending: PendingAppend) -> None:
        try:
            self._guarded(topic, index, pending.finish)  # nobody waits for the answer
        finally:
            self._finishing.discard((topic, index))
            self._next_turn((topic, index))

    def _next_turn(self, key: TopicPartition) -> None:
        """The partition's append is done: the next one waiting may start."""
        done = self._appending.pop(key, None)
        if done is not None:
            done.set()

    def _appendable(self, topic: str, index: int, acks: int) -> Partition | AppendResult:
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return AppendResult(found)
        partition = found
        if acks == -1:
            min_isr = self.min_insync_replicas(topic)
            if len(partition.state.isr) < min_isr:
                return AppendResult(
                    ErrorCode.not_enough_replicas,
                    message=f"The size of the current ISR {len(partition.state.isr)} is "
                    f"insufficient to satisfy the min.isr requirement of {min_isr} for "
                    f"partition {topic}-{index}",
                )
        return partition

    def _append_as_leader(self, partition: Partition, records: bytes) -> AppendInfo:
        return partition.log.append_as_leader(
            records, leader_epoch=partition.leader_epoch, now_ms=self._clock()
        )

    def _append(self, topic: str, index: int, records: bytes, acks: int) -> AppendResult:
        found = self._appendable(topic, index, acks)
        if isinstance(found, AppendResult):
            return found
        info = self._guarded(topic, index, lambda: self._append_as_leader(found, records))
        return info if isinstance(info, AppendResult) else AppendResult(ErrorCode.none, info)

    async def _guarded_async(
        self, topic: str, index: int, check: Awaitable[None]
    ) -> AppendResult | None:
        """`_guarded` for a check under way on a thread: its refusal, or None if it passed."""
        try:
            await check
        except _REFUSALS as exc:
            # The traceback holds the check's frames, and they the request's records: let go
            # of them now, not when the cycle collector comes round to this frame.
            exc.__traceback__ = None
            return self._refusal(topic, index, exc)
        return None

    def _guarded(self, topic: str, index: int, append: Callable[[], _T]) -> _T | AppendResult:
        """Run `append`; a refusal or a storage failure becomes its AppendResult (an I/O
        error takes the partition's log dir offline). A success wakes the partition's fetches."""
        try:
            outcome = append()
        except _REFUSALS as exc:
            return self._refusal(topic, index, exc)
        if isinstance(outcome, AppendInfo):
            self._wake((topic, index))
        return outcome

    def _refusal(self, topic: str, index: int, exc: Exception) -> AppendResult:
        if isinstance(exc, InvalidRecord):
            return AppendResult(
                ErrorCode.invalid_record, message=str(exc), record_errors=exc.record_errors
            )
        if isinstance(exc, InvalidTimestamp):
            return AppendResult(
                ErrorCode.invalid_timestamp, message=str(exc), record_errors=exc.record_errors
            )
        if isinstance(exc, LogDirFailure | OSError):
            self.log_dir_failed(topic, index, exc)
            return AppendResult(ErrorCode.kafka_storage_error, message=str(exc))
        for kind, error in _ERRORS:
            if isinstance(exc, kind):
                return AppendResult(error, message=str(exc))
        raise exc

    def log_dir_failed(self, topic: str, index: int, exc: Exception) -> None:
        """An I/O error on a partition's disk: every partition of that log dir stops being
        served here (KAFKA_STORAGE_ERROR); the rest of the node carries on."""
        for key in self.logs.fail_dir_of(topic, index, f"{type(exc).__name__}: {exc}"):
            self.partitions.pop(key, None)
            self._wake(key)
            for _, future in self._replicated.pop(key, ()):
                if not future.done():
                    future.set_result(ErrorCode.kafka_storage_error)
        self._roles_changed()
