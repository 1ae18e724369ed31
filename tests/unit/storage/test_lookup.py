"""Lookups a client or a follower relies on: by timestamp (ListOffsets), by leader epoch
(OffsetForLeaderEpoch), and truncation back to an offset (a diverged follower)."""

from __future__ import annotations

import random

import pytest

from broker.protocol import Codec
from broker.protocol.records import Record
from broker.storage import Log, LogConfig

from .logs import SMALL, LogOpener, batch, consume, fill, headers, offsets_of, records_of

CODECS = list(Codec)


def _timestamped(open_log: LogOpener) -> Log:
    """Several segments of batches in every codec, records' timestamps out of order within
    and across batches, leader epochs changing every eight batches."""
    rng = random.Random(11)
    log = open_log(SMALL)
    for i in range(40):
        stamps = [rng.randrange(10_000, 10_400) + 10 * i for _ in range(rng.randrange(1, 5))]
        data = batch(timestamps=stamps, codec=CODECS[i % len(CODECS)])
        log.append_as_leader(data, leader_epoch=i // 8, now_ms=0)
    assert len(log.segments) >= 3
    return log


def _first_at_or_after(records: list[Record], timestamp: int) -> tuple[int, int] | None:
    return next(((r.offset, r.timestamp) for r in records if r.timestamp >= timestamp), None)


def test_offset_for_timestamp_finds_the_first_record_at_or_after_it(open_log: LogOpener) -> None:
    log = _timestamped(open_log)
    records = records_of(consume(log))
    targets = sorted({t for r in records for t in (r.timestamp - 1, r.timestamp, r.timestamp + 1)})
    for target in [0, *targets]:
        found = log.offset_for_timestamp(target)
        expected = _first_at_or_after(records, target)
        assert (found and found[:2]) == expected, f"timestamp {target}"
    assert log.offset_for_timestamp(max(r.timestamp for r in records) + 1) is None
    log.close(now_ms=1)


def test_offset_for_timestamp_reports_the_epoch_that_wrote_the_record(open_log: LogOpener) -> None:
    log = _timestamped(open_log)
    epoch_of = {
        offset: header.partition_leader_epoch
        for header in headers(consume(log))
        for offset in range(header.base_offset, header.last_offset + 1)
    }
    for record in records_of(consume(log))[::5]:
        found = log.offset_for_timestamp(record.timestamp)
        assert found is not None
        assert found[2] == epoch_of[found[0]]
    log.close(now_ms=1)


def test_offset_for_timestamp_ignores_records_below_the_log_start(open_log: LogOpener) -> None:
    log = open_log(SMALL)
    log.append_as_leader(batch(timestamps=[100, 110, 120]), leader_epoch=0, now_ms=0)
    log.append_as_leader(batch(timestamps=[130, 140, 150]), leader_epoch=0, now_ms=0)
    log.delete_records(4)
    assert log.offset_for_timestamp(100) == (4, 140, 0)
    assert log.offset_for_timestamp(145) == (5, 150, 0)
    log.close(now_ms=1)


@pytest.mark.parametrize("codec", CODECS, ids=[c.name.lower() for c in CODECS])
def test_offset_for_timestamp_looks_inside_compressed_batches(
    open_log: LogOpener, codec: Codec
) -> None:
    log = open_log(SMALL)
    log.append_as_leader(
        batch(timestamps=[10, 50, 20, 40, 30], codec=codec), leader_epoch=3, now_ms=0
    )
    assert log.offset_for_timestamp(15) == (1, 50, 3)
    assert log.offset_for_timestamp(5) == (0, 10, 3)
    assert log.offset_for_timestamp(51) is None
    log.close(now_ms=1)


# -- leader epochs ----------------------------------------------------------------------------


def _epochs_1_3_4(open_log: LogOpener) -> Log:
    """Epoch 1 at offsets 0-5, epoch 3 at 6-8, epoch 4 at 9-11."""
    log = open_log(SMALL)
    for epoch in (1, 1, 3, 4):
        log.append_as_leader(batch(3), leader_epoch=epoch, now_ms=0)
    return log


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD], ids=["plain", "zstd"])
def test_the_max_timestamp_is_the_record_that_carries_it(open_log: LogOpener, codec: Codec) -> None:
    """ListOffsets MAX_TIMESTAMP answers the record with the largest timestamp, not its
    batch's last offset (KAFKA-16310), and the earliest such record across segments."""
    log = open_log(LogConfig(segment_bytes=300, index_interval_bytes=1))
    log.append_as_leader(batch(timestamps=[5, 9, 7], codec=codec), leader_epoch=0, now_ms=0)
    log.roll(now_ms=0)
    log.append_as_leader(batch(timestamps=[8, 8], codec=codec), leader_epoch=1, now_ms=0)
    log.append_as_leader(batch(timestamps=[9, 3], codec=codec), leader_epoch=2, now_ms=0)
    assert len(log.segments) >= 2
    assert log.max_timestamp_record() == (1, 9, 0)
    log.append_as_leader(batch(timestamps=[1, 12, 12], codec=codec), leader_epoch=2, now_ms=0)
    assert log.max_timestamp_record() == (8, 12, 2)
    log.close(now_ms=1)


