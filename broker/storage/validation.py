"""What the leader does to produced batches before they reach the log (Kafka's LogValidator).

By default a batch is stored exactly as the producer sent it and only its header is looked at:
the CreateTime check against `message.timestamp.after.max.ms` reads the batch's max timestamp.
Three topic settings make the leader rewrite or read into batches, and cost per-record work
that the default path never pays:

- `compression.type` other than `producer`: batches in another codec are decoded and encoded
  again with the topic's codec (producer id, epoch, sequences and timestamps kept);
- `message.timestamp.type=LogAppendTime`: each batch's max timestamp becomes the broker's
  clock and its timestamp-type bit is set (the CRC is recomputed);
- `message.timestamp.before.max.ms` below its default: every record's CreateTime is checked,
  since a batch header does not say which of its records is the oldest.
"""

from __future__ import annotations

from broker.protocol.compression import Codec
from broker.protocol.errors import MalformedInput
from broker.protocol.records import (
    BatchHeader,
    build_batch,
    check_batch,
    iter_batches,
    iter_records,
    set_log_append_time,
)

from .config import COMPRESSION_CODECS, LONG_MAX, LogConfig
from .errors import CorruptRecordError, InvalidTimestamp

__all__ = ["check_max_timestamp", "prepare"]


def prepare(records: bytes, config: LogConfig, now_ms: int) -> bytes:
    """The batches to append for a topic whose config `rewrites_batches`."""
    view = memoryview(records)
    try:
        batches = list(iter_batches(view))
        # Each rewrite below gives the batch a fresh CRC, so the one it came with is checked
        # first: a batch damaged on the way in is refused, never re-signed and stored.
        for position, header in batches:
            check_batch(view, position, header)
        if not config.log_append_time:
            for position, header in batches:
                check_max_timestamp(view, position, header, config, now_ms)
                if config.message_timestamp_before_max_ms != LONG_MAX:
                    _check_each_timestamp(view, position, header, config, now_ms)
        target = COMPRESSION_CODECS.get(config.compression_type)
        if target is not None and any(h.codec is not target for _, h in batches):
            records = b"".join(_in_codec(view, p, h, target) for p, h in batches)
        if config.log_append_time:
            stamped = bytearray(records)
            for position, _ in iter_batches(stamped):
                set_log_append_time(stamped, position, now_ms)
            records = bytes(stamped)
    except MalformedInput as exc:
        raise CorruptRecordError(str(exc)) from exc
    return records


def check_max_timestamp(
    view: memoryview, position: int, header: BatchHeader, config: LogConfig, now_ms: int
) -> None:
    """The per-batch CreateTime check: no record more than `message.timestamp.after.max.ms`
    ahead of the broker's clock (the batch's max timestamp bounds them all)."""
    if (
        header.max_timestamp - now_ms > config.message_timestamp_after_max_ms
        and not header.is_log_append_time
        and not config.log_append_time
    ):
        _check_each_timestamp(view, position, header, config, now_ms)


def _check_each_timestamp(
    view: memoryview, position: int, header: BatchHeader, config: LogConfig, now_ms: int
) -> None:
    earliest = now_ms - config.message_timestamp_before_max_ms
    latest = now_ms + config.message_timestamp_after_max_ms
    for record in iter_records(view, position):
        if record.timestamp >= 0 and not earliest <= record.timestamp <= latest:
            raise InvalidTimestamp(
                f"Timestamp {record.timestamp} of message with offset "
                f"{record.offset - header.base_offset} is out of range. The timestamp should "
                f"be within [{max(earliest, 0)}, {latest}]"
            )


def _in_codec(view: memoryview, position: int, header: BatchHeader, codec: Codec) -> bytes:
    batch = view[position : position + header.size]
    if header.codec is codec or header.is_control:
        return bytes(batch)
    return build_batch(
        list(iter_records(batch)),
        codec=codec,
        base_offset=header.base_offset,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
        partition_leader_epoch=header.partition_leader_epoch,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        is_transactional=header.is_transactional,
        log_append_time=header.is_log_append_time,
    )
