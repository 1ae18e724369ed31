"""Record batches, magic 2 (Kafka's `DefaultRecordBatch`): the unit that travels from producer
to disk to consumer as bytes.

The hot path reads only the 61-byte header, checks the CRC and patches the base offset and the
partition leader epoch in place; both sit before the CRC-covered range, so the batch is never
re-encoded. Iterating the records (compaction, audits, the broker's own internal topics) is
the slow path and lives here too, with the codecs in `compression`.

Header layout (byte offset: field):
  0 base_offset int64 · 8 batch_length int32 (bytes after this field) · 12 partition_leader_epoch
  int32 · 16 magic int8 · 17 crc uint32 (CRC-32C of bytes 21..end) · 21 attributes int16 ·
  23 last_offset_delta int32 · 27 base_timestamp int64 · 35 max_timestamp int64 · 43 producer_id
  int64 · 51 producer_epoch int16 · 53 base_sequence int32 · 57 records_count int32 · 61 records
Attributes: bits 0–2 codec, bit 3 LogAppendTime, bit 4 transactional, bit 5 control, bit 6
delete horizon set.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import google_crc32c

from .compression import DEFAULT_MAX_DECOMPRESSED_BYTES, Codec, compress, decompress
from .errors import MalformedInput
from .primitives import Buffer, read_varint, read_varlong, write_varint

__all__ = [
    "BATCH_HEADER_SIZE",
    "MAGIC",
    "BatchHeader",
    "Record",
    "build_batch",
    "check_batch",
    "is_compressed",
    "iter_batches",
    "iter_records",
    "read_batch_header",
    "set_base_offset",
    "set_log_append_time",
    "set_partition_leader_epoch",
    "validate_batch",
]

BATCH_HEADER_SIZE = 61
MAGIC = 2
LOG_OVERHEAD = 12
"""base_offset and batch_length: the bytes not counted by batch_length."""
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC_START = 21
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_DELETE_HORIZON = 0x40
_MAX_CODEC = int(Codec.ZSTD)


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def codec(self) -> Codec:
        return Codec(self.attributes & _CODEC_MASK)

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & _LOG_APPEND_TIME)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & _DELETE_HORIZON)


@dataclass(frozen=True, slots=True)
class Record:
    """One record with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def read_batch_header(buf: Buffer, position: int = 0) -> BatchHeader:
    """Parse the header of the batch at `position`, checking only what the header itself says.

    The batch's bytes after the header may not have arrived yet (a fetch response may end in a
    partial batch); `validate_batch` checks the whole batch.
    """
    view = memoryview(buf)
    if position < 0 or len(view) - position < BATCH_HEADER_SIZE:
        raise MalformedInput(
            f"{max(len(view) - position, 0)} bytes cannot hold a {BATCH_HEADER_SIZE}-byte batch "
            "header",
            where=f"record batch at byte {position}",
        )
    header = BatchHeader._make(_HEADER.unpack_from(view, position))
    if (
        header.magic != MAGIC
        or header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD
        or header.attributes & _CODEC_MASK > _MAX_CODEC
        or header.last_offset_delta < 0
        or header.records_count < 0
    ):
        _reject_header(header, position)
    return header


def _reject_header(header: BatchHeader, position: int) -> None:
    where = f"record batch at byte {position}"
    if header.magic != MAGIC:
        raise MalformedInput(
            f"magic {header.magic} is not supported, only record batches v2", where=where
        )
    if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise MalformedInput(f"batch length {header.batch_length} is too small", where=where)
    if header.attributes & _CODEC_MASK > Codec.ZSTD:
        raise MalformedInput(
            f"unknown compression codec {header.attributes & _CODEC_MASK}", where=where
        )
    raise MalformedInput(
        f"negative last offset delta {header.last_offset_delta} or record count "
        f"{header.records_count}",
        where=where,
    )


_CRC_PIECE_BYTES = 1024 * 1024


