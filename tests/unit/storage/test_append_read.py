"""Appending as leader and as follower, refusing bad batches without writing anything, and
reading file slices back (max bytes, KIP-74's first whole batch, the high watermark)."""

from __future__ import annotations

import struct

import google_crc32c
import pytest

from broker.protocol import Codec
from broker.protocol.records import Record, build_batch, validate_batch
from broker.storage import (
    CorruptRecordError,
    InvalidRecord,
    LogConfig,
    OffsetOutOfRange,
    RecordTooLarge,
)
from broker.storage.errors import StorageError

from .logs import (
    SMALL,
    LogOpener,
    batch,
    consume,
    file_sizes,
    fill,
    headers,
    offsets_of,
    records_of,
)


def test_leader_append_assigns_contiguous_offsets_and_stamps_the_epoch(open_log: LogOpener) -> None:
    log = open_log()
    sent = [
        batch(3, offset=1000),
        batch(1, codec=Codec.GZIP),
        batch(5, codec=Codec.LZ4),
        batch(2, codec=Codec.ZSTD),
        batch(4, codec=Codec.SNAPPY),
    ]
    appends = [(sent[0], 0), (sent[1], 0), (sent[2] + sent[3], 2), (sent[4], 7)]
    infos = [log.append_as_leader(data, leader_epoch=epoch, now_ms=0) for data, epoch in appends]

    assert [(i.first_offset, i.last_offset, i.record_count) for i in infos] == [
        (0, 2, 3),
        (3, 3, 1),
        (4, 10, 7),
        (11, 14, 4),
    ]
    assert log.log_end_offset == 15
    stored = consume(log)
    for data in stored:
        validate_batch(data)  # patching offsets and epochs kept every CRC valid
    assert [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in headers(stored)] == [
        (0, 2, 0),
        (3, 3, 0),
        (4, 8, 2),
        (9, 10, 2),
        (11, 14, 7),
    ]
    assert [r.offset for r in records_of(stored)] == list(range(15))
    # Only the first 16 bytes (offset, length, epoch) change: the payload is stored as sent.
    assert [data[16:] for data in stored] == [data[16:] for data in sent]
    assert log.epochs.entries() == [(0, 0), (2, 4), (7, 11)]
    log.close(now_ms=1)


def test_append_info_reports_the_max_timestamp_and_where_it_is(open_log: LogOpener) -> None:
    log = open_log()
    log.append_as_leader(batch(2), leader_epoch=0, now_ms=0)
    info = log.append_as_leader(
        batch(timestamps=[50, 90, 70]) + batch(timestamps=[80]), leader_epoch=0, now_ms=0
    )
    assert (info.max_timestamp, info.offset_of_max_timestamp) == (90, 4)
    log.close(now_ms=1)


def test_follower_append_keeps_the_leaders_offsets_and_epochs(open_log: LogOpener) -> None:
    log = open_log()
    log.append_as_follower(batch(3, offset=0, epoch=1) + batch(2, offset=3, epoch=1), now_ms=0)
    info = log.append_as_follower(batch(1, offset=5, epoch=4), now_ms=0)
    assert (info.first_offset, info.last_offset) == (5, 5)
    assert log.log_end_offset == 6
    stored = headers(consume(log))
    assert [(h.base_offset, h.partition_leader_epoch) for h in stored] == [(0, 1), (3, 1), (5, 4)]
    assert log.epochs.entries() == [(1, 0), (4, 5)]
    log.close(now_ms=1)


