"""The log is the source of truth: an `.index` or `.timeindex` that is missing or cannot be
trusted is rebuilt from it, after a crash and after a clean shutdown alike, entry for entry as
the appends had built it."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.storage import Log, LogConfig, LogSegment

from .logs import LogOpener, abandon, batch, consume, headers, records_of

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=100)
OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")


def _timestamp(i: int) -> int:
    """Mostly growing, with every fourth batch late: the time index skips those."""
    return 500 if i % 4 == 3 else 1_000 + 10 * i


def _build(open_log: LogOpener) -> tuple[dict[str, bytes], list[list[tuple[int, int]]]]:
    """A closed log of three segments; its index files and each segment's index entries."""
    log = open_log(CONFIG)
    for i in range(36):
        log.append_as_leader(batch(3, timestamp=_timestamp(i)), leader_epoch=0, now_ms=0)
    assert len(log.segments) == 3
    for segment in log.segments:
        assert len(segment.offset_index) >= 2
        assert len(segment.time_index) >= 2
    entries = [_entries(s) for s in log.segments]
    log.close(now_ms=1)
    return _index_files(log.directory), entries


def _entries(segment: LogSegment) -> list[tuple[int, int]]:
    return segment.offset_index.entries() + segment.time_index.entries()


def _index_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*index"))}


Damage = Callable[[Path, LogSegment], None]


def _delete(path: Path, segment: LogSegment) -> None:
    path.unlink()


def _partial_entry(path: Path, segment: LogSegment) -> None:
    path.write_bytes(path.read_bytes()[:-3])


def _backwards(path: Path, segment: LogSegment) -> None:
    data = path.read_bytes()
    entry = OFFSET_ENTRY.size if path.suffix == ".index" else TIME_ENTRY.size
    path.write_bytes(data + data[:entry])


def _past_the_end(path: Path, segment: LogSegment) -> None:
    data = path.read_bytes()
    relative = segment.next_offset - segment.base_offset + 10
    if path.suffix == ".index":
        extra = OFFSET_ENTRY.pack(relative, segment.size + 1_000)
    else:
        extra = TIME_ENTRY.pack(10**12, relative)
    path.write_bytes(data + extra)


@pytest.mark.parametrize(
    "damage", [_delete, _partial_entry, _backwards, _past_the_end], ids=lambda f: f.__name__[1:]
)
@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("which", [0, -1], ids=["closed-segment", "active-segment"])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "crash"])
def test_a_missing_or_corrupt_index_is_rebuilt_as_it_was(
    open_log: LogOpener, damage: Damage, suffix: str, which: int, clean: bool
) -> None:
    files, entries = _build(open_log)
    log = open_log(CONFIG)
    stored = consume(log)
    end = log.log_end_offset
    segment = log.segments[which]
    abandon(log)
    damage(open_log.directory / f"{segment.base_offset:020d}{suffix}", segment)

    # After a crash, the recovery point says the closed segments were flushed: only the
    # active one is scanned, so a damaged closed index must be caught by its sanity check.
    log = open_log(CONFIG, clean_shutdown=clean, recovery_point=end)
    assert [_entries(s) for s in log.segments] == entries
    assert log.log_end_offset == end
    assert consume(log) == stored
    _assert_lookups_work(log)
    log.close(now_ms=1)
    assert _index_files(open_log.directory) == files


def _assert_lookups_work(log: Log) -> None:
    records = records_of(consume(log))
    for offset in range(0, log.log_end_offset, 4):
        chunk = log.read(offset, 1)
        assert chunk is not None
        [first] = headers([chunk.read()])
        assert first.base_offset <= offset <= first.last_offset
    for target in (400, 500, 501, 1_100, 1_200, 1_349, 1_350):
        expected = next(((r.offset, r.timestamp) for r in records if r.timestamp >= target), None)
        found = log.offset_for_timestamp(target)
        assert (found and found[:2]) == expected, f"timestamp {target}"


def test_indexes_lost_with_a_crash_are_rebuilt_from_the_log(open_log: LogOpener) -> None:
    files, entries = _build(open_log)
    for path in open_log.directory.glob("*index"):
        path.unlink()
    log = open_log(CONFIG, clean_shutdown=False)
    assert [_entries(s) for s in log.segments] == entries
    log.close(now_ms=1)
    assert _index_files(open_log.directory) == files


def test_appends_after_a_clean_reopen_index_as_one_run_would(open_log: LogOpener) -> None:
    """Reopening trusts the index and scans only its tail; appends then go on indexing at the
    same spacing as if the log had never been closed."""
    _build(open_log)
    reference = open_log(CONFIG, directory=open_log.directory.parent / "reference-0")
    log = open_log(CONFIG)
    for i in range(36, 40):
        log.append_as_leader(batch(3, timestamp=_timestamp(i)), leader_epoch=0, now_ms=0)
    for i in range(40):
        reference.append_as_leader(batch(3, timestamp=_timestamp(i)), leader_epoch=0, now_ms=0)
    assert [_entries(s) for s in log.segments] == [_entries(s) for s in reference.segments]
    assert log.active_segment.max_timestamp == reference.active_segment.max_timestamp
    log.close(now_ms=1)
    reference.close(now_ms=1)
