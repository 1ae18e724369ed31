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

A batch refused for its records is refused whole, and the refusal names every record that
broke a rule, as Kafka's LogValidator does (KIP-467): librdkafka marks exactly those records
invalid. Only a refusal pays for that: an accepted batch is read no further than before, and
an uncompressed batch that its header's max timestamp refuses is walked once to name its late
records (`_check_each_record`); a compressed one is refused whole without being decompressed
(its records are then all refused, as librdkafka takes an empty `record_errors`).
"""

from __future__ import annotations

import contextlib
from typing import NoReturn

from broker.protocol.compression import Codec, decompress
from broker.protocol.errors import MalformedInput
from broker.protocol.primitives import read_varint, read_varlong
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
from .errors import CorruptRecordError, InvalidRecord, InvalidTimestamp, RecordError

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
                    _check_each_record(view, position, header, config, now_ms)
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
    checked, so an accepted batch is not read for it. A refused uncompressed one is walked to
    name each late record (`InvalidTimestamp.record_errors`); a compressed one, one whose
    records cannot be walked, or whose header claims a max timestamp none of its records has,
    is refused as a whole."""
    latest = now_ms + config.message_timestamp_after_max_ms
    if (
        header.max_timestamp > latest
        and not header.is_log_append_time
        and not config.log_append_time
    ):
        if header.codec is Codec.NONE:
            # Naming each late record costs a walk bounded by the bytes received; a compressed
            # batch is refused whole, never decompressed for it: a few hundred bytes of zstd
            # must not hold the broker for seconds (tests/integration/test_hostile_clients.py).
            with contextlib.suppress(MalformedInput):
                _check_each_record(view, position, header, config, now_ms)
        raise InvalidTimestamp(
            f"Timestamp {header.max_timestamp} of the batch at byte {position} (its max "
            f"timestamp) is out of range. The timestamp should be within "
            f"[{max(now_ms - config.message_timestamp_before_max_ms, 0)}, {latest}]"
        )


_MIN_RECORD_BYTES = 6
"""The smallest record body: attributes, timestamp delta, offset delta, key and value lengths
and header count, one byte each."""
_KEYLESS = "Compacted topic cannot accept message without key in topic partition"
_SHOWN_ERRORS = 3
"""Record errors quoted in an INVALID_RECORD's message, as Kafka quotes them (the response's
`record_errors` lists every one)."""


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
    """Hop over `count` records from `pos`; they must end exactly at `end`. A keyless record
    (`keys`: on a compacted topic) does not stop the walk: the refusal names each one."""
    keyless: list[RecordError] | None = None
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
            message = f"Record {index} of the batch claims {length} bytes, past the batch's end"
            raise InvalidRecord(message, [RecordError(index, message)])
        if keys and _key_length(buf, pos, record_end) < 0:
            if keyless is None:
                keyless = []
            keyless.append(RecordError(index, _KEYLESS))
        pos = record_end
    if pos != end:
        raise InvalidRecord(
            f"Incorrect declared batch size, {end - pos} bytes remain after the {count} "
            "records declared"
        )
    if keyless:
        _refuse(keyless, late=False)


def _refuse(errors: list[RecordError], *, late: bool) -> NoReturn:
    """Refuse a batch for the records named in `errors`, with Kafka's messages: the code is
    INVALID_TIMESTAMP if a record's time is out (`late`), else INVALID_RECORD."""
    if late:
        raise InvalidTimestamp(
            "One or more records have been rejected due to invalid timestamp", errors
        )
    shown = ", ".join(
        f"RecordError(batchIndex={index}, message='{message}')"
        for index, message in errors[:_SHOWN_ERRORS]
    )
    raise InvalidRecord(
        f"One or more records have been rejected due to {len(errors)} record errors in total, "
        f"and only showing the first three errors at most: [{shown}]",
        errors,
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


def _check_each_record(
    view: memoryview, position: int, header: BatchHeader, config: LogConfig, now_ms: int
) -> None:
    """Kafka's per-record rules over every record of the batch at `position`: a key on a
    compacted topic, and a CreateTime within the topic's bounds (unless times are the
    broker's). Refuses the batch naming each record that breaks one (a record missing its key
    is named for that alone, as Kafka checks the key first); `MalformedInput` if the records
    cannot be walked. Lean: only the fields up to the key are read, nothing is copied."""
    start, end = position + BATCH_HEADER_SIZE, position + header.size
    buf: memoryview | bytes = view
    if header.codec is not Codec.NONE:
        buf = decompress(header.codec, view[start:end])
        start, end = 0, len(buf)
    keys = config.compact
    times = not header.is_log_append_time and not config.log_append_time
    earliest = now_ms - config.message_timestamp_before_max_ms
    latest = now_ms + config.message_timestamp_after_max_ms
    where = f"records of the batch at byte {position}"
    errors: list[RecordError] = []
    late = False
    pos = start
    for index in range(header.records_count):
        if pos >= end:
            raise MalformedInput(
                f"{header.records_count} records declared, {index} found", where=where
            )
        length, pos = read_varint(buf, pos, where)
        record_end = pos + length
        if length < _MIN_RECORD_BYTES or record_end > end:
            raise MalformedInput(f"record {index} of {length} bytes is truncated", where=where)
        timestamp_delta, field = read_varlong(buf, pos + 1, where)  # past the attributes
        offset_delta, field = read_varint(buf, field, where)
        key_length, field = read_varint(buf, field, where)
        if field > record_end:
            raise MalformedInput(f"record {index} ends inside its header fields", where=where)
        timestamp = header.base_timestamp + timestamp_delta
        if keys and key_length < 0:
            errors.append(RecordError(index, _KEYLESS))
        elif times and timestamp >= 0 and not earliest <= timestamp <= latest:
            late = True
            errors.append(
                RecordError(
                    index,
                    f"Timestamp {timestamp} of message with offset {offset_delta} is out of "
                    f"range. The timestamp should be within [{max(earliest, 0)}, {latest}]",
                )
            )
        pos = record_end
    if errors:
        _refuse(errors, late=late)


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
