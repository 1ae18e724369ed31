"""When a new segment starts (`segment.bytes`, `segment.ms`, a full index) and when data is
fsynced (`flush.messages`, `flush.ms`, roll), observed through the recovery point."""

from __future__ import annotations

import os
from pathlib import Path

from broker.storage import LogConfig

from .logs import LogOpener, batch, consume, fill, offsets_of, segment_names


def test_segment_bytes_rolls_before_a_segment_would_grow_past_it(open_log: LogOpener) -> None:
    size = len(batch(3))
    log = open_log(LogConfig(segment_bytes=4 * size + 10, index_interval_bytes=100))
    fill(log, 10)
    bases = [s.base_offset for s in log.segments]
    assert bases == [0, 12, 24]  # four batches of three records per segment
    assert segment_names(open_log.directory) == [f"{b:020d}.log" for b in bases]
    for suffix in (".index", ".timeindex"):
        assert segment_names(open_log.directory, suffix) == [f"{b:020d}{suffix}" for b in bases]
    sizes = [os.path.getsize(open_log.directory / f"{b:020d}.log") for b in bases]
    assert sizes == [4 * size, 4 * size, 2 * size]
    assert offsets_of(log) == list(range(30))
    log.close(now_ms=1)


def test_a_batch_that_exactly_fills_the_segment_does_not_roll(open_log: LogOpener) -> None:
    size = len(batch(3))
    log = open_log(LogConfig(segment_bytes=2 * size))
    fill(log, 2)
    assert len(log.segments) == 1
    fill(log, 1)
    assert [s.base_offset for s in log.segments] == [0, 6]
    log.close(now_ms=1)


def test_segment_ms_rolls_on_the_age_of_the_first_batch(open_log: LogOpener) -> None:
    log = open_log(LogConfig(segment_ms=1_000))
    log.append_as_leader(batch(timestamp=50_000), leader_epoch=0, now_ms=50_000)
    # The segment was created at 0, but its first batch is what ages.
    log.append_as_leader(batch(timestamp=50_100), leader_epoch=0, now_ms=51_000)
    assert len(log.segments) == 1
    log.append_as_leader(batch(timestamp=51_001), leader_epoch=0, now_ms=51_001)
    assert [s.base_offset for s in log.segments] == [0, 6]
    log.close(now_ms=51_002)


def test_records_with_an_old_create_time_do_not_roll_a_segment_each(
    open_log: LogOpener,
) -> None:
    """Kafka measures `segment.ms` from the first batch's timestamp to the incoming batch's,
    not to the wall clock: two-day-old CreateTimes used to roll one segment per batch (and
    each segment costs a file descriptor) until the node ran out of them."""
    day_ms = 86_400_000
    now_ms = 10 * day_ms
    log = open_log(LogConfig(segment_ms=3_600_000), now_ms=now_ms)
    for i in range(50):
        created = now_ms - 2 * day_ms + i * 1_000
        log.append_as_leader(batch(timestamp=created), leader_epoch=0, now_ms=now_ms + i)
    assert len(log.segments) == 1
    # Their own timestamps move past segment.ms: now it rolls.
    late = now_ms - 2 * day_ms + 3_600_001
    log.append_as_leader(batch(timestamp=late), leader_epoch=0, now_ms=now_ms + 60)
    assert [s.base_offset for s in log.segments] == [0, 150]
    log.close(now_ms=now_ms + 61)


def test_without_timestamps_a_segment_ages_from_its_creation(open_log: LogOpener) -> None:
    log = open_log(LogConfig(segment_ms=1_000), now_ms=5_000)
    log.append_as_leader(batch(timestamp=-1), leader_epoch=0, now_ms=5_000)
    log.append_as_leader(batch(timestamp=-1), leader_epoch=0, now_ms=6_000)
    assert len(log.segments) == 1
    log.append_as_leader(batch(timestamp=-1), leader_epoch=0, now_ms=6_001)
    assert [s.base_offset for s in log.segments] == [0, 6]
    log.close(now_ms=6_002)


