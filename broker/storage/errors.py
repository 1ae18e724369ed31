"""Storage errors. Kafka error codes are chosen by the handlers; these say what went wrong."""

from __future__ import annotations

__all__ = [
    "CorruptRecordError",
    "LogOffline",
    "OffsetOutOfRange",
    "RecordTooLarge",
    "StorageError",
]


class StorageError(Exception):
    """Base of the storage layer's errors."""


class CorruptRecordError(StorageError):
    """A batch offered for append fails validation (CRC, magic, offsets): CORRUPT_MESSAGE."""


class RecordTooLarge(StorageError):
    """A batch is larger than the segment can hold (`segment.bytes`): RECORD_TOO_LARGE."""


class OffsetOutOfRange(StorageError):
    """A read or DeleteRecords names an offset outside [log start, log end]."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} is outside [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class LogOffline(StorageError):
    """A partition's log could not be loaded; it is offline until an operator intervenes."""
