"""Storage errors. Kafka error codes are chosen by the handlers; these say what went wrong."""

from __future__ import annotations

__all__ = [
    "CorruptRecordError",
    "InvalidProducerEpoch",
    "InvalidRecord",
    "InvalidTimestamp",
    "LogDirFailure",
    "LogOffline",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "ProducerStateError",
    "RecordTooLarge",
    "StorageError",
]


class StorageError(Exception):
    """Base of the storage layer's errors."""


class CorruptRecordError(StorageError):
    """A batch offered for append fails validation (CRC, magic, offsets): CORRUPT_MESSAGE."""


class InvalidRecord(StorageError):
    """A batch whose records break Kafka's rules for what a client may write (LogValidator): a
    control batch, a keyless record on a compacted topic, a record count or structure that does
    not match the batch, a producer id with a negative sequence: INVALID_RECORD (87).
    `batch_index` is the record that broke a per-record rule, else None."""

    def __init__(self, message: str, batch_index: int | None = None) -> None:
        super().__init__(message)
        self.batch_index = batch_index


class InvalidTimestamp(StorageError):
    """A record's CreateTime lies outside `message.timestamp.before.max.ms` /
    `message.timestamp.after.max.ms` of the broker's clock: INVALID_TIMESTAMP (32)."""


class RecordTooLarge(StorageError):
    """A batch is larger than the segment can hold (`segment.bytes`): RECORD_TOO_LARGE."""


class OffsetOutOfRange(StorageError):
    """A read or DeleteRecords names an offset outside [log start, log end]."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} is outside [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class LogDirFailure(StorageError):
    """An I/O error (a full or failing disk) under a log dir. What was half-written has been
    cut off; the dir's partitions go offline (KAFKA_STORAGE_ERROR) and the dir gets no
    clean-shutdown marker, so its next load recovers."""


class LogOffline(StorageError):
    """A partition's log could not be loaded; it is offline until an operator intervenes."""


class ProducerStateError(StorageError):
    """A batch from an idempotent producer that its producer state refuses; nothing was written.

    `producer_id` names the producer, `offset` the offset the batch would have taken."""

    def __init__(self, message: str, *, producer_id: int, offset: int) -> None:
        super().__init__(message)
        self.producer_id = producer_id
        self.offset = offset


class OutOfOrderSequence(ProducerStateError):
    """The batch's first sequence does not follow the producer's last one (a gap, a duplicate
    older than the last five batches, or a new epoch not starting at 0):
    OUT_OF_ORDER_SEQUENCE_NUMBER (45)."""


class InvalidProducerEpoch(ProducerStateError):
    """The batch carries an epoch older than the producer's current one (a zombie producer
    fenced by a newer instance): INVALID_PRODUCER_EPOCH (47)."""