def _crc(view: memoryview, position: int, header: BatchHeader) -> int:
    # google-crc32c's C entry point takes only non-releasable buffers (bytes), hence the copy;
    # a memcpy costs a fraction of the checksum it feeds. A large batch is copied a piece at a
    # time: the copy holds the GIL (the checksum does not), and a produce's CRC may run on a
    # thread beside the event loop (`ReplicaManager.append_offloaded`).
    start, end = position + _CRC_START, position + header.size
    if end - start <= _CRC_PIECE_BYTES:
        return int(google_crc32c.value(bytes(view[start:end])))
    crc = 0
    for piece in range(start, end, _CRC_PIECE_BYTES):
        crc = google_crc32c.extend(crc, bytes(view[piece : min(piece + _CRC_PIECE_BYTES, end)]))
    return int(crc)


def validate_batch(buf: Buffer, position: int = 0) -> BatchHeader:
    """Check that a whole, uncorrupted batch starts at `position` and return its header."""
    view = memoryview(buf)
    header = read_batch_header(view, position)
    check_batch(view, position, header)
    return header


def is_compressed(buf: Buffer) -> bool:
    """Whether the first batch in `buf` (whatever its state) says its records are compressed."""
    view = memoryview(buf)
    if len(view) < _CRC_START + 2:
        return False
    return bool(view[_CRC_START + 1] & _CODEC_MASK)


def check_batch(view: memoryview, position: int, header: BatchHeader) -> None:
    """`validate_batch` for a header already read: the batch is whole and its CRC matches."""
    if position + header.size > len(view):
        raise MalformedInput(
            f"batch of {header.size} bytes is truncated to {len(view) - position}",
            where=f"record batch at byte {position}",
        )
    actual = _crc(view, position, header)
    if actual != header.crc:
        raise MalformedInput(
            f"CRC mismatch: header says {header.crc:#010x}, records give {actual:#010x}",
            where=f"record batch at byte {position}",
        )


