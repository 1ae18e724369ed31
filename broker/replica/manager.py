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
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
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
from broker.protocol.records import is_compressed, read_batch_header
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

from .quota import ALL_PARTITIONS, ReplicationQuota, throttled_partitions

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
    """A partition this node holds a replica of, as leader or follower."""

    topic: str
    index: int
    log: Log
    state: PartitionState
    node_id: int
    stored_high_watermark: int = 0
    """The high watermark as replication moved it (see `high_watermark`)."""
    follower_ends: dict[int, int] = field(default_factory=dict)
    """As leader: each follower's log end offset, as its latest fetch told (absent: unknown
    since this node became leader)."""
    caught_up_ms: dict[int, int] = field(default_factory=dict)
    """As leader: when each follower was last known to have everything (steady clock)."""
    last_fetch: dict[int, tuple[int, int]] = field(default_factory=dict)
    """As leader: each follower's previous fetch, as (this log's end then, when)."""
    leader_since_ms: int = 0
    leader_start_offset: int = 0
    """As leader: the log end when this node became leader (Kafka's leader epoch start
    offset): a follower joins the ISR only once it has come that far."""
    pending_isr: tuple[int, ...] | None = None
    """An ISR this leader asked the controller for and has not seen committed yet."""
    pending_since_epoch: int = -1
    """The partition epoch `pending_isr` was asked against."""

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR, with the members a pending expansion adds: the high watermark waits for
        them too, so that a record below it is on every replica that may become leader."""
        if self.pending_isr is None:
            return self.state.isr
        return self.state.isr + tuple(r for r in self.pending_isr if r not in self.state.isr)

    @property
    def is_leader(self) -> bool:
        return self.state.leader == self.node_id

    @property
    def high_watermark(self) -> int:
        """The offset below which every in-sync replica has the records: what consumers may
        read. A leader alone in its ISR has it at its log end; otherwise replication moves it
        (`ReplicaManager.follower_fetched` on the leader, the leader's answer on a follower),
        never past this replica's log end."""
        if self.is_leader and self.maximal_isr == (self.node_id,):
            return self.log.log_end_offset
        return min(self.stored_high_watermark, self.log.log_end_offset)

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
    diverging_epoch: tuple[int, int] | None = None
    """To a follower whose log parted from the leader's: (the epoch, its end offset here) up to
    which the follower's log may be kept (KIP-595's divergence check, as in Kafka 2.7+)."""


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
        *,
        steady_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
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
        self._replicated: dict[TopicPartition, list[tuple[int, asyncio.Future[ErrorCode]]]] = {}
        """acks=all produces waiting for the high watermark to pass their batch's end."""
        self.on_append: AppendObserver | None = None
        self.on_role_change: Callable[[], None] | None = None
        """Told when this node starts or stops following some partition's leader (the replica
        fetchers then follow the new set)."""
        self.on_isr_change: Callable[[Partition, tuple[int, ...]], None] | None = None
        """Sends a led partition's wanted ISR to the active controller (AlterPartition); the
        answer comes back as a metadata change, or as `isr_change_failed`."""
        self.min_insync_replicas: Callable[[str], int] = lambda topic: int(
            self._topic_setting(topic, "min.insync.replicas", "1")
        )
        """A topic's `min.insync.replicas` (the node resolves it through the broker's
        settings too: `MetadataService.min_insync_replicas`)."""
        self.replica_lag_time_max_ms = 30_000
        """`replica.lag.time.max.ms`: an in-sync follower that has not fetched up to the log
        end for this long leaves the ISR."""
        self._steady = steady_ms
        self.leader_quota = ReplicationQuota()
        """`leader.replication.throttled.rate`: what this leader sends to throttled replicas
        that are catching up (`broker.replica.quota`)."""
        self.follower_quota = ReplicationQuota()
        """`follower.replication.throttled.rate`: what this follower fetches for its throttled
        replicas while they are out of the ISR."""

    def now_ms(self) -> int:
        return self._clock()

    # -- following the metadata -------------------------------------------------------------

    def apply(self, change: Change) -> None:
        if isinstance(change, PartitionChanged):
            self._partition_changed(change)
        elif isinstance(change, TopicRemoved):
            for index in change.topic.partitions:
                self.partitions.pop((change.topic.name, index), None)
                self._delete_log((change.topic.name, index))
                self._wake((change.topic.name, index))
                self._not_leader_any_more((change.topic.name, index))
            self._roles_changed()
        elif isinstance(change, ConfigChanged):
            self._reconfigure(change)

    def _partition_changed(self, change: PartitionChanged) -> None:
        key = (change.topic.name, change.partition)
        if self.node_id not in change.state.replicas:
            if key in self.partitions:
                del self.partitions[key]
                self._delete_log(key)
                self._not_leader_any_more(key)
                self._roles_changed()
            return
        existing = self.partitions.get(key)
        if existing is not None:
            old, high_watermark = existing.state, existing.high_watermark
            existing.state = change.state
            # What this replica knew to be committed stays so, whatever changed.
            existing.stored_high_watermark = max(existing.stored_high_watermark, high_watermark)
            if change.state.partition_epoch != existing.pending_since_epoch:
                existing.pending_isr = None  # answered: the partition changed
            if old.leader != change.state.leader or old.leader_epoch != change.state.leader_epoch:
                self._new_leader(existing)
            elif existing.is_leader:
                self._advance_high_watermark(existing)  # the ISR may have changed
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
        partition = Partition(key[0], key[1], log_, change.state, self.node_id)
        partition.leader_since_ms = self._steady()
        partition.leader_start_offset = log_.log_end_offset
        if partition.is_leader:
            self._record_epoch(partition)
        # Until replication says more, a replica knows committed what was when it stopped (the
        # replication checkpoint; its log start if there is none); the high watermark then
        # moves with the leader's. A leader alone has everything committed.
        partition.stored_high_watermark = log_.loaded_high_watermark
        log_.committed = lambda: partition.high_watermark
        self.partitions[key] = partition
        if not partition.is_leader:
            self._roles_changed()

    def _new_leader(self, partition: Partition) -> None:
        """The partition's leader or leader epoch changed. A new leader starts with no
        knowledge of its followers and the high watermark it had (as Kafka's does); a replica
        that stopped leading fails its acks=all waiters."""
        key = (partition.topic, partition.index)
        partition.follower_ends = {}
        partition.caught_up_ms = {}
        partition.pending_isr = None
        partition.last_fetch = {}
        if partition.is_leader:
            partition.leader_since_ms = self._steady()
            partition.leader_start_offset = partition.log.log_end_offset
            self._record_epoch(partition)
            self._advance_high_watermark(partition)
        else:
            self._not_leader_any_more(key)
        self._wake(key)
        self._roles_changed()

    def _record_epoch(self, partition: Partition) -> None:
        """A new leader's epoch starts at its log end, in its epoch cache at once (Kafka's
        makeLeader): a follower's divergence is judged against it before any append."""
        try:
            partition.log.epochs.assign(partition.leader_epoch, partition.log.log_end_offset)
        except OSError as exc:
            self.log_dir_failed(partition.topic, partition.index, exc)

    def _roles_changed(self) -> None:
        if self.on_role_change is not None:
            self.on_role_change()

    def followed(self) -> dict[TopicPartition, Partition]:
        """The partitions this node follows a live leader of (for the replica fetchers)."""
        return {
            key: p for key, p in self.partitions.items() if not p.is_leader and p.state.leader >= 0
        }

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

    def get_leader(self, topic: str, index: int) -> Partition | ErrorCode:
        """The partition if this node leads it (produce, consumer fetches, offsets): a follower
        answers NOT_LEADER_OR_FOLLOWER, as in Kafka, and the client asks where the leader is."""
        found = self.get(topic, index)
        if isinstance(found, Partition) and not found.is_leader:
            return ErrorCode.not_leader_or_follower
        return found

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
            for _, future in self._replicated.pop(key, ()):
                if not future.done():
                    future.set_result(ErrorCode.kafka_storage_error)
        self._roles_changed()

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
        found = self.get_leader(topic, index)
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

    def read_for_follower(
        self,
        topic: str,
        index: int,
        replica_id: int,
        offset: int,
        max_bytes: int,
        *,
        min_one_batch: bool,
        current_leader_epoch: int,
        last_fetched_epoch: int,
    ) -> FetchResult:
        """A follower's fetch, on the leader: records up to the log end (not the high
        watermark), after checking that the follower's log has not parted from this one's; the
        fetch offset is the follower's log end, which may move the high watermark."""
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return FetchResult(found)
        partition = found
        if replica_id not in partition.state.replicas:
            return FetchResult(ErrorCode.not_leader_or_follower)
        stale = _epoch_error(partition, current_leader_epoch)
        if stale is not None:
            return FetchResult(stale)
        log_ = partition.log
        result = FetchResult(ErrorCode.none, -1, log_.log_start_offset)
        if last_fetched_epoch >= 0:
            # Kafka's divergence check: where the follower's last epoch ends here.
            epoch, end = log_.end_offset_for_epoch(last_fetched_epoch)
            result.high_watermark = partition.high_watermark
            if epoch < 0 or end < 0:
                # No epoch this old or older here: the follower starts over from this log.
                result.error = ErrorCode.offset_out_of_range
                return result
            if end < offset or epoch < last_fetched_epoch:
                result.diverging_epoch = (epoch, end)
                return result
        if offset > log_.log_end_offset or offset < log_.log_start_offset:
            result.error = ErrorCode.offset_out_of_range
            result.high_watermark = partition.high_watermark
            return result
        self.follower_fetched(partition, replica_id, offset)
        result.high_watermark = partition.high_watermark
        throttled = (
            self.leader_quota.limit is not None
            and replica_id not in partition.state.isr
            and self._throttled(partition, "leader.replication.throttled.replicas")
        )
        now = self._steady() / 1000
        if throttled and self.leader_quota.exceeded(now):
            return result  # nothing for it this time (Kafka's shouldLeaderThrottle)
        try:
            result.records = log_.read(offset, max_bytes, min_one_batch=min_one_batch)
        except OffsetOutOfRange:
            result.error = ErrorCode.offset_out_of_range
        if throttled and result.records is not None:
            self.leader_quota.record(result.records.size, now)
        return result

    def _throttled(self, partition: Partition, setting: str) -> bool:
        """Whether the topic's `setting` (`leader.` or `follower.replication.throttled.
        replicas`) throttles this partition's replica on this broker."""
        value = self.image.topic_config(partition.topic).get(setting)
        if not value:
            return False
        throttled = throttled_partitions(value, self.node_id)
        return throttled is ALL_PARTITIONS or partition.index in throttled

    def follower_throttled(self, partition: Partition) -> bool:
        """As a follower: hold this partition out of the next fetch (Kafka's
        shouldFollowerThrottle): it is out of the ISR, throttled, and over the rate."""
        return (
            self.follower_quota.limit is not None
            and self.node_id not in partition.state.isr
            and self._throttled(partition, "follower.replication.throttled.replicas")
            and self.follower_quota.exceeded(self._steady() / 1000)
        )

    def follower_took(self, partition: Partition, size: int) -> None:
        """As a follower: `size` bytes fetched for `partition` count against the follower
        rate if the partition is throttled and out of the ISR."""
        if (
            self.follower_quota.limit is not None
            and self.node_id not in partition.state.isr
            and self._throttled(partition, "follower.replication.throttled.replicas")
        ):
            self.follower_quota.record(size, self._steady() / 1000)

    def follower_fetched(self, partition: Partition, replica_id: int, offset: int) -> None:
        """A follower fetched from `offset`: it has everything before it."""
        if replica_id == self.node_id:
            return
        partition.follower_ends[replica_id] = offset
        # Kafka's Replica.updateFetchState: caught up now if it fetched from the log end, or
        # as of its previous fetch if it has come as far as the log end was then.
        now, end = self._steady(), partition.log.log_end_offset
        previous = partition.last_fetch.get(replica_id)
        if offset >= end:
            partition.caught_up_ms[replica_id] = now
        elif previous is not None and offset >= previous[0]:
            partition.caught_up_ms[replica_id] = max(
                partition.caught_up_ms.get(replica_id, 0), previous[1]
            )
        partition.last_fetch[replica_id] = (end, now)
        if (
            replica_id not in partition.state.isr
            and partition.pending_isr is None
            and offset >= partition.high_watermark
            and offset >= partition.leader_start_offset
            and self._isr_eligible(replica_id)
        ):
            # Caught up (Kafka's isFollowerInSync): it joins the ISR.
            wanted = tuple(
                r for r in partition.state.replicas if r in partition.state.isr or r == replica_id
            )
            self._ask_isr(partition, wanted)
        self._advance_high_watermark(partition)

    def _isr_eligible(self, replica_id: int) -> bool:
        """Kafka's isReplicaIsrEligible: a fenced broker, or one shutting down, does not
        join an ISR (the controller would refuse it: INELIGIBLE_REPLICA)."""
        broker = self.image.brokers.get(replica_id)
        return broker is None or not (broker.fenced or broker.in_controlled_shutdown)

    def check_isr(self) -> None:
        """Every led partition: in-sync followers that have not fetched up to the log end for
        `replica.lag.time.max.ms` (stopped, slow, or partitioned away) leave the ISR, so the
        high watermark and acks=all go on without them."""
        now = self._steady()
        for partition in list(self.partitions.values()):
            if not partition.is_leader or partition.pending_isr is not None:
                continue
            if len(partition.state.isr) <= 1:
                continue
            lagging = {
                r
                for r in partition.state.isr
                if r != self.node_id
                and now - partition.caught_up_ms.get(r, partition.leader_since_ms)
                > self.replica_lag_time_max_ms
            }
            if lagging:
                log.info(
                    "%s-%d: replicas %s have not caught up for %d ms; shrinking the ISR",
                    partition.topic,
                    partition.index,
                    sorted(lagging),
                    self.replica_lag_time_max_ms,
                )
                self._ask_isr(partition, tuple(r for r in partition.state.isr if r not in lagging))

    def _ask_isr(self, partition: Partition, wanted: tuple[int, ...]) -> None:
        if self.on_isr_change is None or wanted == partition.state.isr:
            return
        # The high watermark as it stands is kept: a leader alone had it at its log end.
        partition.stored_high_watermark = partition.high_watermark
        partition.pending_isr = wanted
        partition.pending_since_epoch = partition.state.partition_epoch
        self.on_isr_change(partition, wanted)

    def isr_change_failed(self, partition: Partition, wanted: tuple[int, ...]) -> None:
        """The controller refused this ISR for certain: the next fetch or check may ask again.
        (An unanswered request stays pending and is sent again: it may have been committed.)"""
        if partition.pending_isr == wanted:
            partition.pending_isr = None

    def _advance_high_watermark(self, partition: Partition) -> None:
        """On the leader: the high watermark moves up to the least log end among the ISR
        (never down), then acks=all produces and consumers waiting for it are told."""
        if not partition.is_leader:
            return
        ends = [partition.log.log_end_offset]
        for replica in partition.maximal_isr:
            if replica != self.node_id:
                ends.append(partition.follower_ends.get(replica, -1))
        candidate = min(ends)
        key = (partition.topic, partition.index)
        if candidate > partition.stored_high_watermark:
            partition.stored_high_watermark = candidate
            self._wake(key)
        waiting = self._replicated.get(key)
        if waiting:
            self._complete_replicated(partition, waiting)

    def _complete_replicated(
        self, partition: Partition, waiting: list[tuple[int, asyncio.Future[ErrorCode]]]
    ) -> None:
        high_watermark = partition.high_watermark
        still = []
        for end, future in waiting:
            if future.done():
                continue
            if end <= high_watermark:
                future.set_result(ErrorCode.none)
            else:
                still.append((end, future))
        key = (partition.topic, partition.index)
        if still:
            self._replicated[key] = still
        else:
            self._replicated.pop(key, None)

    def _not_leader_any_more(self, key: TopicPartition) -> None:
        for _, future in self._replicated.pop(key, ()):
            if not future.done():
                future.set_result(ErrorCode.not_leader_or_follower)

    def replicated_now(self, topic: str, index: int, end_offset: int) -> ErrorCode | None:
        """`wait_for_replication`'s answer if there is nothing to wait for (the high watermark
        has passed `end_offset` already: a leader alone in its ISR, or followers that were
        quick), without a task or a turn of the event loop; None when it must wait."""
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return found
        if found.high_watermark < end_offset:
            return None
        if len(found.maximal_isr) < self.min_insync_replicas(topic):
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    async def wait_for_replication(
        self, topic: str, index: int, end_offset: int, timeout: float
    ) -> ErrorCode:
        """acks=all: wait until every in-sync replica has the records before `end_offset`
        (the high watermark passed it). REQUEST_TIMED_OUT after `timeout` seconds (the
        produce's own), NOT_LEADER_OR_FOLLOWER if this node stops leading meanwhile,
        NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR is then below min.insync.replicas."""
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return found
        partition = found
        if partition.high_watermark < end_offset:
            future: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
            self._replicated.setdefault((topic, index), []).append((end_offset, future))
            try:
                error = await asyncio.wait_for(asyncio.shield(future), max(timeout, 0))
            except TimeoutError:
                self._forget_waiter((topic, index), future)
                return ErrorCode.request_timed_out
            except asyncio.CancelledError:
                self._forget_waiter((topic, index), future)
                raise
            if error != ErrorCode.none:
                return error
        min_isr = self.min_insync_replicas(topic)
        if len(partition.maximal_isr) < min_isr:
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    def _forget_waiter(self, key: TopicPartition, future: asyncio.Future[ErrorCode]) -> None:
        future.cancel()
        waiting = self._replicated.get(key)
        if waiting is not None:
            waiting[:] = [(end, f) for end, f in waiting if f is not future]
            if not waiting:
                del self._replicated[key]

    # -- as a follower ----------------------------------------------------------------------

    def append_from_leader(
        self, partition: Partition, records: bytes, leader_high_watermark: int
    ) -> AppendResult:
        """A follower appends what its leader sent (offsets and epochs as the leader wrote
        them) and takes the leader's high watermark, up to its own log end."""
        key = (partition.topic, partition.index)
        log_ = partition.log
        if records and log_.log_end_offset == log_.log_start_offset:
            # An empty log restarted at the leader's log start, which DeleteRecords may have
            # put inside a batch: start where that batch does (Kafka's follower does too).
            first = read_batch_header(records)
            if first.base_offset < log_.log_end_offset <= first.last_offset:
                log_.truncate_fully_and_start_at(first.base_offset, self._clock())
        if records:
            info = self._guarded(
                partition.topic,
                partition.index,
                lambda: partition.log.append_as_follower(records, now_ms=self._clock()),
            )
            if isinstance(info, AppendResult):
                return info
        if leader_high_watermark > partition.stored_high_watermark:
            partition.stored_high_watermark = leader_high_watermark
            self._wake(key)
        return AppendResult(ErrorCode.none)

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
        found = self.get_leader(topic, index)
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
        found = self.get_leader(topic, index)
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
