"""Record batches v2: build → validate → iterate round-trips for every codec, in-place patches
keep the CRC valid, and corruption is refused with the project's error."""

from __future__ import annotations

import os
import struct

import google_crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import Codec, MalformedInput
from broker.protocol.records import (
    BATCH_HEADER_SIZE,
    Record,
    build_batch,
    iter_batches,
    iter_records,
    read_batch_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)

header_entries = st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8))


@st.composite
def record_lists(draw: st.DrawFn) -> list[Record]:
    base_offset = draw(st.integers(0, 2**62))
    base_timestamp = draw(st.integers(0, 2**41))
    count = draw(st.integers(1, 6))
    return [
        Record(
            offset=base_offset + i,
            timestamp=base_timestamp + draw(st.integers(-1000, 1000)),
            key=draw(st.none() | st.binary(max_size=16)),
            value=draw(st.none() | st.binary(max_size=64)),
            headers=tuple(draw(st.lists(header_entries, max_size=3))),
        )
        for i in range(count)
    ]


@given(
    records=record_lists(),
    codec=st.sampled_from(list(Codec)),
    producer_id=st.integers(-1, 2**62),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
    epoch=st.integers(-1, 2**31 - 1),
    transactional=st.booleans(),
)
def test_batch_round_trips(
    records: list[Record],
    codec: Codec,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    epoch: int,
    transactional: bool,
) -> None:
    batch = build_batch(
        records,
        codec=codec,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=epoch,
        is_transactional=transactional,
    )
    header = validate_batch(batch)
    assert header.size == len(batch)
    assert header.codec is codec
    assert header.base_offset == records[0].offset
    assert header.last_offset == records[-1].offset
    assert header.records_count == len(records)
    assert header.max_timestamp == max(r.timestamp for r in records)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert header.partition_leader_epoch == epoch
    assert header.is_transactional is transactional
    assert list(iter_records(batch)) == records


def _records(n: int, offset: int = 0) -> list[Record]:
    return [Record(offset + i, 1_700_000_000_000 + i, b"k%d" % i, b"v" * 100) for i in range(n)]


@given(base_offset=st.integers(0, 2**62), epoch=st.integers(0, 2**31 - 1))
def test_patching_offset_and_epoch_keeps_the_crc_and_every_other_byte(
    base_offset: int, epoch: int
) -> None:
    original = build_batch(_records(3), codec=Codec.LZ4)
    patched = bytearray(original)
    set_base_offset(patched, 0, base_offset)
    set_partition_leader_epoch(patched, 0, epoch)
    header = validate_batch(patched)
    assert header.base_offset == base_offset
    assert header.partition_leader_epoch == epoch
    assert patched[16:] == original[16:]
    assert [r.offset for r in iter_records(patched)] == [
        base_offset,
        base_offset + 1,
        base_offset + 2,
    ]


def test_log_append_time_rewrites_max_timestamp_and_crc() -> None:
    batch = bytearray(build_batch(_records(2)))
    set_log_append_time(batch, 0, 1_800_000_000_000)
    header = validate_batch(batch)
    assert header.is_log_append_time
    assert header.max_timestamp == 1_800_000_000_000
    # Every record of a LogAppendTime batch reads as the append time (Kafka's DefaultRecordBatch).
    assert [r.timestamp for r in iter_records(batch)] == [1_800_000_000_000] * 2


@pytest.mark.parametrize("position", range(21, 120, 7))
def test_any_flipped_byte_under_the_crc_is_detected(position: int) -> None:
    batch = bytearray(build_batch(_records(2)))
    batch[position] ^= 0x01
    with pytest.raises(MalformedInput, match=r"CRC mismatch|batch at byte 0"):
        validate_batch(batch)


@pytest.mark.parametrize("where", ["first piece", "a piece boundary", "last byte"])
def test_a_large_batchs_crc_is_checked_in_pieces_to_the_last_byte(where: str) -> None:
    """Batches over 1 MiB are checksummed a piece at a time: a valid one passes, and a byte
    flipped anywhere, the last piece included, is still caught."""
    batch = bytearray(build_batch([Record(0, 1_700_000_000_000, b"k", os.urandom(3 << 20))]))
    validate_batch(bytes(batch))
    position = {"first piece": 30, "a piece boundary": 21 + (1 << 20), "last byte": -1}[where]
    batch[position] ^= 0x01
    with pytest.raises(MalformedInput, match="CRC mismatch"):
        validate_batch(bytes(batch))


def test_truncated_batch_is_malformed() -> None:
    batch = build_batch(_records(2))
    with pytest.raises(MalformedInput, match="truncated"):
        validate_batch(batch[:-1])


def test_header_shorter_than_61_bytes_is_malformed() -> None:
    with pytest.raises(MalformedInput, match="61-byte batch header"):
        read_batch_header(b"\x00" * 60)


def test_old_magic_is_refused() -> None:
    batch = bytearray(build_batch(_records(1)))
    batch[16] = 1
    with pytest.raises(MalformedInput, match="magic 1"):
        read_batch_header(batch)


def test_iter_batches_walks_concatenated_batches() -> None:
    first = build_batch(_records(2, offset=0))
    second = build_batch(_records(3, offset=2), codec=Codec.ZSTD)
    found = list(iter_batches(first + second))
    assert [(pos, h.base_offset, h.records_count) for pos, h in found] == [
        (0, 0, 2),
        (len(first), 2, 3),
    ]


def test_partial_tail_ends_iteration_only_when_allowed() -> None:
    """A fetch response may end inside a batch (KIP-74); a produce request may not."""
    data = build_batch(_records(2)) + build_batch(_records(2, offset=2))[:-5]
    assert len(list(iter_batches(data, allow_partial_tail=True))) == 1
    with pytest.raises(MalformedInput, match="truncated"):
        list(iter_batches(data))


def test_record_count_larger_than_the_records_is_malformed() -> None:
    batch = bytearray(build_batch(_records(2)))
    struct.pack_into(">i", batch, 57, 3)
    # Recompute the CRC so that only the count is wrong.
    struct.pack_into(">I", batch, 17, google_crc32c.value(bytes(batch[21:])))
    with pytest.raises(MalformedInput, match=r"truncated|varint"):
        list(iter_records(batch))


def test_compacted_empty_batch_keeps_its_offsets() -> None:
    batch = build_batch([], base_offset=100, last_offset_delta=9, base_timestamp=5)
    header = validate_batch(batch)
    assert (header.base_offset, header.last_offset, header.records_count) == (100, 109, 0)
    assert len(batch) == BATCH_HEADER_SIZE
    assert list(iter_records(batch)) == []
