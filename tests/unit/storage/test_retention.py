"""Retention: `retention.ms`, `retention.bytes` and DeleteRecords remove the oldest closed
segments — never the active one — by renaming them `.deleted`, so that reads in flight finish."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from broker.storage import Log, LogConfig, LogSegment, OffsetOutOfRange

from .logs import LogOpener, batch, consume, offsets_of, segment_names

BASE = LogConfig(segment_bytes=1 << 20, index_interval_bytes=100, retention_ms=10_000)


def _five_segments(
    open_log: LogOpener,
    config: LogConfig,
    stamps: list[int] | None = None,
    directory: Path | None = None,
) -> Log:
    """Segments 0-4 (4 active), two batches of three records each, so bases 0, 6, 12, 18, 24;
    the records of segment i have timestamp `stamps[i]` (default (i + 1) * 1000)."""
    stamps = stamps or [(i + 1) * 1_000 for i in range(5)]
    log = open_log(config, directory=directory)
    for i, stamp in enumerate(stamps):
        if i:
            log.roll(now_ms=stamp)
        for _ in range(2):
            log.append_as_leader(batch(3, timestamp=stamp), leader_epoch=i, now_ms=stamp)
    assert [s.base_offset for s in log.segments] == [0, 6, 12, 18, 24]
    return log


def _close(doomed: list[LogSegment]) -> None:
    """What the log dir manager does `file.delete.delay.ms` later."""
    for segment in doomed:
        segment.close()


def test_retention_ms_deletes_closed_segments_whose_newest_record_is_older(
    open_log: LogOpener,
) -> None:
    log = _five_segments(open_log, BASE)
    assert log.delete_old_segments(now_ms=11_000) == []  # exactly retention.ms old: kept
    doomed = log.delete_old_segments(now_ms=12_001)
    assert [s.base_offset for s in doomed] == [0, 6]
    assert log.log_start_offset == 12
    assert offsets_of(log) == list(range(12, 30))
    with pytest.raises(OffsetOutOfRange):
        log.read(11, 1000)
    _close(doomed)
    log.close(now_ms=12_002)


def test_the_active_segment_is_never_deleted(open_log: LogOpener) -> None:
    log = _five_segments(open_log, BASE)
    doomed = log.delete_old_segments(now_ms=10**9)
    assert [s.base_offset for s in doomed] == [0, 6, 12, 18]
    assert [s.base_offset for s in log.segments] == [24]
    assert offsets_of(log) == list(range(24, 30))
    assert log.epochs.entries() == [(4, 24)]
    _close(doomed)
    log.close(now_ms=10**9)


def test_retention_deletes_only_what_the_high_watermark_has_passed(open_log: LogOpener) -> None:
    """A leader's records not yet on every in-sync replica stay, however old (Kafka's
    deletableSegments): a follower still fetching them would find them gone."""
    log = _five_segments(open_log, BASE)
    high_watermark = 13
    log.committed = lambda: high_watermark
    doomed = log.delete_old_segments(now_ms=10**9)
    # Segment 6-11 goes (the high watermark reached 12); 12-17 waits for it to reach 18.
    assert [s.base_offset for s in doomed] == [0, 6]
    high_watermark = 30
    doomed += log.delete_old_segments(now_ms=10**9)
    assert [s.base_offset for s in doomed] == [0, 6, 12, 18]
    _close(doomed)
    log.close(now_ms=10**9)


def test_retention_stops_at_the_first_segment_to_keep(open_log: LogOpener) -> None:
    """Only a prefix of the log goes: an old segment after a recent one waits its turn."""
    log = _five_segments(open_log, BASE, stamps=[50_000, 1_000, 1_000, 1_000, 1_000])
    assert log.delete_old_segments(now_ms=20_000) == []
    assert log.log_start_offset == 0
    log.close(now_ms=20_000)


def test_retention_bytes_deletes_the_oldest_segments_above_the_limit(open_log: LogOpener) -> None:
    config = dataclasses.replace(BASE, retention_ms=-1)
    log = _five_segments(open_log, config)
    size = log.segments[0].size
    log.close(now_ms=5_000)

    for limit, deleted in [
        (5 * size, []),
        (4 * size, [0]),
        (int(2.5 * size), [0, 6]),
        (0, [0, 6, 12, 18]),
    ]:
        directory = open_log.directory.parent / f"limit{limit}-0"
        limited = dataclasses.replace(config, retention_bytes=limit)
        log = _five_segments(open_log, limited, directory=directory)
        doomed = log.delete_old_segments(now_ms=5_000)
        assert [s.base_offset for s in doomed] == deleted, f"retention.bytes={limit}"
        _close(doomed)
        log.close(now_ms=5_000)


def test_a_compact_only_topic_ignores_time_and_size(open_log: LogOpener) -> None:
    config = dataclasses.replace(BASE, cleanup_policy=frozenset({"compact"}), retention_bytes=0)
    log = _five_segments(open_log, config)
    assert log.delete_old_segments(now_ms=10**9) == []
    # DeleteRecords still applies: it is the user's request, not a retention policy.
    log.delete_records(13)
    doomed = log.delete_old_segments(now_ms=10**9)
    assert [s.base_offset for s in doomed] == [0, 6]
    _close(doomed)
    log.close(now_ms=10**9)


def test_delete_records_moves_the_log_start_and_frees_whole_segments(open_log: LogOpener) -> None:
    log = _five_segments(open_log, dataclasses.replace(BASE, retention_ms=-1))
    assert log.delete_records(14) == 14
    assert log.log_start_offset == 14
    assert log.delete_records(3) == 14  # never backwards
    with pytest.raises(OffsetOutOfRange):
        log.delete_records(31)
    # Offsets below the new start are gone for readers at once, files go with retention.
    with pytest.raises(OffsetOutOfRange):
        log.read(13, 1000)
    assert offsets_of(log)[0] == 12  # the batch holding 14 starts at 12; consumers skip to 14
    assert log.epochs.entries() == [(2, 14), (3, 18), (4, 24)]
    doomed = log.delete_old_segments(now_ms=0)
    assert [s.base_offset for s in doomed] == [0, 6]
    assert log.log_start_offset == 14
    _close(doomed)
    log.close(now_ms=1)

    again = open_log(dataclasses.replace(BASE, retention_ms=-1), log_start_offset=14)
    assert again.log_start_offset == 14
    assert segment_names(open_log.directory) == [f"{b:020d}.log" for b in (12, 18, 24)]
    again.close(now_ms=2)


def test_deleted_segments_are_renamed_and_still_readable_until_closed(
    open_log: LogOpener,
) -> None:
    log = _five_segments(open_log, BASE)
    in_flight = log.read(0, 1 << 20)
    assert in_flight is not None
    expected = b"".join(consume(log)[:2])
    doomed = log.delete_old_segments(now_ms=12_001)

    names = sorted(p.name for p in open_log.directory.iterdir())
    for base in (0, 6):
        stem = f"{base:020d}"
        assert f"{stem}.log" not in names
        for suffix in (".log", ".index", ".timeindex"):
            assert f"{stem}{suffix}.deleted" in names
    assert in_flight.read() == expected
    _close(doomed)
    log.close(now_ms=12_002)

    # A restart finishes deletions the previous run left pending.
    again = open_log(BASE)
    assert not list(open_log.directory.glob("*.deleted"))
    assert again.log_start_offset == 12
    again.close(now_ms=12_003)
