"""The commit log, in Kafka's on-disk layout, independent of networking.

What it owns: partition directories under each log dir, segments (`.log`, `.index`,
`.timeindex`), the leader-epoch checkpoint, idempotent producers' state and its `.snapshot`
files, the log dir checkpoints, recovery, retention, flushing and compaction. What it must
never do: import the server, asyncio or the protocol's message layer; it sees record batches
as bytes and their 61-byte headers only. Time is always an argument (`now_ms`), never read
from a clock here.
"""

from .config import InvalidConfig, LogConfig
from .errors import (
    CorruptRecordError,
    InvalidProducerEpoch,
    InvalidRecord,
    InvalidTimestamp,
    LogDirFailure,
    LogOffline,
    OffsetOutOfRange,
    OutOfOrderSequence,
    ProducerStateError,
    RecordTooLarge,
    StorageError,
)
from .log import AppendInfo, Log, PendingAppend
from .manager import LogManager, open_new_log
from .segments import FileSlice, LogSegment, PinnedSlice

__all__ = [
    "AppendInfo",
    "CorruptRecordError",
    "FileSlice",
    "InvalidConfig",
    "InvalidProducerEpoch",
    "InvalidRecord",
    "InvalidTimestamp",
    "Log",
    "LogConfig",
    "LogDirFailure",
    "LogManager",
    "LogOffline",
    "LogSegment",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "PendingAppend",
    "PinnedSlice",
    "ProducerStateError",
    "RecordTooLarge",
    "StorageError",
    "open_new_log",
]
