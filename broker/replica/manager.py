"""The replica manager: the partitions this node hosts, and appends, reads and offsets on them.

It follows the metadata image (a partition assigned to this node gets a log; a deleted topic
loses its logs; changed configs reach the logs) and maps storage errors to Kafka error codes.
The high watermark is the offset every in-sync replica has; with this node the only replica,
as on a single node, it is the log end offset. Consumers never read past it.

`on_append`, when set (the metrics), hears of every produce append once it is decided: the topic,
the result and the size of the record batches in bytes — once per partition, never per record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from broker.metadata import (
    TOPIC_RESOURCE,
    ConfigChanged,
    MetadataImage,
    PartitionChanged,
    PartitionState,
    TopicRemoved,
)
from broker.metadata.image import Change
from broker.protocol.errors import ErrorCode
from broker.protocol.records import is_compressed
from broker.storage import (
    AppendInfo,
    CorruptRecordError,
    FileSlice,
    InvalidProducerEpoch,
    InvalidRecord,
    InvalidTimestamp,
    Log,
    LogConfig,
    LogDirFailure,
    LogManager,
    LogOffline,
    OffsetOutOfRange,
    OutOfOrderSequence,
    PendingAppend,
    RecordTooLarge,
    StorageError,
)

__all__ = [
    "EARLIEST_LOCAL_TIMESTAMP",
    "EARLIEST_PENDING_UPLOAD_TIMESTAMP",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIERED_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "OFFLOAD_BYTES",
    "AppendObserver",
    "AppendResult",
    "FetchResult",
    "OffsetResult",
    "Partition",
    "ReplicaManager",
]

log = logging.getLogger(__name__)

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
"""KIP-405: the first offset still on local disk. Without tiered storage that is the log start."""
LATEST_TIERED_TIMESTAMP = -5
"""KIP-1005: the last offset copied to remote storage; -1 (none) without tiered storage."""
EARLIEST_PENDING_UPLOAD_TIMESTAMP = -6
"""KIP-1023: the first offset not yet copied to remote storage; -1 without tiered storage."""

TopicPartition = tuple[str, int]

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
    (InvalidTimestamp, ErrorCode.invalid_timestamp),
    (LogOffline, ErrorCode.kafka_storage_error),
    (StorageError, ErrorCode.kafka_storage_error),
)
"""What an append's refusal or failure answers (InvalidRecord and I/O errors have their own)."""
_REFUSALS: tuple[type[Exception], ...] = (
    InvalidRecord,
    LogDirFailure,
    OSError,
    *(kind for kind, _ in _ERRORS),
)


@dataclass(slots=True)
class Partition:
    topic: str
    index: int
    log: Log
    state: PartitionState

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: ErrorCode
    info: AppendInfo | None = None
    message: str | None = None
    batch_index: int | None = None
    """The record (by its index in the batch) an INVALID_RECORD is about, if one is."""


AppendObserver = Callable[[str, AppendResult, int], None]
"""Told of each produce append: topic, result, and the record batches' size in bytes."""


@dataclass(slots=True)
class FetchResult:
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: FileSlice | None = None


@dataclass(frozen=True, slots=True)
class OffsetResult:
    error: ErrorCode
    offset: int = -1
    timestamp: int = -1
    leader_epoch: int = -1


