"""What clients read of a partition this node leads, by offset: consumer fetches (up to
the high watermark), ListOffsets and DeleteRecords.

What it owns: the consumer's read (`read`), the offset a ListOffsets timestamp names, special
timestamps included (`list_offset`, OFFSET_NOT_AVAILABLE from a new leader whose high watermark
has not caught up), and moving the log start for DeleteRecords (`delete_records`), each after
the leader epoch check (KIP-320).

What it must never do: show a consumer anything at or past the high watermark, or delete past
it; followers read through `leader.read_for_follower`, not here.
"""

from __future__ import annotations

from broker.protocol.errors import ErrorCode
from broker.storage import OffsetOutOfRange

from .hosted import HostedPartitions
from .partition import FetchResult, OffsetResult, Partition, epoch_error

__all__ = [
    "EARLIEST_LOCAL_TIMESTAMP",
    "EARLIEST_PENDING_UPLOAD_TIMESTAMP",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIERED_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "Offsets",
]

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
"""KIP-405: the first offset still on local disk. Without tiered storage that is the log start."""
LATEST_TIERED_TIMESTAMP = -5
"""KIP-1005: the last offset copied to remote storage; -1 (none) without tiered storage."""
EARLIEST_PENDING_UPLOAD_TIMESTAMP = -6
"""KIP-1023: the first offset not yet copied to remote storage; -1 without tiered storage."""


