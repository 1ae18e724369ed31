"""Gregor's partition directory, checked by a reader written here from Kafka's format
description alone — record batch v2, `.index`, `.timeindex`, `leader-epoch-checkpoint` — with
`struct`, `google_crc32c` and the codecs' own libraries, none of Gregor's reading code.

Formats (all integers big-endian):
  batch   baseOffset int64, batchLength int32 (bytes after this field), partitionLeaderEpoch
          int32, magic int8 (2), crc uint32 (CRC-32C of attributes..end), attributes int16
          (bits 0-2 codec), lastOffsetDelta int32, baseTimestamp int64, maxTimestamp int64,
          producerId int64, producerEpoch int16, baseSequence int32, recordCount int32, records
          (compressed as a whole by the codec).
  record  length varint, attributes int8, timestampDelta varlong, offsetDelta varint, key
          (varint length, -1 = null), value (same), header count varint, headers (varint-length
          key, varint-length value). Varints are zigzag-encoded.
  .index      entries of relativeOffset int32, position int32: the batch at `position` in the
              `.log` file has last offset baseOffset(file) + relativeOffset.
  .timeindex  entries of timestamp int64, relativeOffset int32: the largest timestamp so far in
              the segment, and the offset of the batch that reached it.
  leader-epoch-checkpoint  "0\\n<count>\\n" then "<epoch> <start offset>\\n" per epoch.
Segment files are named by their first offset, 20 digits zero-padded.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cramjam
import google_crc32c
import lz4.frame
import pytest
import zstandard

from broker.protocol import Codec
from broker.protocol.records import Record, build_batch
from broker.storage import Log, LogConfig

from .logs import LogOpener, abandon

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
INDEX_ENTRY = struct.Struct(">ii")
TIME_INDEX_ENTRY = struct.Struct(">qi")
CONFIG = LogConfig(segment_bytes=3_000, index_interval_bytes=300)


# -- the independent reader -------------------------------------------------------------------


@dataclass(frozen=True)
class DiskBatch:
    position: int
    size: int
    base_offset: int
    leader_epoch: int
    last_offset_delta: int
    max_timestamp: int
    records: list[tuple[int, int]]
    """(offset, timestamp) of every record."""

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    raw = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def _skip_bytes(data: bytes, pos: int) -> int:
    length, pos = _varint(data, pos)
    return pos + max(length, 0)


def _decompress(codec: int, data: bytes) -> bytes:
    if codec == 0:
        return data
    if codec == 1:
        return zlib.decompress(data, 31)
    if codec == 2:
        return bytes(cramjam.snappy.decompress_raw(data))
    if codec == 3:
        return bytes(lz4.frame.decompress(data))
    if codec == 4:
        return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(data))
    raise AssertionError(f"unknown codec {codec}")


def _records(
    base_offset: int, base_timestamp: int, count: int, data: bytes
) -> list[tuple[int, int]]:
    records, pos = [], 0
    for _ in range(count):
        length, pos = _varint(data, pos)
        end = pos + length
        pos += 1  # attributes
        timestamp_delta, pos = _varint(data, pos)
        offset_delta, pos = _varint(data, pos)
        pos = _skip_bytes(data, _skip_bytes(data, pos))  # key, value
        headers, pos = _varint(data, pos)
        for _ in range(headers):
            pos = _skip_bytes(data, _skip_bytes(data, pos))
        assert pos == end, "a record's length does not match its fields"
        records.append((base_offset + offset_delta, base_timestamp + timestamp_delta))
    assert pos == len(data), "bytes left after the last record"
    return records


def read_log_file(path: Path) -> list[DiskBatch]:
    data = path.read_bytes()
    batches, pos = [], 0
    while pos < len(data):
        assert len(data) - pos >= BATCH_HEADER.size, f"{path.name}: torn header at {pos}"
        (base, length, epoch, magic, crc, attributes, delta, first_ts, max_ts, _, _, _, count) = (
            BATCH_HEADER.unpack_from(data, pos)
        )
        end = pos + 12 + length
        assert end <= len(data), f"{path.name}: torn batch at {pos}"
        assert magic == 2, f"{path.name}: magic {magic} at {pos}"
        assert google_crc32c.value(data[pos + 21 : end]) == crc, f"{path.name}: CRC at {pos}"
        payload = _decompress(attributes & 0x07, data[pos + BATCH_HEADER.size : end])
        records = _records(base, first_ts, count, payload)
        assert [offset - base for offset, _ in records] == list(range(count))
        assert delta == count - 1
        assert max_ts == max(ts for _, ts in records)
        batches.append(DiskBatch(pos, end - pos, base, epoch, delta, max_ts, records))
        pos = end
    return batches


def check_offset_index(path: Path, base: int, batches: list[DiskBatch]) -> int:
    data = path.read_bytes()
    assert len(data) % INDEX_ENTRY.size == 0
    at = {b.position: b for b in batches}
    previous = (-1, -1)
    for relative, position in INDEX_ENTRY.iter_unpack(data):
        assert relative > previous[0], f"{path.name} goes backwards"
        assert position > previous[1], f"{path.name} goes backwards"
        assert position in at, f"{path.name}: position {position} is not a batch start"
        assert at[position].last_offset == base + relative, f"{path.name}: wrong offset"
        previous = (relative, position)
    return len(data) // INDEX_ENTRY.size


def check_time_index(path: Path, base: int, batches: list[DiskBatch]) -> int:
    data = path.read_bytes()
    assert len(data) % TIME_INDEX_ENTRY.size == 0
    running_max, max_so_far = {}, -1
    for b in batches:
        max_so_far = max(max_so_far, b.max_timestamp)
        running_max[b.last_offset] = (max_so_far, b.max_timestamp)
    previous = (-1, -1)
    for timestamp, relative in TIME_INDEX_ENTRY.iter_unpack(data):
        assert timestamp > previous[0], f"{path.name} goes backwards"
        assert relative >= previous[1], f"{path.name} goes backwards"
        assert base + relative in running_max, f"{path.name}: {base + relative} ends no batch"
        so_far, own = running_max[base + relative]
        # The largest timestamp so far, reached by the batch the entry points at.
        assert timestamp == so_far == own, f"{path.name}: entry ({timestamp}, {relative})"
        previous = (timestamp, relative)
    return len(data) // TIME_INDEX_ENTRY.size


def read_epoch_checkpoint(path: Path) -> list[tuple[int, int]]:
    text = path.read_text()
    assert text.endswith("\n")
    version, count, *lines = text.split("\n")[:-1]
    assert version == "0"
    assert int(count) == len(lines)
    entries = [tuple(int(field) for field in line.split(" ")) for line in lines]
    assert all(len(entry) == 2 for entry in entries)
    return [(entry[0], entry[1]) for entry in entries]


def check_partition_dir(directory: Path, interval: int) -> list[DiskBatch]:
    """Every check above, over a whole partition directory; returns all batches in order."""
    every: list[DiskBatch] = []
    logs = sorted(directory.glob("*.log"))
    assert logs
    for number, path in enumerate(logs):
        stem = path.name.removesuffix(".log")
        assert len(stem) == 20, path.name
        assert stem.isdigit(), path.name
        base = int(stem)
        batches = read_log_file(path)
        if batches:
            assert batches[0].base_offset == base, f"{path.name} starts at {batches[0].base_offset}"
        else:
            assert number == len(logs) - 1, f"empty segment {path.name} before the last"
        entries = check_offset_index(directory / f"{stem}.index", base, batches)
        check_time_index(directory / f"{stem}.timeindex", base, batches)
        if batches and batches[-1].position > 2 * interval:
            assert entries > 0, f"{path.name}: no index entry in {batches[-1].position} bytes"
        every += batches
    offsets = [offset for b in every for offset, _ in b.records]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "offsets not contiguous"
    # Each epoch starts at the first batch stamped with it.
    starts: list[tuple[int, int]] = []
    for b in every:
        if not starts or b.leader_epoch != starts[-1][0]:
            starts.append((b.leader_epoch, b.base_offset))
    assert read_epoch_checkpoint(directory / "leader-epoch-checkpoint") == starts
    return every


# -- Gregor writes ----------------------------------------------------------------------------


def _random_batch(rng: random.Random, offset: int, epoch: int = -1) -> bytes:
    count = rng.randrange(1, 7)
    records = [
        Record(
            offset + i,
            rng.randrange(1_000_000, 1_000_500) + 100 * offset,
            None if rng.random() < 0.2 else rng.randbytes(4),
            rng.choice([b"", b"a" * rng.randrange(200), rng.randbytes(rng.randrange(100))]),
            tuple(("h", rng.randbytes(3)) for _ in range(rng.randrange(3))),
        )
        for i in range(count)
    ]
    return build_batch(records, codec=rng.choice(list(Codec)), partition_leader_epoch=epoch)


def _write(log: Log, rng: random.Random, appends: int, epoch: int) -> None:
    for _ in range(appends):
        data = _random_batch(rng, 0)
        if rng.random() < 0.3:
            data += _random_batch(rng, 0)
        log.append_as_leader(data, leader_epoch=epoch, now_ms=0)


def _clean_close(open_log: LogOpener, log: Log, rng: random.Random) -> None:
    log.close(now_ms=1)


def _crash_lose_indexes_and_recover(open_log: LogOpener, log: Log, rng: random.Random) -> None:
    abandon(log)
    for path in open_log.directory.glob("*index"):
        path.unlink()
    with open(log.active_segment.log_path, "ab") as out:
        out.write(rng.randbytes(40))
    open_log(CONFIG, clean_shutdown=False).close(now_ms=1)


def _truncate_and_go_on(open_log: LogOpener, log: Log, rng: random.Random) -> None:
    log.truncate_to(log.segments[-2].base_offset + 5)
    _write(log, rng, 15, epoch=9)
    for _ in range(5):  # a follower copying its leader's batches
        log.append_as_follower(_random_batch(rng, log.log_end_offset, epoch=11), now_ms=0)
    log.close(now_ms=1)


@pytest.mark.parametrize(
    "finish",
    [_clean_close, _crash_lose_indexes_and_recover, _truncate_and_go_on],
    ids=["clean-close", "crash-recovery", "truncation"],
)
def test_gregor_writes_what_a_kafka_reader_expects(
    open_log: LogOpener, finish: Callable[[LogOpener, Log, random.Random], None]
) -> None:
    rng = random.Random(2024)
    log = open_log(CONFIG)
    for epoch in (0, 2, 5):
        _write(log, rng, 25, epoch)
    assert len(log.segments) >= 4
    finish(open_log, log, rng)

    batches = check_partition_dir(open_log.directory, CONFIG.index_interval_bytes)
    reopened = open_log(CONFIG)
    assert reopened.log_end_offset == batches[-1].last_offset + 1
    assert {b.leader_epoch for b in batches} >= {0, 2}
    reopened.close(now_ms=2)


def test_the_reader_catches_what_it_checks(open_log: LogOpener) -> None:
    """The reader would fail on a damaged directory, so its passing means something."""
    log = open_log(CONFIG)
    _write(log, random.Random(1), 40, epoch=0)
    log.close(now_ms=1)
    check_partition_dir(open_log.directory, CONFIG.index_interval_bytes)
    first = open_log.directory / f"{0:020d}.log"
    index = open_log.directory / f"{0:020d}.index"
    good_log, good_index = first.read_bytes(), index.read_bytes()

    damaged = bytearray(good_log)
    damaged[100] ^= 1
    first.write_bytes(bytes(damaged))
    with pytest.raises(AssertionError, match="CRC"):
        check_partition_dir(open_log.directory, CONFIG.index_interval_bytes)
    first.write_bytes(good_log)

    relative, position = INDEX_ENTRY.unpack_from(good_index, 0)
    index.write_bytes(INDEX_ENTRY.pack(relative, position + 1) + good_index[8:])
    with pytest.raises(AssertionError, match="is not a batch start"):
        check_partition_dir(open_log.directory, CONFIG.index_interval_bytes)
    index.write_bytes(INDEX_ENTRY.pack(relative - 1, position) + good_index[8:])
    with pytest.raises(AssertionError, match="wrong offset"):
        check_partition_dir(open_log.directory, CONFIG.index_interval_bytes)
    index.write_bytes(good_index)

    time_index = open_log.directory / f"{0:020d}.timeindex"
    timestamp, relative = TIME_INDEX_ENTRY.unpack_from(time_index.read_bytes(), 0)
    time_index.write_bytes(TIME_INDEX_ENTRY.pack(timestamp - 1, relative))
    with pytest.raises(AssertionError, match="timeindex: entry"):
        check_partition_dir(open_log.directory, CONFIG.index_interval_bytes)