def test_end_offset_for_epoch_follows_kafkas_rules(open_log: LogOpener) -> None:
    log = _epochs_1_3_4(open_log)
    assert log.end_offset_for_epoch(4) == (4, 12)  # the latest epoch ends at the log end
    assert log.end_offset_for_epoch(3) == (3, 9)  # an older one where the next begins
    assert log.end_offset_for_epoch(1) == (1, 6)
    assert log.end_offset_for_epoch(2) == (1, 6)  # unknown in between: the one before it
    assert log.end_offset_for_epoch(0) == (0, 0)  # older than all: where the first begins
    assert log.end_offset_for_epoch(5) == (-1, -1)  # newer than all: undefined
    assert log.end_offset_for_epoch(-1) == (-1, -1)
    log.close(now_ms=1)


def test_an_empty_log_knows_no_epoch(open_log: LogOpener) -> None:
    log = open_log(SMALL)
    assert log.end_offset_for_epoch(0) == (-1, -1)
    log.close(now_ms=1)


# -- truncation -------------------------------------------------------------------------------


def test_truncation_removes_whole_batches_and_their_epochs(open_log: LogOpener) -> None:
    log = _epochs_1_3_4(open_log)
    log.truncate_to(12)  # at the end: nothing to do
    log.truncate_to(50)
    assert log.log_end_offset == 12
    log.truncate_to(10)  # inside 9-11: the batch goes whole
    assert log.log_end_offset == 9
    assert log.epochs.entries() == [(1, 0), (3, 6)]
    assert log.end_offset_for_epoch(3) == (3, 9)
    log.truncate_to(6)
    assert log.epochs.entries() == [(1, 0)]
    assert offsets_of(log) == list(range(6))
    assert log.recovery_point <= 6
    log.append_as_leader(batch(2), leader_epoch=5, now_ms=0)
    assert offsets_of(log) == list(range(8))
    assert log.end_offset_for_epoch(1) == (1, 6)
    log.close(now_ms=1)


def test_truncation_across_segments_deletes_the_later_ones(open_log: LogOpener) -> None:
    log = open_log(SMALL)
    for i in range(30):
        log.append_as_leader(batch(3, timestamp=1_000 + i), leader_epoch=0, now_ms=0)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 3
    target = bases[1] + 4  # inside the second batch of the second segment
    log.truncate_to(target)
    assert log.log_end_offset == bases[1] + 3
    assert [s.base_offset for s in log.segments] == bases[:2]
    assert sorted(p.name for p in open_log.directory.glob("*.log")) == [
        f"{b:020d}.log" for b in bases[:2]
    ]
    assert not list(open_log.directory.glob(f"{bases[2]:020d}.*"))
    # Nothing of the removed records can be found any more, by offset or by time.
    assert all(
        position < log.active_segment.size
        for _, position in log.active_segment.offset_index.entries()
    )
    assert log.offset_for_timestamp(1_000 + 30) is None
    log.append_as_leader(batch(3, timestamp=2_000), leader_epoch=1, now_ms=0)
    assert offsets_of(log) == list(range(bases[1] + 6))
    assert log.offset_for_timestamp(1_500) == (bases[1] + 3, 2_000, 1)
    log.close(now_ms=1)

    again = open_log(SMALL)
    assert offsets_of(again) == list(range(bases[1] + 6))
    again.close(now_ms=2)


def test_truncate_fully_starts_an_empty_log_at_the_leaders_offset(open_log: LogOpener) -> None:
    log = open_log(SMALL)
    fill(log, 20)
    log.truncate_fully_and_start_at(1_000, now_ms=0)
    assert (log.log_start_offset, log.log_end_offset) == (1_000, 1_000)
    assert [p.name for p in open_log.directory.glob("*.log")] == [f"{1_000:020d}.log"]
    assert log.epochs.entries() == []
    log.append_as_follower(batch(2, offset=1_000, epoch=7), now_ms=0)
    assert offsets_of(log) == [1_000, 1_001]
    log.close(now_ms=1)
    again = open_log(LogConfig())
    assert (again.log_start_offset, again.log_end_offset) == (1_000, 1_002)
    again.close(now_ms=2)