class Offsets(HostedPartitions):
    rack_aware_reads = False
    """`replica.selector.class` is Kafka's RackAwareReplicaSelector: a consumer that names its
    rack is pointed at a replica in that rack (KIP-392)."""

    def read(
        self,
        topic: str,
        index: int,
        offset: int,
        max_bytes: int,
        *,
        min_one_batch: bool,
        current_leader_epoch: int = -1,
        client_rack: str | None = None,
    ) -> FetchResult:
        """A consumer's read. `client_rack`: None for a fetch without client metadata (before
        v11), which only a leader serves; otherwise the consumer's rack ("" when it names
        none): a follower serves it too, up to its own high watermark, and a leader with
        rack-aware reads may point it at a replica in its rack instead (KIP-392)."""
        found = self.get(topic, index) if client_rack is not None else None
        if not isinstance(found, Partition):
            found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return FetchResult(found)
        partition = found
        stale = epoch_error(partition, current_leader_epoch)
        if stale is not None:
            return FetchResult(stale)
        log_ = partition.log
        high_watermark = partition.high_watermark
        result = FetchResult(ErrorCode.none, high_watermark, log_.log_start_offset)
        if client_rack and self.rack_aware_reads and partition.is_leader:
            preferred = self._preferred_read_replica(partition, client_rack, offset)
            if preferred is not None:
                result.preferred_read_replica = preferred
                return result
        try:
            result.records = log_.read(
                offset, max_bytes, max_offset=high_watermark, min_one_batch=min_one_batch
            )
        except OffsetOutOfRange:
            result.error = ErrorCode.offset_out_of_range
        return result

    def _preferred_read_replica(
        self, partition: Partition, client_rack: str, offset: int
    ) -> int | None:
        """Kafka's RackAwareReplicaSelector, over the replicas that could answer from
        `offset`: in the ISR, registered and unfenced, holding `offset` (their log start at
        or before it, their log end at or past it). The leader when it is in the client's
        rack or no such replica is; otherwise the one in that rack furthest ahead, then the
        one caught up most recently. None: the leader itself."""
        brokers = self.image.brokers
        leader = brokers.get(self.node_id)
        if leader is not None and leader.rack == client_rack:
            return None
        candidates = [
            replica
            for replica in partition.state.isr
            if replica != self.node_id
            and (broker := brokers.get(replica)) is not None
            and broker.rack == client_rack
            and not broker.fenced
            and partition.follower_starts.get(replica, offset + 1) <= offset
            and partition.follower_ends.get(replica, -1) >= offset
        ]
        if not candidates:
            return None
        return max(
            candidates,
            key=lambda r: (partition.follower_ends[r], partition.caught_up_ms.get(r, -1), -r),
        )

    def consumer_idle(
        self,
        topic: str,
        index: int,
        offset: int,
        *,
        leader_epoch: int,
        high_watermark: int,
        log_start_offset: int,
        from_follower: bool = False,
    ) -> bool:
        """Whether a consumer's fetch from `offset`, in a fetch session, finds nothing it was
        not told already: this node still leads in `leader_epoch` (or, for a consumer that
        may read from a follower, still holds a replica in it), nothing is readable from
        `offset` (it is at the high watermark or past it), and the high watermark and log
        start are the ones it was told."""
        partition = self.partitions.get((topic, index))
        return (
            partition is not None
            and (partition.is_leader or from_follower)
            and partition.leader_epoch == leader_epoch
            and partition.high_watermark == high_watermark
            and offset >= high_watermark
            and partition.log.log_start_offset == log_start_offset
        )

    def list_offset(
        self, topic: str, index: int, timestamp: int, current_leader_epoch: int = -1
    ) -> OffsetResult:
        """ListOffsets on this leader, as Kafka's client requests are answered: offsets below
        the high watermark only. While the high watermark is below the leader's start offset
        of its epoch, LATEST, and a timestamp or MAX_TIMESTAMP lookup that finds nothing below
        it, are OFFSET_NOT_AVAILABLE (the handler says LEADER_NOT_AVAILABLE before v5)."""
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return OffsetResult(found)
        partition = found
        stale = epoch_error(partition, current_leader_epoch)
        if stale is not None:
            return OffsetResult(stale)
        log_ = partition.log
        high_watermark = partition.high_watermark
        # Kafka's fetchOffsetForTimestamp: a new leader keeps the high watermark it had as a
        # follower, which may be below one the old leader answered. Until it reaches where this
        # epoch began, an answer bounded by it is OFFSET_NOT_AVAILABLE (retriable) instead, so
        # that LATEST never goes back; EARLIEST and the tiered lookups do not depend on it.
        behind = (
            ErrorCode.offset_not_available
            if high_watermark < partition.leader_start_offset
            else ErrorCode.none
        )
        if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            # No tiered storage: the local log is the whole log, as Kafka's UnifiedLog answers
            # EARLIEST_LOCAL when remote storage is off.
            offset = log_.log_start_offset
            return OffsetResult(ErrorCode.none, offset, -1, log_.epochs.epoch_for_offset(offset))
        if timestamp == LATEST_TIMESTAMP:
            if behind != ErrorCode.none:
                return OffsetResult(behind)
            return OffsetResult(ErrorCode.none, high_watermark, -1, partition.leader_epoch)
        if timestamp in (LATEST_TIERED_TIMESTAMP, EARLIEST_PENDING_UPLOAD_TIMESTAMP):
            # Nothing is ever tiered: Kafka without remote storage answers offset, timestamp and
            # leader epoch -1 (no error).
            return OffsetResult(ErrorCode.none)
        if timestamp == MAX_TIMESTAMP:
            best = log_.max_timestamp_record()
            if best is None or best[0] >= high_watermark:
                return OffsetResult(behind)
            return OffsetResult(ErrorCode.none, *best)
        if timestamp < 0:
            return OffsetResult(ErrorCode.unsupported_version)
        found_offset = log_.offset_for_timestamp(timestamp)
        if found_offset is None or found_offset[0] >= high_watermark:
            return OffsetResult(behind)
        offset, record_timestamp, epoch = found_offset
        return OffsetResult(ErrorCode.none, offset, record_timestamp, epoch)

    def delete_records(self, topic: str, index: int, offset: int) -> tuple[ErrorCode, int]:
        """DeleteRecords on this leader: (error, its new log start). Offset -1 means the high
        watermark. The answer waits for the other replicas too (`wait_for_low_watermark`)."""
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return found, -1
        partition = found
        target = partition.high_watermark if offset == -1 else offset
        if target < 0 or target > partition.high_watermark:
            return ErrorCode.offset_out_of_range, -1
        try:
            start = self.logs.delete_records(topic, index, target)
        except OffsetOutOfRange:
            return ErrorCode.offset_out_of_range, -1
        self._wake((topic, index))  # fetch sessions tell their followers of the new log start
        return ErrorCode.none, start