@pytest.mark.parametrize(
    "records",
    [
        pytest.param(batch(2, offset=3, epoch=2), id="below-the-log-end"),
        pytest.param(batch(2, offset=5, epoch=2) + batch(2, offset=6, epoch=2), id="overlapping"),
        pytest.param(batch(1, offset=5, epoch=2) + batch(1, offset=5, epoch=2), id="repeated"),
        pytest.param(batch(1, offset=5, epoch=2) + batch(1, offset=2, epoch=2), id="backwards"),
    ],
)
def test_follower_append_going_backwards_is_refused_whole(
    open_log: LogOpener, records: bytes
) -> None:
    log = open_log()
    log.append_as_follower(batch(5, offset=0, epoch=1), now_ms=0)
    before = file_sizes(log.directory)
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(records, now_ms=0)
    assert log.log_end_offset == 5
    assert file_sizes(log.directory) == before
    # The refused batches' epoch must not be remembered: they are not in the log.
    assert log.epochs.entries() == [(1, 0)]
    log.append_as_follower(batch(1, offset=5, epoch=1), now_ms=0)
    assert log.end_offset_for_epoch(1) == (1, 6)
    log.close(now_ms=1)


def _bad_crc() -> bytes:
    data = bytearray(batch(3))
    data[-1] ^= 0x01
    return bytes(data)


def _count_mismatch() -> bytes:
    """Three records whose header claims offsets up to delta 5: valid CRC, wrong count."""
    records = [Record(i, 1_000, b"k", b"v") for i in range(3)]
    return build_batch(records, last_offset_delta=5)


def _truncated() -> bytes:
    return batch(3)[:-5]


def _resigned(data: bytearray) -> bytes:
    """The batch with its CRC recomputed after a deliberate change: a client that lies."""
    struct.pack_into(">I", data, 17, google_crc32c.value(bytes(data[21:])))
    return bytes(data)


def _lying_count(count: int = 1_000_000) -> bytes:
    """One record, a header claiming `count` (offset deltas to match), a valid CRC: the batch
    that made kafka-python consumers fail with CorruptRecordError once stored."""
    data = bytearray(batch(1))
    struct.pack_into(">i", data, 23, count - 1)
    struct.pack_into(">i", data, 57, count)
    return _resigned(data)


def _trailing_bytes() -> bytes:
    """Three records and four bytes after them inside the batch, counted in its length."""
    data = bytearray(batch(3) + b"\0\0\0\0")
    struct.pack_into(">i", data, 8, len(data) - 12)
    return _resigned(data)


def _keyless(codec: Codec = Codec.NONE) -> bytes:
    return build_batch([Record(0, 1_000, b"k", b"v"), Record(1, 1_000, None, b"v")], codec=codec)


COMPACTED = LogConfig(cleanup_policy=frozenset({"compact"}))


@pytest.mark.parametrize(
    ("config", "records", "error"),
    [
        pytest.param(SMALL, _bad_crc(), CorruptRecordError, id="bad-crc"),
        pytest.param(SMALL, batch() + _bad_crc(), CorruptRecordError, id="second-batch-bad-crc"),
        pytest.param(SMALL, _count_mismatch(), InvalidRecord, id="count-vs-delta"),
        pytest.param(SMALL, _lying_count(), InvalidRecord, id="count-lies"),
        pytest.param(SMALL, _trailing_bytes(), InvalidRecord, id="bytes-after-the-records"),
        pytest.param(
            SMALL,
            build_batch([Record(0, 1_000, None, b"\0\0\0\0\0\0")], is_control=True),
            InvalidRecord,
            id="control-batch",
        ),
        pytest.param(
            SMALL,
            build_batch([Record(0, 1_000, b"k", b"v")], producer_id=7, producer_epoch=0),
            InvalidRecord,
            id="producer-id-without-sequence",
        ),
        pytest.param(COMPACTED, _keyless(), InvalidRecord, id="keyless-on-compacted"),
        pytest.param(
            COMPACTED, _keyless(Codec.ZSTD), InvalidRecord, id="keyless-on-compacted-zstd"
        ),
        pytest.param(SMALL, batch() + _truncated(), CorruptRecordError, id="truncated"),
        pytest.param(SMALL, b"", CorruptRecordError, id="empty"),
        pytest.param(
            LogConfig(max_message_bytes=300),
            batch(value=b"x" * 100),
            RecordTooLarge,
            id="max.message.bytes",
        ),
        pytest.param(
            LogConfig(segment_bytes=400),
            batch(value=b"x" * 50) + batch(value=b"x" * 50),
            RecordTooLarge,
            id="segment.bytes",
        ),
    ],
)
def test_a_refused_leader_append_writes_nothing(
    open_log: LogOpener, config: LogConfig, records: bytes, error: type[StorageError]
) -> None:
    log = open_log(config)
    log.append_as_leader(batch(2), leader_epoch=0, now_ms=0)
    before = file_sizes(log.directory)
    with pytest.raises(error):
        log.append_as_leader(records, leader_epoch=1, now_ms=0)
    assert log.log_end_offset == 2
    assert file_sizes(log.directory) == before
    assert log.epochs.entries() == [(0, 0)]
    assert log.append_as_leader(batch(1), leader_epoch=0, now_ms=0).first_offset == 2
    log.close(now_ms=1)


