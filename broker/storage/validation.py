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

from broker.protocol.compression import Codec, decompress
from broker.protocol.errors import MalformedInput
from broker.protocol.records import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    build_batch,
    check_batch,
    iter_batches,
    iter_records,
    set_log_append_time,
)

from .config import COMPRESSION_CODECS, LONG_MAX, LogConfig
from .errors import CorruptRecordError, InvalidRecord, InvalidTimestamp

__all__ = ["check_client_batch", "check_max_timestamp", "prepare"]


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
    ahead of the broker's clock. The batch's max timestamp bounds them all and is what is
    checked: decompressing the records to find the one that is late would let a few hundred
    bytes of zstd hold the broker for seconds."""
    latest = now_ms + config.message_timestamp_after_max_ms
    if (
        header.max_timestamp > latest
        and not header.is_log_append_time
        and not config.log_append_time
    ):
        raise InvalidTimestamp(
            f"Timestamp {header.max_timestamp} of the batch at byte {position} (its max "
            f"timestamp) is out of range. The timestamp should be within "
            f"[{max(now_ms - config.message_timestamp_before_max_ms, 0)}, {latest}]"
        )


_MIN_RECORD_BYTES = 6
"""The smallest record body: attributes, timestamp delta, offset delta, key and value lengths
and header count, one byte each."""


def check_client_batch(
    view: memoryview, position: int, header: BatchHeader, *, compacted: bool
) -> None:
    """Kafka's LogValidator rules for a batch a client produced, after its CRC was checked:
    raise `InvalidRecord` (INVALID_RECORD) for a control batch, a producer id with a negative
    sequence, a record count that does not match the batch's offsets or its bytes, a record
    that runs past its batch, or (on a compacted topic) a record without a key.

    Every record is walked, as Kafka walks them: an uncompressed batch by hopping from length
    to length (a key is read only on compacted topics); a compressed one is decompressed
    (bounded) first."""
    if header.is_control:
        raise InvalidRecord("Clients are not allowed to write control records")
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise InvalidRecord(
            f"Invalid sequence number {header.base_sequence} in record batch with "
            f"producerId {header.producer_id}"
        )
    count = header.records_count
    if count <= 0:
        raise InvalidRecord(f"Invalid reported count for record batch: {count}")
    if count != header.last_offset_delta + 1:
        raise InvalidRecord(
            f"Inconsistent batch offset range [0, {header.last_offset_delta}] and count of "
            f"records {count}"
        )
    start = position + BATCH_HEADER_SIZE
    end = position + header.size
    if header.codec is Codec.NONE:
        _walk(view, start, end, count, compacted)
        return
    try:
        payload = decompress(header.codec, view[start:end])
    except MalformedInput as exc:
        raise CorruptRecordError(str(exc)) from exc
    _walk(payload, 0, len(payload), count, compacted)


def _walk(buf: memoryview | bytes, pos: int, end: int, count: int, keys: bool) -> None:
    """Hop over `count` records from `pos`; they must end exactly at `end`."""
    for index in range(count):
        if pos >= end:
            raise InvalidRecord(
                f"Incorrect declared batch size: {count} records declared, {index} found"
            )
        raw = buf[pos]
        pos += 1
        if raw & 0x80:
            raw, pos = _uvarint_rest(buf, pos, end, raw)
        length = (raw >> 1) ^ -(raw & 1)
        record_end = pos + length
        if length < _MIN_RECORD_BYTES or record_end > end:
            raise InvalidRecord(
                f"Record {index} of the batch claims {length} bytes, past the batch's end",
                index,
            )
        if keys and _key_length(buf, pos, record_end) < 0:
            raise InvalidRecord(
                "Compacted topic cannot accept message without key in topic partition",
                index,
            )
        pos = record_end
    if pos != end:
        raise InvalidRecord(
            f"Incorrect declared batch size, {end - pos} bytes remain after the {count} "
            "records declared"
        )


def _uvarint_rest(buf: memoryview | bytes, pos: int, end: int, first: int) -> tuple[int, int]:
    value, shift = first & 0x7F, 7
    while True:
        if pos >= end or shift > 63:
            raise InvalidRecord("A record's length is not a valid varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _key_length(buf: memoryview | bytes, pos: int, end: int) -> int:
    """The key length of the record body at `pos`: attributes (1 byte), timestamp delta
    (varlong), offset delta (varint), then the key length (varint, -1 for no key)."""
    pos += 1
    for _ in range(2):  # skip the two deltas
        while True:
            if pos >= end:
                raise InvalidRecord("A record ends inside its header fields")
            byte = buf[pos]
            pos += 1
            if not byte & 0x80:
                break
    if pos >= end:
        raise InvalidRecord("A record ends before its key")
    raw = buf[pos]
    if raw & 0x80:
        raw, _ = _uvarint_rest(buf, pos + 1, end, raw)
    return (raw >> 1) ^ -(raw & 1)


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