def test_a_full_offset_index_rolls_the_segment(open_log: LogOpener) -> None:
    # Two 8-byte entries; with index.interval.bytes=0 every batch but the first gets one.
    log = open_log(LogConfig(segment_index_bytes=16, index_interval_bytes=0))
    fill(log, 7)
    assert [s.base_offset for s in log.segments] == [0, 9, 18]
    for path in open_log.directory.glob("*.index"):
        assert path.stat().st_size <= 16
    log.close(now_ms=1)


def test_an_explicit_roll_starts_at_the_log_end_and_never_leaves_an_empty_segment(
    open_log: LogOpener,
) -> None:
    log = open_log(LogConfig())
    fill(log, 2)
    log.roll(now_ms=0)
    log.roll(now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 6]
    log.roll(now_ms=0, base_offset=20)  # an empty active segment is replaced, not kept
    assert segment_names(open_log.directory) == [f"{0:020d}.log", f"{20:020d}.log"]
    log.close(now_ms=1)


# -- flushing ---------------------------------------------------------------------------------


def test_flush_messages_fsyncs_after_that_many_records(
    open_log: LogOpener, fsyncs: list[Path]
) -> None:
    log = open_log(LogConfig(flush_messages=6))
    fill(log, 1)
    assert log.recovery_point == 0
    assert fsyncs == []
    fill(log, 1)  # six records
    assert log.recovery_point == 6
    assert log.active_segment.log_path in fsyncs
    fill(log, 1)
    assert log.recovery_point == 6
    fill(log, 1)
    assert log.recovery_point == 12
    log.close(now_ms=1)


def test_flush_ms_fsyncs_when_the_oldest_unflushed_append_is_that_old(
    open_log: LogOpener,
) -> None:
    log = open_log(LogConfig(flush_ms=100), now_ms=1_000)
    log.append_as_leader(batch(), leader_epoch=0, now_ms=1_050)
    assert log.recovery_point == 0
    log.append_as_leader(batch(), leader_epoch=0, now_ms=1_100)
    assert log.recovery_point == 6
    log.append_as_leader(batch(), leader_epoch=0, now_ms=1_150)
    log.maybe_flush(now_ms=1_199)
    assert log.recovery_point == 6
    log.maybe_flush(now_ms=1_200)
    assert log.recovery_point == 9
    log.close(now_ms=1_300)


def test_by_default_only_a_roll_or_a_flush_moves_the_recovery_point(
    open_log: LogOpener, fsyncs: list[Path]
) -> None:
    size = len(batch(3))
    log = open_log(LogConfig(segment_bytes=10 * size))
    fill(log, 9)
    log.maybe_flush(now_ms=10**9)
    assert log.recovery_point == 0
    assert fsyncs == []
    fill(log, 2)  # the tenth batch fills the segment, the eleventh rolls it: fsync
    assert log.recovery_point == 30
    assert open_log.directory / f"{0:020d}.log" in fsyncs
    log.flush(now_ms=0)
    assert log.recovery_point == 33
    assert len(consume(log)) == 11
    log.close(now_ms=1)


def _open_files_under(directory: Path) -> list[str]:
    here = str(directory)
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(here):
            found.append(target)
    return found


def test_a_segment_holds_one_file_descriptor_as_in_kafka(open_log: LogOpener) -> None:
    """Kafka keeps each segment's `.log` open and maps its indexes without a descriptor: a node
    with thousands of partitions must not need three descriptors per segment."""
    log = open_log()
    fill(log, 40)
    assert len(log.segments) > 3
    opened = _open_files_under(open_log.directory)
    assert sorted(opened) == sorted(str(s.log_path) for s in log.segments)
    log.close(now_ms=1)
    # And a reopened log, indexes read back from their files, holds no more.
    again = open_log()
    assert len(_open_files_under(open_log.directory)) == len(again.segments)
    assert offsets_of(again) == list(range(120))
    again.close(now_ms=2)