def test_keyless_records_are_fine_where_nothing_is_compacted(open_log: LogOpener) -> None:
    log = open_log(SMALL)
    assert log.append_as_leader(_keyless(), leader_epoch=0, now_ms=0).record_count == 2
    log.close(now_ms=1)


def test_an_invalid_record_names_its_index(open_log: LogOpener) -> None:
    log = open_log(COMPACTED)
    with pytest.raises(InvalidRecord, match="without key") as refused:
        log.append_as_leader(_keyless(), leader_epoch=0, now_ms=0)
    assert [error.batch_index for error in refused.value.record_errors] == [1]
    log.close(now_ms=1)


def test_max_message_bytes_is_the_largest_batch_accepted(open_log: LogOpener) -> None:
    data, one_byte_more = batch(1, value=b"x" * 100), batch(1, value=b"x" * 101)
    assert len(one_byte_more) == len(data) + 1
    log = open_log(LogConfig(max_message_bytes=len(data)))
    log.append_as_leader(data, leader_epoch=0, now_ms=0)
    with pytest.raises(RecordTooLarge):
        log.append_as_leader(one_byte_more, leader_epoch=0, now_ms=0)
    assert log.log_end_offset == 1
    log.close(now_ms=1)


# -- reading ------------------------------------------------------------------------------


@pytest.fixture
def nine(open_log: LogOpener) -> list[bytes]:
    """Batches appended to `orders-0`: offsets 0-2, 3-5, 6-8, all the same size."""
    log = open_log()
    fill(log, 3)
    stored = consume(log)
    log.close(now_ms=1)
    return stored


def test_read_starts_at_the_batch_holding_the_offset(
    open_log: LogOpener, nine: list[bytes]
) -> None:
    log = open_log()
    size = len(nine[0])
    for offset, batch_index in [(0, 0), (2, 0), (3, 1), (4, 1), (5, 1), (8, 2)]:
        chunk = log.read(offset, 10_000)
        assert chunk is not None
        assert chunk.position == batch_index * size
        assert chunk.read() == b"".join(nine[batch_index:])
    log.close(now_ms=1)


def test_read_returns_at_most_max_bytes(open_log: LogOpener, nine: list[bytes]) -> None:
    log = open_log()
    size = len(nine[0])
    for max_bytes in (size, 2 * size, 2 * size + 7, 3 * size, 10 * size):
        chunk = log.read(0, max_bytes)
        assert chunk is not None
        assert chunk.read() == b"".join(nine)[:max_bytes]
    log.close(now_ms=1)


def test_a_first_batch_larger_than_max_bytes_is_returned_whole(open_log: LogOpener) -> None:
    """KIP-74: a consumer must be able to make progress past a large batch."""
    log = open_log()
    log.append_as_leader(batch(1, value=b"x" * 500) + batch(1), leader_epoch=0, now_ms=0)
    big = consume(log)[0]
    whole = log.read(0, 10)
    assert whole is not None
    assert whole.read() == big
    partial = log.read(0, 10, min_one_batch=False)
    assert partial is not None
    assert partial.size == 10
    log.close(now_ms=1)


