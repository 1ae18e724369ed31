"""Per-log settings, with Kafka's topic-level names and defaults.

`LogConfig.from_properties` reads the topic config names (`segment.bytes`, `retention.ms`, …);
an invalid value raises `InvalidConfig` naming the key, as Kafka's ConfigDef does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.protocol.compression import Codec

__all__ = [
    "COMPRESSION_CODECS",
    "COMPRESSION_TYPES",
    "LONG_MAX",
    "TIMESTAMP_TYPES",
    "InvalidConfig",
    "LogConfig",
]

LONG_MAX = 2**63 - 1
COMPRESSION_CODECS = {
    "uncompressed": Codec.NONE,
    "zstd": Codec.ZSTD,
    "lz4": Codec.LZ4,
    "snappy": Codec.SNAPPY,
    "gzip": Codec.GZIP,
}
"""`compression.type` values that name a codec, in Kafka's order."""
COMPRESSION_TYPES = (*COMPRESSION_CODECS, "producer")
"""Every `compression.type`: a codec, or `producer` (keep the producer's)."""
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
"""Every `message.timestamp.type`."""


class InvalidConfig(ValueError):
    """A topic or broker setting with a value Kafka would refuse; the message names the key."""

    def __init__(self, key: str, value: object, reason: str) -> None:
        super().__init__(f"invalid value {value!r} for configuration {key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    segment_bytes: int = 1024 * 1024 * 1024
    """`segment.bytes`: roll the active segment before it grows past this (1 GiB)."""
    segment_ms: int = 7 * 24 * 3600 * 1000
    """`segment.ms`: roll a segment whose first batch is older than this (7 days), so that
    retention can delete old data even on a quiet partition."""
    segment_index_bytes: int = 10 * 1024 * 1024
    """`segment.index.bytes`: size of an offset index; a full index rolls the segment (10 MiB)."""
    index_interval_bytes: int = 4096
    """`index.interval.bytes`: log bytes between two index entries (4 KiB)."""
    retention_ms: int = 7 * 24 * 3600 * 1000
    """`retention.ms`: delete closed segments whose newest record is older (7 days; -1 keeps
    everything)."""
    retention_bytes: int = -1
    """`retention.bytes`: per-partition size above which the oldest segments go (-1: none)."""
    flush_messages: int = LONG_MAX
    """`flush.messages`: fsync after this many appended records; by default durability comes
    from replication and the page cache, as in Kafka."""
    flush_ms: int = LONG_MAX
    """`flush.ms`: fsync when the oldest unflushed append is this old."""
    cleanup_policy: frozenset[str] = frozenset({"delete"})
    """`cleanup.policy`: `delete`, `compact`, or both."""
    min_cleanable_dirty_ratio: float = 0.5
    """`min.cleanable.dirty.ratio`: compact once this share of the log is uncompacted."""
    min_compaction_lag_ms: int = 0
    """`min.compaction.lag.ms`: records younger than this are never compacted away."""
    max_compaction_lag_ms: int = LONG_MAX
    """`max.compaction.lag.ms`: compact a dirty segment at the latest this long after it was
    written, whatever the dirty ratio."""
    delete_retention_ms: int = 24 * 3600 * 1000
    """`delete.retention.ms`: how long tombstones survive compaction (1 day), so consumers
    catching up still see deletions."""
    file_delete_delay_ms: int = 60_000
    """`file.delete.delay.ms`: time a deleted segment stays as `.deleted` before it is removed,
    so reads in flight finish (1 minute)."""
    max_message_bytes: int = 1024 * 1024 + 12
    """`max.message.bytes`: the largest batch accepted (1 MiB + log overhead)."""
    compression_type: str = "producer"
    """`compression.type`: the codec batches are stored with; `producer` keeps the
    producer's, anything else recompresses batches that use another codec."""
    message_timestamp_type: str = "CreateTime"
    """`message.timestamp.type`: `LogAppendTime` stamps each batch with the broker's clock."""
    message_timestamp_before_max_ms: int = LONG_MAX
    """`message.timestamp.before.max.ms`: how far in the past a CreateTime may be."""
    message_timestamp_after_max_ms: int = 3600 * 1000
    """`message.timestamp.after.max.ms`: how far in the future a CreateTime may be (1 hour)."""

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def rewrites_batches(self) -> bool:
        """Whether appends go through `validation.prepare` (otherwise only the cheap,
        per-batch checks run): recompression, LogAppendTime, or a past-timestamp bound, which
        needs each record's timestamp."""
        return (
            self.compression_type != "producer"
            or self.log_append_time
            or self.message_timestamp_before_max_ms != LONG_MAX
        )

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """How old a segment's first batch may get before the segment rolls: `segment.ms`, or
        `max.compaction.lag.ms` if smaller on a compacted topic, so that the cleaner can reach
        every record within that lag (Kafka's `LogConfig.maxSegmentMs`)."""
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    @classmethod
    def from_properties(
        cls, properties: Mapping[str, str], defaults: LogConfig | None = None
    ) -> LogConfig:
        """Build from Kafka topic config names; unknown names are ignored (other layers own
        them), invalid values raise `InvalidConfig`."""
        base = defaults or cls()
        changes: dict[str, Any] = {}
        for key, raw in properties.items():
            spec = _PROPERTIES.get(key)
            if spec is None:
                continue
            attribute, parse = spec
            changes[attribute] = parse(key, raw)
        return dataclasses.replace(base, **changes)


def _long(minimum: int) -> Callable[[str, str], int]:
    def parse(key: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise InvalidConfig(key, raw, "not an integer") from None
        if value < minimum or value > LONG_MAX:
            raise InvalidConfig(key, raw, f"must be at least {minimum}")
        return value

    return parse


def _ratio(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise InvalidConfig(key, raw, "not a number") from None
    if not 0.0 <= value <= 1.0:
        raise InvalidConfig(key, raw, "must be between 0 and 1")
    return value


def _one_of(*allowed: str) -> Callable[[str, str], str]:
    def parse(key: str, raw: str) -> str:
        if raw not in allowed:
            raise InvalidConfig(key, raw, f"must be one of {', '.join(allowed)}")
        return raw

    return parse


def _policy(key: str, raw: str) -> frozenset[str]:
    """Kafka's list of `delete` and `compact`. Empty is allowed, as Kafka allows it (what a
    SUBTRACT of the last policy leaves): segments are then neither deleted nor compacted."""
    values = frozenset(part.strip() for part in raw.split(",") if part.strip())
    if not values <= {"delete", "compact"}:
        raise InvalidConfig(key, raw, "must be delete, compact, both, or empty")
    return values


_PROPERTIES: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "segment.bytes": ("segment_bytes", _long(14)),
    "segment.ms": ("segment_ms", _long(1)),
    "segment.index.bytes": ("segment_index_bytes", _long(8)),
    "index.interval.bytes": ("index_interval_bytes", _long(0)),
    "retention.ms": ("retention_ms", _long(-1)),
    "retention.bytes": ("retention_bytes", _long(-1)),
    "flush.messages": ("flush_messages", _long(1)),
    "flush.ms": ("flush_ms", _long(0)),
    "cleanup.policy": ("cleanup_policy", _policy),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", _ratio),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", _long(0)),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", _long(1)),
    "delete.retention.ms": ("delete_retention_ms", _long(0)),
    "file.delete.delay.ms": ("file_delete_delay_ms", _long(0)),
    "max.message.bytes": ("max_message_bytes", _long(0)),
    "compression.type": ("compression_type", _one_of(*COMPRESSION_TYPES)),
    "message.timestamp.type": ("message_timestamp_type", _one_of(*TIMESTAMP_TYPES)),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", _long(0)),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", _long(0)),
}
