"""Storage errors. Kafka error codes are chosen by the handlers; these say what went wrong."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

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
    "RecordError",
    "RecordTooLarge",
    "RecordsRejected",
    "StorageError",
]


class StorageError(Exception):
    """Base of the storage layer's errors."""


class CorruptRecordError(StorageError):
    """A batch offered for append fails validation (CRC, magic, offsets): CORRUPT_MESSAGE."""


class RecordError(NamedTuple):
    """One record of a batch that broke a per-record rule, by its index in the batch (Kafka's
    RecordError, KIP-467): what a Produce v8+ answer lists in `record_errors`."""

    batch_index: int
    message: str


class RecordsRejected(StorageError):
    """A batch refused for what its records hold (Kafka's RecordValidationException).
    `record_errors` names every record that broke a rule, in batch order, so that a client can
    tell them from the records refused only for sharing their batch; it is empty when the
    refusal is about the batch as a whole (its header, or a structure the records cannot be
    walked past)."""

    def __init__(self, message: str, record_errors: Sequence[RecordError] = ()) -> None:
        super().__init__(message)
        self.record_errors = tuple(record_errors)


class InvalidRecord(RecordsRejected):
    """A batch whose records break Kafka's rules for what a client may write (LogValidator): a
    control batch, a keyless record on a compacted topic, a record count or structure that does
    not match the batch, a producer id with a negative sequence: INVALID_RECORD (87)."""


class InvalidTimestamp(RecordsRejected):
    """A record's CreateTime lies outside `message.timestamp.before.max.ms` /
    `message.timestamp.after.max.ms` of the broker's clock: INVALID_TIMESTAMP (32). Its
    `record_errors` also name the batch's records refused for another rule (a missing key), as
    Kafka's do: the batch's code is INVALID_TIMESTAMP as soon as one record's time is out."""


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