def test_the_high_watermark_bounds_the_read(open_log: LogOpener, nine: list[bytes]) -> None:
    log = open_log()
    below_6 = log.read(0, 10_000, max_offset=6)
    assert below_6 is not None
    assert below_6.read() == b"".join(nine[:2])
    # A batch holding an offset at or past the high watermark is not sent at all.
    mid_batch = log.read(0, 10_000, max_offset=7)
    assert mid_batch is not None
    assert mid_batch.read() == b"".join(nine[:2])
    assert log.read(6, 10_000, max_offset=6) is None
    everything = log.read(0, 10_000, max_offset=9)
    assert everything is not None
    assert everything.read() == b"".join(nine)
    log.close(now_ms=1)


def test_reading_at_the_end_waits_and_outside_the_log_is_out_of_range(
    open_log: LogOpener, nine: list[bytes]
) -> None:
    log = open_log()
    assert log.read(9, 10_000) is None
    with pytest.raises(OffsetOutOfRange) as above:
        log.read(10, 10_000)
    assert (above.value.log_start_offset, above.value.log_end_offset) == (0, 9)
    log.delete_records(3)
    with pytest.raises(OffsetOutOfRange):
        log.read(2, 10_000)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, 10_000)
    chunk = log.read(3, 10_000)
    assert chunk is not None
    assert chunk.read() == b"".join(nine[1:])
    log.close(now_ms=1)


def test_reads_cross_segment_boundaries(open_log: LogOpener) -> None:
    log = open_log()
    for i in range(40):
        log.append_as_leader(batch(3, value=bytes([i]) * 20), leader_epoch=0, now_ms=0)
    assert len(log.segments) >= 3
    # A consumer reading from the start, batch after batch, gets every record once, in order.
    records = records_of(consume(log, max_bytes=700))
    assert [r.offset for r in records] == list(range(120))
    assert [r.value for r in records[::3]] == [bytes([i]) * 20 for i in range(40)]
    # A read never spans two segments: it ends with the segment holding the offset.
    second = log.segments[1]
    last_of_first = second.base_offset - 1
    chunk = log.read(last_of_first, 1 << 20)
    assert chunk is not None
    assert [h.last_offset for h in headers([chunk.read()])] == [last_of_first]
    chunk = log.read(second.base_offset, 1 << 20)
    assert chunk is not None
    assert (chunk.fd, chunk.position) == (second.fd, 0)
    log.close(now_ms=1)


def test_a_read_in_an_offset_gap_returns_the_next_batch(open_log: LogOpener) -> None:
    """Followers copy gaps (compacted away, or aborted) as they are; a read inside a gap starts
    at the next batch, in the next segment if need be."""
    log = open_log()
    log.append_as_follower(batch(3, offset=0, epoch=0), now_ms=0)
    log.roll(now_ms=0, base_offset=10)
    log.append_as_follower(batch(2, offset=10, epoch=0) + batch(1, offset=20, epoch=0), now_ms=0)

    def expected(offset: int) -> list[int]:
        return [r.offset for r in records_of(consume(log, offset))]

    assert expected(5) == [10, 11, 20]
    assert expected(12) == [20]
    log.close(now_ms=1)


def test_a_follower_fetch_of_many_small_batches_is_appended_whole(open_log: LogOpener) -> None:
    """More batches than one pwritev can take (IOV_MAX is 1024 buffers on Linux)."""
    many = b"".join(batch(1, offset=i, epoch=0) for i in range(1500))
    log = open_log(LogConfig())
    info = log.append_as_follower(many, now_ms=0)
    assert (info.first_offset, info.last_offset) == (0, 1499)
    assert log.log_end_offset == 1500
    assert offsets_of(log) == list(range(1500))