class ReplicaManager:
    def __init__(
        self,
        node_id: int,
        logs: LogManager,
        image: MetadataImage,
        log_config: Callable[[str], LogConfig],
        clock: Callable[[], int],
    ) -> None:
        self.node_id = node_id
        self.logs = logs
        self.image = image
        self._log_config = log_config
        self._clock = clock
        self.partitions: dict[TopicPartition, Partition] = {}
        self._waiters: dict[TopicPartition, set[asyncio.Future[None]]] = {}
        self._appending: dict[TopicPartition, asyncio.Event] = {}
        """Partitions with an append on threads under way, set when it is done."""
        self._finishing: set[TopicPartition] = set()
        """Partitions whose cancelled append's write is still to be taken in."""
        self.on_append: AppendObserver | None = None

    # -- following the metadata -------------------------------------------------------------

    def apply(self, change: Change) -> None:
        if isinstance(change, PartitionChanged):
            self._partition_changed(change)
        elif isinstance(change, TopicRemoved):
            for index in change.topic.partitions:
                self.partitions.pop((change.topic.name, index), None)
                self._delete_log((change.topic.name, index))
                self._wake((change.topic.name, index))
        elif isinstance(change, ConfigChanged):
            self._reconfigure(change)

    def _partition_changed(self, change: PartitionChanged) -> None:
        key = (change.topic.name, change.partition)
        if self.node_id not in change.state.replicas:
            if key in self.partitions:
                del self.partitions[key]
                self._delete_log(key)
            return
        existing = self.partitions.get(key)
        if existing is not None:
            existing.state = change.state
            return
        if key in self.logs.offline:
            return  # it could not be loaded: it answers KAFKA_STORAGE_ERROR (see `get`)
        try:
            log_ = self.logs.create_log(*key, self._clock(), self._log_config(key[0]))
        except (OSError, StorageError) as exc:
            # The metadata is committed whatever the disk says: this partition is offline
            # here (out of descriptors, a full or failed disk) and the rest carries on.
            log.error("cannot create the log of %s-%d, it is offline: %s", *key, exc)
            self.logs.offline[key] = f"cannot create its log: {type(exc).__name__}: {exc}"
            return
        self.partitions[key] = Partition(key[0], key[1], log_, change.state)

    def _delete_log(self, key: TopicPartition) -> None:
        """Delete a partition's log; a disk that refuses leaves it as a stray, which the next
        start deletes again, instead of failing the metadata change that removed it."""
        try:
            self.logs.delete_log(*key, self._clock())
        except (OSError, StorageError) as exc:
            log.error("cannot delete the log of %s-%d (retried at the next start): %s", *key, exc)

    def _reconfigure(self, change: ConfigChanged) -> None:
        topics: Iterable[str]
        if change.resource_type == TOPIC_RESOURCE:
            topics = (change.resource_name,)
        else:
            topics = {tp[0] for tp in self.partitions}
        for topic in topics:
            config = self._log_config(topic)
            for (name, _), partition in self.partitions.items():
                if name == topic:
                    partition.log.update_config(config)

    def remove_strays(self) -> None:
        """After replay: delete logs on disk whose topic no longer exists (deleted while this
        node was down), as Kafka does with stray logs."""
        for (topic, index), _ in self.logs:
            if (topic, index) not in self.partitions:
                log.info("deleting stray log %s-%d", topic, index)
                self._delete_log((topic, index))

    def get(self, topic: str, index: int) -> Partition | ErrorCode:
        partition = self.partitions.get((topic, index))
        if partition is not None:
            return partition
        topic_state = self.image.topics.get(topic)
        if topic_state is None or index not in topic_state.partitions:
            return ErrorCode.unknown_topic_or_partition
        if (topic, index) in self.logs.offline:
            return ErrorCode.kafka_storage_error
        return ErrorCode.not_leader_or_follower

    # -- produce ----------------------------------------------------------------------------

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
        gone = self.get(topic, index)
        result = self._guarded(topic, index, pending.finish)
        if isinstance(gone, ErrorCode) and isinstance(result, AppendResult):
            return AppendResult(gone)  # deleted or moved while the batch was written
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
        found = self.get(topic, index)
        if isinstance(found, ErrorCode):
            return AppendResult(found)
        partition = found
        if acks == -1:
            min_isr = int(self._topic_setting(topic, "min.insync.replicas", "1"))
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
                ErrorCode.invalid_record, message=str(exc), batch_index=exc.batch_index
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

    def _topic_setting(self, topic: str, name: str, default: str) -> str:
        return self.image.topic_config(topic).get(name, default)

    # -- fetch ------------------------------------------------------------------------------

    def read(
        self,
        topic: str,
        index: int,
        offset: int,
        max_bytes: int,
        *,
        min_one_batch: bool,
        current_leader_epoch: int = -1,
    ) -> FetchResult:
        found = self.get(topic, index)
        if isinstance(found, ErrorCode):
            return FetchResult(found)
        partition = found
        stale = _epoch_error(partition, current_leader_epoch)
        if stale is not None:
            return FetchResult(stale)
        log_ = partition.log
        high_watermark = partition.high_watermark
        result = FetchResult(ErrorCode.none, high_watermark, log_.log_start_offset)
        try:
            result.records = log_.read(
                offset, max_bytes, max_offset=high_watermark, min_one_batch=min_one_batch
            )
        except OffsetOutOfRange:
            result.error = ErrorCode.offset_out_of_range
        return result

    async def wait_for_append(self, partitions: list[TopicPartition], timeout: float) -> None:
        """Return when any of `partitions` is appended to (or deleted), or after `timeout`."""
        if timeout <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in partitions:
            self._waiters.setdefault(key, set()).add(future)
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            pass
        finally:
            for key in partitions:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiters[key]

    def _wake(self, key: TopicPartition) -> None:
        waiting = self._waiters.pop(key, None)
        if waiting:
            for future in waiting:
                if not future.done():
                    future.set_result(None)

    # -- offsets ----------------------------------------------------------------------------

    def list_offset(
        self, topic: str, index: int, timestamp: int, current_leader_epoch: int = -1
    ) -> OffsetResult:
        found = self.get(topic, index)
        if isinstance(found, ErrorCode):
            return OffsetResult(found)
        partition = found
        stale = _epoch_error(partition, current_leader_epoch)
        if stale is not None:
            return OffsetResult(stale)
        log_ = partition.log
        high_watermark = partition.high_watermark
        if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            # No tiered storage: the local log is the whole log, as Kafka's UnifiedLog answers
            # EARLIEST_LOCAL when remote storage is off.
            offset = log_.log_start_offset
            return OffsetResult(ErrorCode.none, offset, -1, log_.epochs.epoch_for_offset(offset))
        if timestamp == LATEST_TIMESTAMP:
            return OffsetResult(ErrorCode.none, high_watermark, -1, partition.leader_epoch)
        if timestamp in (LATEST_TIERED_TIMESTAMP, EARLIEST_PENDING_UPLOAD_TIMESTAMP):
            # Nothing is ever tiered: Kafka without remote storage answers offset, timestamp and
            # leader epoch -1 (no error).
            return OffsetResult(ErrorCode.none)
        if timestamp == MAX_TIMESTAMP:
            best = log_.max_timestamp_record()
            if best is None or best[0] >= high_watermark:
                return OffsetResult(ErrorCode.none)
            return OffsetResult(ErrorCode.none, *best)
        if timestamp < 0:
            return OffsetResult(ErrorCode.unsupported_version)
        found_offset = log_.offset_for_timestamp(timestamp)
        if found_offset is None or found_offset[0] >= high_watermark:
            return OffsetResult(ErrorCode.none)
        offset, record_timestamp, epoch = found_offset
        return OffsetResult(ErrorCode.none, offset, record_timestamp, epoch)

    def delete_records(self, topic: str, index: int, offset: int) -> tuple[ErrorCode, int]:
        """DeleteRecords: (error, new low watermark). Offset -1 means the high watermark."""
        found = self.get(topic, index)
        if isinstance(found, ErrorCode):
            return found, -1
        partition = found
        target = partition.high_watermark if offset == -1 else offset
        if target < 0 or target > partition.high_watermark:
            return ErrorCode.offset_out_of_range, -1
        try:
            return ErrorCode.none, self.logs.delete_records(topic, index, target)
        except OffsetOutOfRange:
            return ErrorCode.offset_out_of_range, -1


def _epoch_error(partition: Partition, current_leader_epoch: int) -> ErrorCode | None:
    """KIP-320: a client that knows an older leader epoch is fenced, one that knows a newer
    epoch than this replica has is ahead of it; -1 means the client does not say."""
    if current_leader_epoch < 0 or current_leader_epoch == partition.leader_epoch:
        return None
    if current_leader_epoch < partition.leader_epoch:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.unknown_leader_epoch