def iter_batches(
    buf: Buffer, *, allow_partial_tail: bool = False
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield `(position, header)` of each batch in a buffer of concatenated batches.

    With `allow_partial_tail`, a truncated last batch ends the iteration, as consumers accept
    at the end of a fetch response (KIP-74); otherwise it is malformed input. CRCs are not
    checked here: call `validate_batch` where the bytes come from outside.
    """
    view = memoryview(buf)
    position = 0
    while position < len(view):
        if allow_partial_tail and len(view) - position < BATCH_HEADER_SIZE:
            return
        header = read_batch_header(view, position)
        if position + header.size > len(view):
            if allow_partial_tail:
                return
            raise MalformedInput(
                f"batch of {header.size} bytes is truncated to {len(view) - position}",
                where=f"record batch at byte {position}",
            )
        yield position, header
        position += header.size


def set_base_offset(buf: Buffer, position: int, base_offset: int) -> None:
    """Assign the batch's offsets in place; the CRC does not cover the base offset."""
    _INT64.pack_into(buf, position, base_offset)


def set_partition_leader_epoch(buf: Buffer, position: int, epoch: int) -> None:
    """Stamp the leader epoch in place; the CRC does not cover it either."""
    _INT32.pack_into(buf, position + 12, epoch)


def set_log_append_time(buf: Buffer, position: int, timestamp: int) -> None:
    """For topics with `message.timestamp.type=LogAppendTime`: set max timestamp and the
    timestamp-type bit, then recompute the CRC, which covers both."""
    view = memoryview(buf)
    header = read_batch_header(view, position)
    _INT64.pack_into(view, position + 35, timestamp)
    struct.pack_into(">h", view, position + 21, header.attributes | _LOG_APPEND_TIME)
    crc = _crc(view, position, header)
    struct.pack_into(">I", view, position + 17, crc)


def iter_records(
    buf: Buffer,
    position: int = 0,
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> Iterator[Record]:
    """Yield the records of the batch at `position`, decompressing if needed."""
    view = memoryview(buf)
    header = validate_batch(view, position)
    payload: memoryview = view[position + BATCH_HEADER_SIZE : position + header.size]
    if header.codec is not Codec.NONE:
        payload = memoryview(decompress(header.codec, payload, max_bytes=max_decompressed_bytes))
    where = f"records of batch at byte {position}"
    pos = 0
    for _ in range(header.records_count):
        record, pos = _read_record(payload, pos, header, where)
        yield record
    if pos != len(payload):
        raise MalformedInput(
            f"{len(payload) - pos} bytes left after {header.records_count} records", where=where
        )


def _read_bytes(view: memoryview, pos: int, where: str) -> tuple[bytes | None, int]:
    length, pos = read_varint(view, pos, where)
    if length < 0:
        return None, pos
    if pos + length > len(view):
        raise MalformedInput(f"field of {length} bytes is truncated", where=where)
    return bytes(view[pos : pos + length]), pos + length


def _read_record(view: memoryview, pos: int, header: BatchHeader, where: str) -> tuple[Record, int]:
    length, pos = read_varint(view, pos, where)
    end = pos + length
    if length < 0 or end > len(view):
        raise MalformedInput(f"record of {length} bytes is truncated", where=where)
    pos += 1  # attributes: unused in magic 2
    timestamp_delta, pos = read_varlong(view, pos, where)
    offset_delta, pos = read_varint(view, pos, where)
    key, pos = _read_bytes(view, pos, where)
    value, pos = _read_bytes(view, pos, where)
    count, pos = read_varint(view, pos, where)
    if count < 0:
        raise MalformedInput(f"negative header count {count}", where=where)
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        raw_key, pos = _read_bytes(view, pos, where)
        if raw_key is None:
            raise MalformedInput("null header key", where=where)
        try:
            header_key = raw_key.decode()
        except UnicodeDecodeError as exc:
            raise MalformedInput("header key is not valid UTF-8", where=where) from exc
        header_value, pos = _read_bytes(view, pos, where)
        headers.append((header_key, header_value))
    if pos != end:
        raise MalformedInput(
            f"record length {length} does not match its fields ({pos - end + length} bytes)",
            where=where,
        )
    record = Record(
        offset=header.base_offset + offset_delta,
        # A LogAppendTime batch gives every record the broker's time (its max timestamp).
        timestamp=header.max_timestamp
        if header.attributes & _LOG_APPEND_TIME
        else header.base_timestamp + timestamp_delta,
        key=key,
        value=value,
        headers=tuple(headers),
    )
    return record, end


def _encode_bytes(data: bytes | None) -> bytes:
    if data is None:
        return write_varint(-1)
    return write_varint(len(data)) + data


def _encode_record(record: Record, base_offset: int, base_timestamp: int) -> bytes:
    body = bytearray(b"\x00")
    body += write_varint(record.timestamp - base_timestamp)
    body += write_varint(record.offset - base_offset)
    body += _encode_bytes(record.key)
    body += _encode_bytes(record.value)
    body += write_varint(len(record.headers))
    for key, value in record.headers:
        body += _encode_bytes(key.encode())
        body += _encode_bytes(value)
    return write_varint(len(body)) + bytes(body)


def build_batch(
    records: Sequence[Record],
    *,
    codec: Codec = Codec.NONE,
    base_offset: int | None = None,
    last_offset_delta: int | None = None,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    log_append_time: bool = False,
) -> bytes:
    """Encode records into one batch, as a producer would.

    Used for the broker's own writes (internal topics, control batches) and by tests. Offsets
    and timestamps default to the records' own; pass `base_offset` and `last_offset_delta`
    explicitly for a batch that compaction has emptied.
    """
    if base_offset is None:
        base_offset = records[0].offset if records else 0
    if last_offset_delta is None:
        last_offset_delta = records[-1].offset - base_offset if records else 0
    if base_timestamp is None:
        base_timestamp = records[0].timestamp if records else -1
    if max_timestamp is None:
        max_timestamp = max((r.timestamp for r in records), default=-1)
    payload = b"".join(_encode_record(r, base_offset, base_timestamp) for r in records)
    payload = compress(codec, payload)
    attributes = (
        int(codec)
        | (_LOG_APPEND_TIME if log_append_time else 0)
        | (_TRANSACTIONAL if is_transactional else 0)
        | (_CONTROL if is_control else 0)
    )
    batch = bytearray(BATCH_HEADER_SIZE) + payload
    _HEADER.pack_into(
        batch,
        0,
        base_offset,
        len(batch) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    crc = int(google_crc32c.value(bytes(batch[_CRC_START:])))
    struct.pack_into(">I", batch, 17, crc)
    return bytes(batch)
