"""Log compaction on real segment files: what survives, what the cleaner leaves alone, when it
runs, tombstones, codecs, and crashes in the middle of a swap."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.protocol import Codec
from broker.protocol.records import (
    BatchHeader,
    Record,
    build_batch,
    iter_batches,
    iter_records,
    validate_batch,
)
from broker.storage import CorruptRecordError, Log, LogConfig, LogSegment
from broker.storage import cleaner as cleaner_module
from broker.storage.cleaner import (
    CLEANER_CHECKPOINT_FILE,
    MAP_BYTES_PER_KEY,
    CleanableRange,
    CleaningAborted,
    CleanResult,
    SourceSegment,
    clean,
    cleanable_range,
    compact,
    complete_interrupted_swaps,
    filthiest_log,
    group_segments,
    needs_cleaning,
    plan_clean,
    read_cleaner_checkpoint,
    swap_in,
    write_cleaner_checkpoint,
)
from broker.storage.producer_state import PRODUCER_ID_EXPIRATION_MS

from .logs import abandon

COMPACT = LogConfig(
    cleanup_policy=frozenset({"compact"}),
    index_interval_bytes=64,
    delete_retention_ms=1_000,
)
T0 = 1_000_000
"""Record timestamps start here; `now_ms` arguments are chosen relative to it."""

KV = tuple[bytes | None, bytes | None]


# -- helpers ---------------------------------------------------------------------------------


class Logs:
    """Opens partition logs under a test's tmp_path and closes whatever is left open at the end
    (retired segments included), so no file outlives its test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._opened: list[Log] = []
        self._retired: list[LogSegment] = []

    def open(
        self,
        config: LogConfig = COMPACT,
        *,
        name: str = "compacted-0",
        now_ms: int = T0,
        clean_shutdown: bool = True,
        producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
    ) -> Log:
        log = Log(
            self.root / name,
            config,
            now_ms=now_ms,
            clean_shutdown=clean_shutdown,
            producer_id_expiration_ms=producer_id_expiration_ms,
        )
        self._opened.append(log)
        return log

    def clean(
        self,
        log: Log,
        first_dirty_offset: int | None,
        now_ms: int,
        *,
        last_stable_offset: int | None = None,
        max_map_entries: int | None = None,
        max_map_bytes: int | None = None,
        producer_id_expiration_ms: int | None = None,
    ) -> CleanResult:
        result = clean(
            log,
            first_dirty_offset,
            now_ms,
            last_stable_offset=last_stable_offset,
            max_map_entries=max_map_entries,
            max_map_bytes=max_map_bytes,
            producer_id_expiration_ms=producer_id_expiration_ms,
        )
        self._retired.extend(result.retired_segments)
        return result

    def close_all(self) -> None:
        segments = [s for log in self._opened for s in log.segments] + self._retired
        for segment in segments:
            if not segment.closed:
                segment.close()


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Logs]:
    opener = Logs(tmp_path)
    yield opener
    opener.close_all()


def append(
    log: Log,
    pairs: Sequence[KV],
    *,
    timestamp: int = T0,
    codec: Codec = Codec.NONE,
    producer_id: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> int:
    """Append one batch of (key, value) records; returns its base offset. Appended as a follower
    (offsets assigned here): what the cleaner meets includes what no client may write itself
    (keyless records from before a topic was compacted, transaction markers)."""
    start = log.log_end_offset
    records = [Record(start + i, timestamp, key, value) for i, (key, value) in enumerate(pairs)]
    data = build_batch(
        records,
        partition_leader_epoch=0,
        codec=codec,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
        is_transactional=transactional,
        is_control=control,
    )
    return log.append_as_follower(data, now_ms=timestamp).first_offset


def consume(log: Log) -> tuple[list[Record], list[BatchHeader]]:
    """Every record and batch header a consumer fetches from the log start to the log end,
    checking each batch's CRC on the way."""
    offset = log.log_start_offset
    records: list[Record] = []
    headers: list[BatchHeader] = []
    while offset < log.log_end_offset:
        chunk = log.read(offset, 1 << 20)
        assert chunk is not None, f"nothing to read at {offset}"
        data = chunk.read()
        for position, _ in iter_batches(data):
            header = validate_batch(data, position)
            headers.append(header)
            records.extend(iter_records(data, position))
            assert header.next_offset > offset
            offset = header.next_offset
    return records, headers


def visible(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in consume(log)[0]]


def segment_bytes(segment: LogSegment) -> bytes:
    return segment.log_path.read_bytes()


def build_three_segments(log: Log) -> None:
    """Two closed segments and an active one:
    [0: k0=a0 k1=b0 k2=c0 | 3: k0=a1 k1=b1]  [5: k0=a2 | 6: k3=d0]  (7: k1=b2, active)."""
    append(log, [(b"k0", b"a0"), (b"k1", b"b0"), (b"k2", b"c0")])
    append(log, [(b"k0", b"a1"), (b"k1", b"b1")])
    log.roll(T0)
    append(log, [(b"k0", b"a2")])
    append(log, [(b"k3", b"d0")])
    log.roll(T0)
    append(log, [(b"k1", b"b2")])


# -- what survives ---------------------------------------------------------------------------


def test_the_latest_value_of_each_key_survives_with_its_offset(logs: Logs) -> None:
    log = logs.open()
    build_three_segments(log)
    active = log.active_segment
    active_bytes = segment_bytes(active)

    result = logs.clean(log, None, T0)

    assert visible(log) == [
        (2, b"k2", b"c0"),
        (4, b"k1", b"b1"),  # b2 is in the active segment, which is never cleaned
        (5, b"k0", b"a2"),
        (6, b"k3", b"d0"),
        (7, b"k1", b"b2"),
    ]
    assert result.first_dirty_offset == 7
    assert result.records_read == 7
    assert result.records_removed == 3
    assert result.bytes_after < result.bytes_before
    # Both closed segments fit in segment.bytes: they were merged into one.
    assert [s.base_offset for s in log.segments] == [0, 7]
    assert log.active_segment is active
    assert segment_bytes(active) == active_bytes
    assert log.log_end_offset == 8
    assert all(s.log_path.name.endswith(".deleted") for s in result.retired_segments)
    assert not list(log.directory.glob("*.cleaned"))
    assert not list(log.directory.glob("*.swap"))


def test_a_consumer_sees_increasing_offsets_with_gaps_and_valid_batches(logs: Logs) -> None:
    log = logs.open()
    for round_ in range(5):
        for key in range(4):
            append(log, [(f"k{key}".encode(), f"v{round_}".encode())])
        log.roll(T0)
    append(log, [(b"tail", b"x")])

    logs.clean(log, None, T0)

    records, headers = consume(log)
    offsets = [r.offset for r in records]
    assert offsets == [16, 17, 18, 19, 20]
    assert [r.value for r in records[:4]] == [b"v4"] * 4
    # Each surviving batch keeps its own offsets; reading from inside a gap finds the next one.
    assert [h.base_offset for h in headers] == offsets
    found = log.read(3, 1 << 20)
    assert found is not None
    assert next(iter_batches(found.read()))[1].base_offset == 16


def test_batches_that_lose_records_keep_their_offsets_producer_and_epoch(logs: Logs) -> None:
    log = logs.open()
    append(
        log,
        [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")],
        producer_id=42,
        base_sequence=10,
    )
    append(log, [(b"b", b"2")])
    log.roll(T0)
    append(log, [(b"z", b"z")])

    logs.clean(log, None, T0)

    _, headers = consume(log)
    first = headers[0]
    assert (first.base_offset, first.last_offset_delta, first.records_count) == (0, 2, 2)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (42, 0, 10)
    assert first.partition_leader_epoch == 0
    assert visible(log)[:3] == [(0, b"a", b"1"), (2, b"c", b"1"), (3, b"b", b"2")]


def test_records_without_a_key_are_dropped(logs: Logs) -> None:
    log = logs.open()
    append(log, [(None, b"orphan"), (b"k", b"v")])
    log.roll(T0)
    append(log, [(None, b"in the active segment")])

    logs.clean(log, None, T0)

    assert visible(log) == [(1, b"k", b"v"), (2, None, b"in the active segment")]


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.name.lower())
def test_compressed_batches_are_cleaned_and_keep_their_codec(logs: Logs, codec: Codec) -> None:
    log = logs.open()
    append(log, [(f"k{i}".encode(), b"old" * 50) for i in range(20)], codec=codec)
    append(log, [(f"k{i}".encode(), b"new" * 50) for i in range(0, 20, 2)], codec=codec)
    log.roll(T0)
    append(log, [(b"active", b"x")], codec=codec)

    logs.clean(log, None, T0)

    records, headers = consume(log)
    assert [h.codec for h in headers] == [codec] * 3
    assert [(r.offset, r.value) for r in records[:10]] == [
        (i, b"old" * 50) for i in range(1, 20, 2)
    ]
    assert [(r.offset, r.value) for r in records[10:20]] == [
        (20 + i // 2, b"new" * 50) for i in range(0, 20, 2)
    ]
    assert headers[0].records_count == 10
    assert headers[0].last_offset_delta == 19


def test_timestamps_and_log_append_time_are_preserved(logs: Logs) -> None:
    log = logs.open()
    records = [Record(0, T0 + 5, b"a", b"1"), Record(1, T0 + 9, b"b", b"1")]
    data = build_batch(records, log_append_time=True, max_timestamp=T0 + 100)
    log.append_as_leader(data, leader_epoch=0, now_ms=T0)
    append(log, [(b"b", b"2")], timestamp=T0 + 50)
    log.roll(T0)
    append(log, [(b"z", b"z")])

    logs.clean(log, None, T0 + 200)

    records_after, headers = consume(log)
    # A LogAppendTime batch gives its records the append time, as Kafka's DefaultRecordBatch.
    assert [(r.offset, r.timestamp) for r in records_after[:2]] == [(0, T0 + 100), (2, T0 + 50)]
    assert headers[0].is_log_append_time
    assert headers[0].max_timestamp == T0 + 100


def test_an_unchanged_segment_is_not_rewritten(logs: Logs) -> None:
    log = logs.open()
    append(log, [(b"a", b"1"), (b"b", b"1")])
    log.roll(T0)
    append(log, [(b"z", b"z")])
    first = log.segments[0]

    result = logs.clean(log, None, T0)

    assert log.segments[0] is first
    assert result.retired_segments == []
    assert result.first_dirty_offset == 2
    assert result.bytes_before == result.bytes_after == first.size


# -- what the cleaner leaves alone -----------------------------------------------------------


def test_control_and_transactional_batches_are_left_untouched(logs: Logs) -> None:
    log = logs.open()
    append(log, [(b"k", b"in a transaction")], producer_id=5, transactional=True)
    marker = (b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")
    append(log, [marker], producer_id=5, transactional=True, control=True)
    append(log, [(b"k", b"later")])
    log.roll(T0)
    append(log, [(b"z", b"z")])
    before = consume(log)[1][:2]

    logs.clean(log, None, T0)

    _, headers = consume(log)
    assert headers[:2] == before
    assert [o for o, _, _ in visible(log)] == [0, 1, 2, 3]


def test_the_emptied_last_batch_of_an_active_producer_keeps_its_header(logs: Logs) -> None:
    log = logs.open()
    append(log, [(b"k0", b"old")], producer_id=7, base_sequence=0)
    append(log, [(b"k1", b"old"), (b"k2", b"old")], producer_id=7, base_sequence=1)
    append(log, [(b"k0", b"new"), (b"k1", b"new"), (b"k2", b"new")])
    log.roll(T0)
    append(log, [(b"z", b"z")])

    logs.clean(log, None, T0 + 1_000)

    records, headers = consume(log)
    assert [r.offset for r in records] == [3, 4, 5, 6]
    empty = headers[0]
    assert (empty.base_offset, empty.last_offset, empty.records_count) == (1, 2, 0)
    assert (empty.producer_id, empty.base_sequence, empty.codec) == (7, 1, Codec.NONE)


@pytest.mark.parametrize("restart", ["from-snapshot", "replaying-the-log"])
def test_an_active_producer_is_still_known_to_the_cleaner_after_a_restart(
    logs: Logs, restart: str
) -> None:
    """The cleaner takes active producers from the producer state, which a restart rebuilds
    from its snapshot, or from the log when a crash left none."""
    log = logs.open()
    append(log, [(b"k0", b"old")], producer_id=7, base_sequence=0)
    append(log, [(b"k0", b"new")])
    log.roll(T0)
    append(log, [(b"z", b"z")])
    if restart == "from-snapshot":
        log.close(T0)
    else:
        abandon(log)
        for snapshot in log.directory.glob("*.snapshot"):
            snapshot.unlink()
    log = logs.open(clean_shutdown=restart == "from-snapshot")

    logs.clean(log, None, T0 + 1_000)

    empty = consume(log)[1][0]
    assert (empty.base_offset, empty.records_count, empty.producer_id) == (0, 0, 7)


@pytest.mark.parametrize("expiration", ["given to the cleaner", "the log's own"])
def test_an_expired_producer_loses_its_emptied_batches(logs: Logs, expiration: str) -> None:
    """By default the cleaner counts a producer as expired by the log's
    `producer.id.expiration.ms`, as the log itself does."""
    own = expiration == "the log's own"
    log = logs.open(producer_id_expiration_ms=10 if own else PRODUCER_ID_EXPIRATION_MS)
    append(log, [(b"k0", b"old")], producer_id=7, base_sequence=0)
    append(log, [(b"k0", b"new")])
    log.roll(T0)
    append(log, [(b"z", b"z")])

    logs.clean(log, None, T0 + 10, producer_id_expiration_ms=None if own else 10)

    assert [h.base_offset for h in consume(log)[1]] == [1, 2]


def test_the_active_segment_and_recent_records_are_protected_by_min_compaction_lag(
    logs: Logs,
) -> None:
    log = logs.open(dataclasses.replace(COMPACT, min_compaction_lag_ms=2_000))
    append(log, [(b"k", b"old"), (b"j", b"old")], timestamp=T0)
    log.roll(T0)
    append(log, [(b"k", b"recent")], timestamp=T0 + 5_000)
    log.roll(T0 + 5_000)
    append(log, [(b"j", b"active")], timestamp=T0 + 5_000)

    found = cleanable_range(log, None, T0 + 6_000)
    assert found.first_uncleanable_offset == 2
    result = logs.clean(log, None, T0 + 6_000)
    # The recent segment was not in the offset map: the old value of k is still there.
    assert [o for o, _, _ in visible(log)] == [0, 1, 2, 3]
    assert result.first_dirty_offset == 2

    # Once the lag has passed, the second segment is cleanable too.
    assert cleanable_range(log, 2, T0 + 7_000).first_uncleanable_offset == 3
    logs.clean(log, 2, T0 + 7_000)
    assert [o for o, _, _ in visible(log)] == [1, 2, 3]


def test_nothing_from_the_segment_holding_the_last_stable_offset_is_cleaned(logs: Logs) -> None:
    log = logs.open()
    append(log, [(b"k", b"1")])
    log.roll(T0)
    append(log, [(b"k", b"2")])
    append(log, [(b"k", b"3")])
    log.roll(T0)
    append(log, [(b"z", b"z")])

    # The high watermark is at 2, inside the second segment: that segment is not mapped.
    assert cleanable_range(log, None, T0, last_stable_offset=2).first_uncleanable_offset == 1
    assert not needs_cleaning(log, None, T0, last_stable_offset=0)
    assert filthiest_log({"t": log}, {}, T0, last_stable_offsets={"t": 0}) is None
    result = logs.clean(log, None, T0, last_stable_offset=2)
    assert result.first_dirty_offset == 1
    assert [o for o, _, _ in visible(log)] == [0, 1, 2, 3]

    logs.clean(log, result.first_dirty_offset, T0, last_stable_offset=4)
    assert [o for o, _, _ in visible(log)] == [2, 3]


# -- when to clean ---------------------------------------------------------------------------


def test_the_dirty_ratio_decides_when_to_clean(logs: Logs) -> None:
    log = logs.open(dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.5))
    for i in range(10):
        append(log, [(f"k{i}".encode(), b"v" * 100)])
    log.roll(T0)
    append(log, [(b"active", b"x")])
    checkpoint = logs.clean(log, None, T0).first_dirty_offset
    assert checkpoint == 10

    # A little dirty data: below the ratio.
    append(log, [(b"k0", b"v" * 100)])
    log.roll(T0)
    found = cleanable_range(log, checkpoint, T0)
    clean_bytes = log.segments[0].size
    dirty_bytes = log.segments[1].size
    assert (found.clean_bytes, found.cleanable_bytes) == (clean_bytes, dirty_bytes)
    assert found.dirty_ratio == pytest.approx(dirty_bytes / (clean_bytes + dirty_bytes))
    assert found.dirty_ratio < 0.5
    assert not needs_cleaning(log, checkpoint, T0)

    # More dirty data than clean: above it.
    for i in range(12):
        append(log, [(f"k{i}".encode(), b"w" * 100)])
    log.roll(T0)
    assert cleanable_range(log, checkpoint, T0).dirty_ratio > 0.5
    assert needs_cleaning(log, checkpoint, T0)

    # A topic that is not compacted is never cleaned.
    plain = logs.open(LogConfig(), name="plain-0")
    append(plain, [(b"k", b"v")])
    append(plain, [(b"k", b"v")])
    plain.roll(T0)
    assert cleanable_range(plain, None, T0).dirty_ratio == 1.0
    assert not needs_cleaning(plain, None, T0)


def test_max_compaction_lag_forces_cleaning_below_the_ratio(logs: Logs) -> None:
    config = dataclasses.replace(
        COMPACT, min_cleanable_dirty_ratio=0.9, max_compaction_lag_ms=10_000
    )
    log = logs.open(config)
    for i in range(10):
        append(log, [(f"k{i}".encode(), b"v" * 100)], timestamp=T0)
    log.roll(T0)
    checkpoint = logs.clean(log, None, T0).first_dirty_offset
    append(log, [(b"k0", b"v" * 100)], timestamp=T0 + 1_000)
    log.roll(T0 + 1_000)

    assert cleanable_range(log, checkpoint, T0 + 11_000).max_compaction_delay_ms == 0
    assert not needs_cleaning(log, checkpoint, T0 + 11_000)
    found = cleanable_range(log, checkpoint, T0 + 11_001)
    assert found.dirty_ratio < 0.9
    assert found.max_compaction_delay_ms == 1
    assert needs_cleaning(log, checkpoint, T0 + 11_001)

    logs.clean(log, checkpoint, T0 + 11_001)
    assert [o for o, k, _ in visible(log) if k == b"k0"] == [10]


def test_max_compaction_lag_rolls_the_active_segment(logs: Logs) -> None:
    log = logs.open(dataclasses.replace(COMPACT, max_compaction_lag_ms=10_000))
    append(log, [(b"k", b"1")], timestamp=T0)
    append(log, [(b"k", b"2")], timestamp=T0 + 10_000)
    assert len(log.segments) == 1
    append(log, [(b"k", b"3")], timestamp=T0 + 10_001)
    assert [s.base_offset for s in log.segments] == [0, 2]
    assert LogConfig(segment_ms=5, max_compaction_lag_ms=3).max_segment_ms == 5


def test_the_filthiest_log_is_cleaned_first(logs: Logs) -> None:
    quiet = logs.open(name="quiet-0")
    busy = logs.open(name="busy-0")
    plain = logs.open(LogConfig(), name="plain-0")
    for log, dirty in ((quiet, 1), (busy, 3), (plain, 9)):
        append(log, [(b"k", b"v" * 100)])
        log.roll(T0)
        for _ in range(dirty):
            append(log, [(b"k", b"v" * 100)])
        log.roll(T0)
        append(log, [(b"k", b"v")])
    assert cleanable_range(quiet, 1, T0).dirty_ratio == pytest.approx(0.5)  # not above 0.5
    checkpoints = {"quiet": 1, "busy": 1, "plain": 1}

    found = filthiest_log({"quiet": quiet, "busy": busy, "plain": plain}, checkpoints, T0)

    assert found is not None
    assert found[0] == "busy"
    assert found[1].dirty_ratio == pytest.approx(0.75)
    assert filthiest_log({"plain": plain}, {}, T0) is None


def test_a_checkpoint_outside_the_log_is_reset_to_the_log_start(logs: Logs) -> None:
    log = logs.open()
    build_three_segments(log)
    assert cleanable_range(log, 99, T0).checkpoint_reset
    assert cleanable_range(log, 99, T0).first_dirty_offset == 0
    log.delete_records(5)
    found = cleanable_range(log, 3, T0)
    assert (found.first_dirty_offset, found.checkpoint_reset) == (5, True)
    assert not cleanable_range(log, 6, T0).checkpoint_reset


@dataclass(frozen=True)
class _Segment:
    base_offset: int
    size: int
    max_timestamp: int = 0
    first_batch_timestamp: int | None = 0


@dataclass(frozen=True)
class _Log:
    segments: Sequence[_Segment]
    log_start_offset: int = 0
    log_end_offset: int = 400
    config: LogConfig = COMPACT


def test_the_cleanable_range_is_a_pure_decision_over_segment_sizes() -> None:
    """Sizes and timestamps alone decide: these stand-ins are plain values, not files."""
    log = _Log(
        [
            _Segment(0, 100),
            _Segment(100, 300),
            _Segment(200, 50, max_timestamp=9_000),
            _Segment(300, 999),
        ]
    )

    assert cleanable_range(log, 100, 10_000) == CleanableRange(
        first_dirty_offset=100,
        first_uncleanable_offset=300,
        clean_bytes=100,
        cleanable_bytes=350,
        max_compaction_delay_ms=0,
        checkpoint_reset=False,
    )
    lagging = dataclasses.replace(
        log, config=dataclasses.replace(COMPACT, min_compaction_lag_ms=2_000)
    )
    found = cleanable_range(lagging, 100, 10_000)
    assert (found.first_uncleanable_offset, found.cleanable_bytes) == (200, 300)
    # A checkpoint inside a segment counts that segment as both clean and dirty, as in Kafka.
    found = cleanable_range(log, 150, 10_000)
    assert (found.clean_bytes, found.cleanable_bytes) == (400, 350)
    empty = _Log([_Segment(0, 0)], log_end_offset=0)
    assert cleanable_range(empty, None, 0).total_bytes == 0
    assert not cleanable_range(empty, None, 0).should_clean(COMPACT)


# -- tombstones and retention ----------------------------------------------------------------


def test_tombstones_stay_for_delete_retention_ms_then_go(logs: Logs) -> None:
    log = logs.open()  # delete.retention.ms = 1 s
    append(log, [(b"gone", b"value"), (b"kept", b"value")], timestamp=T0)
    append(log, [(b"gone", None)], timestamp=T0 + 1)
    log.roll(T0)
    append(log, [(b"active", b"x")])

    checkpoint = logs.clean(log, None, T0 + 10).first_dirty_offset
    assert visible(log)[:2] == [(1, b"kept", b"value"), (2, b"gone", None)]
    records, headers = consume(log)
    tombstone_batch = headers[1]
    # The batch holding the tombstone now carries its delete horizon (KIP-534).
    assert tombstone_batch.has_delete_horizon
    assert tombstone_batch.base_timestamp == T0 + 10 + 1_000
    assert records[1].timestamp == T0 + 1

    # A later round before the horizon keeps it; consumers catching up still see the delete.
    append(log, [(b"other", b"y")])
    log.roll(T0)
    checkpoint = logs.clean(log, checkpoint, T0 + 1_009).first_dirty_offset
    assert (2, b"gone", None) in visible(log)

    # From the horizon on, the next round removes it.
    append(log, [(b"other", b"z")])
    log.roll(T0)
    logs.clean(log, checkpoint, T0 + 1_010)
    assert [k for _, k, _ in visible(log)] == [b"kept", b"active", b"other"]


def test_a_tombstone_in_the_active_segment_is_kept(logs: Logs) -> None:
    log = logs.open()
    append(log, [(b"k", b"v")])
    log.roll(T0)
    append(log, [(b"k", None)])

    logs.clean(log, None, T0 + 10_000_000)

    assert visible(log) == [(0, b"k", b"v"), (1, b"k", None)]


def test_compact_delete_also_applies_time_retention(logs: Logs) -> None:
    config = dataclasses.replace(
        COMPACT,
        cleanup_policy=frozenset({"compact", "delete"}),
        retention_ms=5_000,
        segment_bytes=150,  # one two-record batch per segment: no merging
    )
    log = logs.open(config)
    append(log, [(b"a", b"1"), (b"b", b"1")], timestamp=T0)
    log.roll(T0)
    append(log, [(b"a", b"2"), (b"c", b"1")], timestamp=T0 + 10_000)
    log.roll(T0 + 10_000)
    append(log, [(b"d", b"1")], timestamp=T0 + 10_000)

    checkpoint = logs.clean(log, None, T0 + 10_000).first_dirty_offset
    assert [k for _, k, _ in visible(log)] == [b"b", b"a", b"c", b"d"]

    assert log.delete_old_segments(T0 + 4_000) == []
    doomed = log.delete_old_segments(T0 + 14_000)
    for segment in doomed:
        segment.close()
    # The cleaned first segment held only b, older than retention.ms; the later ones stay.
    assert [s.base_offset for s in doomed] == [0]
    assert [k for _, k, _ in visible(log)] == [b"a", b"c", b"d"]
    assert log.log_start_offset == 2
    assert cleanable_range(log, checkpoint, T0 + 14_000).first_dirty_offset == 4


# -- limits and grouping ---------------------------------------------------------------------


def test_a_full_offset_map_cleans_part_of_the_dirty_range(logs: Logs) -> None:
    log = logs.open()
    for key in (b"a", b"b", b"a", b"b", b"c", b"d", b"c", b"d"):
        append(log, [(key, b"v")])
    log.roll(T0)
    append(log, [(b"z", b"z")])

    first = logs.clean(log, None, T0, max_map_entries=2)
    # The map filled up with a and b at offset 4 (c): offsets from 4 on are still dirty.
    assert first.first_dirty_offset == 4
    assert [o for o, _, _ in visible(log)] == [2, 3, 4, 5, 6, 7, 8]

    second = logs.clean(log, first.first_dirty_offset, T0, max_map_entries=2)
    assert second.first_dirty_offset == 8
    assert [o for o, _, _ in visible(log)] == [2, 3, 6, 7, 8]
    with pytest.raises(ValueError, match="at least one key"):
        clean(log, None, T0, max_map_entries=0)


def test_small_segments_are_merged_up_to_segment_bytes(logs: Logs) -> None:
    log = logs.open()
    for i in range(6):
        # Two batches: the second gets an index entry (index.interval.bytes is 64).
        append(log, [(f"k{i}a".encode(), b"v" * 100)])
        append(log, [(f"k{i}b".encode(), b"v" * 100)])
        log.roll(T0)
    append(log, [(b"z", b"z")])
    size = log.segments[0].size
    closed = [SourceSegment.of(segment) for segment in log.segments[:-1]]
    limit = log.active_segment.base_offset

    small = dataclasses.replace(COMPACT, segment_bytes=2 * size)
    assert [len(g) for g in group_segments(closed, limit, small)] == [2, 2, 2]
    assert [len(g) for g in group_segments(closed, limit, COMPACT)] == [6]
    few_index_entries = dataclasses.replace(COMPACT, segment_index_bytes=8)
    assert [len(g) for g in group_segments(closed, limit, few_index_entries)] == [1] * 6

    before = visible(log)
    log.config = small
    result = logs.clean(log, None, T0)
    assert [s.base_offset for s in log.segments] == [0, 4, 8, 12]
    assert len(result.retired_segments) == 6
    assert visible(log) == before


def test_far_apart_offsets_are_not_merged_into_one_segment(logs: Logs) -> None:
    log = logs.open()
    append(log, [(b"a", b"1")])
    log.roll(T0, base_offset=2**31 + 10)
    append(log, [(b"b", b"1")])
    log.roll(T0)
    append(log, [(b"z", b"z")])

    closed = [SourceSegment.of(segment) for segment in log.segments[:-1]]
    groups = group_segments(closed, log.active_segment.base_offset, COMPACT)

    assert [[s.base_offset for s in g] for g in groups] == [[0], [2**31 + 10]]


# -- durability and crashes ------------------------------------------------------------------


def test_a_cleaned_log_reopens_with_the_same_records(logs: Logs) -> None:
    log = logs.open()
    build_three_segments(log)
    logs.clean(log, None, T0)
    expected = visible(log)
    log.close(T0)

    for clean_shutdown in (True, False):
        again = logs.open(clean_shutdown=clean_shutdown)  # unclean: every segment is scanned
        assert visible(again) == expected
        assert again.offset_for_timestamp(T0) == (2, T0, 0)
        again.close(T0)


def test_a_corrupt_batch_stops_the_round_and_leaves_no_cleaned_files(logs: Logs) -> None:
    log = logs.open()
    append(log, [(b"a", b"1"), (b"b", b"1")])
    log.roll(T0)
    append(log, [(b"a", b"2")])
    log.roll(T0)
    append(log, [(b"z", b"z")])
    with open(log.segments[0].log_path, "r+b") as damaged:
        damaged.seek(-1, 2)
        damaged.write(b"X")
    before = log.segments[1].log_path.read_bytes()

    # The dirty segment maps fine; the damage is found while rewriting the clean one.
    with pytest.raises(CorruptRecordError, match="cannot be compacted"):
        logs.clean(log, 2, T0)
    with pytest.raises(CorruptRecordError, match="cannot be compacted"):
        logs.clean(log, None, T0)

    assert not list(log.directory.glob("*.cleaned"))
    assert [s.base_offset for s in log.segments] == [0, 2, 3]
    assert log.segments[1].log_path.read_bytes() == before


def test_the_cleaner_checkpoint_file_round_trips(tmp_path: Path) -> None:
    assert read_cleaner_checkpoint(tmp_path) == {}
    write_cleaner_checkpoint(tmp_path, {("orders", 0): 42, ("__consumer_offsets", 7): 9})
    assert (tmp_path / CLEANER_CHECKPOINT_FILE).read_text().splitlines()[:2] == ["0", "2"]
    assert read_cleaner_checkpoint(tmp_path) == {("orders", 0): 42, ("__consumer_offsets", 7): 9}


def _prepare_crash(logs: Logs) -> tuple[Path, list[tuple[int, bytes | None, bytes | None]]]:
    """A closed, uncleaned log in `compacted-0` (three closed segments) and, from a copy cleaned
    to completion, what a consumer must see once cleaning is done; the copy's cleaned segment is
    left in `reference/`."""
    log = logs.open()
    for round_ in range(3):
        for key in range(3):
            append(log, [(f"k{key}".encode(), f"v{round_}".encode())])
        append(log, [(f"unique{round_}".encode(), b"u")])
        log.roll(T0)
    append(log, [(b"active", b"x")])
    log.close(T0)

    shutil.copytree(log.directory, logs.root / "copy-0")
    copy = logs.open(name="copy-0")
    result = logs.clean(copy, None, T0)
    assert len(result.retired_segments) == 3
    expected = visible(copy)
    copy.close(T0)
    reference = logs.root / "reference"
    reference.mkdir()
    for kind in (".log", ".index", ".timeindex"):
        shutil.copy(copy.directory / f"{0:020d}{kind}", reference / f"{0:020d}{kind}")
    return reference, expected


def _place(reference: Path, directory: Path, kinds: dict[str, str]) -> None:
    """Copy the cleaned segment's files into `directory` with the given suffixes."""
    for kind, suffix in kinds.items():
        shutil.copy(reference / f"{0:020d}{kind}", directory / f"{0:020d}{kind}{suffix}")


def _mark_deleted(directory: Path, base: int) -> None:
    for kind in (".log", ".index", ".timeindex"):
        path = directory / f"{base:020d}{kind}"
        path.rename(path.with_name(path.name + ".deleted"))


ALL_SWAPPED = {".log": ".swap", ".index": ".swap", ".timeindex": ".swap"}


@pytest.mark.parametrize(
    ("scenario", "kinds", "deleted"),
    [
        ("swap written, old segments untouched", ALL_SWAPPED, []),
        ("swap written, first old segment renamed .deleted", ALL_SWAPPED, [0]),
        ("all old segments renamed .deleted", ALL_SWAPPED, [0, 4, 8]),
        (
            "log renamed .swap, indexes still .cleaned",
            {".log": ".swap", ".index": ".cleaned", ".timeindex": ".cleaned"},
            [],
        ),
        (
            "log at its final name, indexes still .swap",
            {".log": "", ".index": ".swap", ".timeindex": ".swap"},
            None,
        ),
    ],
)
@pytest.mark.parametrize("clean_shutdown", [True, False], ids=["clean", "unclean"])
def test_a_crash_during_the_swap_recovers_on_reopen(
    logs: Logs,
    scenario: str,
    kinds: dict[str, str],
    deleted: list[int] | None,
    clean_shutdown: bool,
) -> None:
    reference, expected = _prepare_crash(logs)
    directory = logs.root / "compacted-0"
    # None: the old segments went to .deleted before the cleaned log took its final name.
    for base in (0, 4, 8) if deleted is None else deleted:
        _mark_deleted(directory, base)
    _place(reference, directory, kinds)

    log = logs.open(clean_shutdown=clean_shutdown)

    assert visible(log) == expected, scenario
    assert [s.base_offset for s in log.segments] == [0, 12]
    leftovers = [
        p.name for p in directory.iterdir() if p.suffix in (".swap", ".cleaned", ".deleted")
    ]
    assert leftovers == []
    # The recovered log keeps working: another round has nothing left to remove.
    assert logs.clean(log, None, T0).retired_segments == []
    append(log, [(b"k0", b"after")])


def test_leftover_cleaned_files_leave_the_old_segments_in_place(logs: Logs) -> None:
    """A crash while the cleaned segment was still being written: the old segments stay."""
    reference, _ = _prepare_crash(logs)
    directory = logs.root / "compacted-0"
    before = sorted(p.name for p in directory.iterdir())
    _place(
        reference, directory, {".log": ".cleaned", ".index": ".cleaned", ".timeindex": ".cleaned"}
    )

    log = logs.open(clean_shutdown=False)

    assert sorted(p.name for p in directory.iterdir()) == before
    assert [s.base_offset for s in log.segments] == [0, 4, 8, 12]
    assert len(visible(log)) == 13


def test_complete_interrupted_swaps_discards_an_index_swap_without_its_log(tmp_path: Path) -> None:
    (tmp_path / f"{0:020d}.log").write_bytes(b"")
    (tmp_path / f"{0:020d}.index").write_bytes(b"")
    (tmp_path / f"{0:020d}.index.swap").write_bytes(b"x" * 8)

    assert complete_interrupted_swaps(tmp_path) == []

    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{0:020d}.index", f"{0:020d}.log"]


# -- rounds in steps: what the node does with a worker process --------------------------------


def test_the_offset_map_is_bounded_in_bytes(logs: Logs) -> None:
    """`log.cleaner.dedupe.buffer.size` bounds the map by what its keys cost; a full map ends
    the round early and the next round carries on from there."""
    log = logs.open()
    keys = [b"%d" % i * 50 for i in range(6)]  # 50-byte keys
    for key in keys:
        append(log, [(key, b"old")])
    for key in keys:
        append(log, [(key, b"new")])
    log.roll(T0)
    append(log, [(b"z", b"z")])
    two_keys = 2 * (50 + MAP_BYTES_PER_KEY)

    first = logs.clean(log, None, T0, max_map_bytes=two_keys)

    assert first.first_dirty_offset == 2  # the map held offsets 0 and 1 only
    rounds = 1
    checkpoint = first.first_dirty_offset
    while checkpoint < log.active_segment.base_offset:
        checkpoint = logs.clean(log, checkpoint, T0, max_map_bytes=two_keys).first_dirty_offset
        rounds += 1
    assert rounds == 6
    assert [value for _, _, value in visible(log)] == [b"new"] * 6 + [b"z"]


def test_a_round_planned_then_compacted_elsewhere_is_swapped_in_group_by_group(
    logs: Logs,
) -> None:
    """The plan pickles (it crosses to a worker process) and names files, not objects; the swap
    yields the directory once per group plus once at the end, and only one group is ever
    between `.swap` and its final name."""
    log = logs.open()
    for round_ in range(4):
        for key in range(3):
            append(log, [(f"k{key}".encode(), f"v{round_}".encode() * 20)])
        log.roll(T0)
    append(log, [(b"active", b"x")])
    log.config = dataclasses.replace(COMPACT, segment_bytes=log.segments[0].size)  # no merging
    job = pickle.loads(pickle.dumps(plan_clean(log, None, T0)))

    compaction = compact(job)

    # The last segment holds the latest values: it stays as it is.
    assert [g.cleaned_size is not None for g in compaction.groups] == [True, True, True, False]
    assert sorted(p.name for p in log.directory.glob("*.cleaned")) == sorted(
        f"{g.base_offsets[0]:020d}{kind}.cleaned"
        for g in compaction.groups[:3]
        for kind in (".log", ".index", ".timeindex")
    )
    retired: list[LogSegment] = []
    seen_swaps = []
    for directory in swap_in(log, compaction, T0, retired):
        assert directory == log.directory
        seen_swaps.append(len(list(directory.glob("*.log.swap"))))
    logs._retired.extend(retired)
    assert seen_swaps == [1, 1, 1, 0]
    assert len(retired) == 3
    assert [value for _, key, value in visible(log) if key != b"active"] == [b"v3" * 20] * 3


def test_a_round_whose_segments_went_away_is_not_swapped_in(logs: Logs) -> None:
    log = logs.open()
    build_three_segments(log)
    compaction = compact(plan_clean(log, None, T0))
    before = visible(log)
    # Meanwhile the log was truncated below the cleaned segments (as a follower may be).
    log.truncate_to(3)

    with pytest.raises(CleaningAborted):
        list(swap_in(log, compaction, T0, []))

    assert not list(log.directory.glob("*.cleaned"))
    assert not list(log.directory.glob("*.swap"))
    assert visible(log) == before[:3]


def test_a_topic_deleted_during_a_round_keeps_the_round_out_of_its_successor(
    logs: Logs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The topic is deleted (its directory renamed) and created again while a round reads it:
    the round's files go with the old directory, never into the new log of the same name."""
    log = logs.open()
    build_three_segments(log)
    job = plan_clean(log, None, T0)
    log.close(T0)
    moved = log.directory.with_name("compacted-0.1234-delete")
    building = cleaner_module._build_offset_map

    def deleted_meanwhile(*args: object) -> object:
        log.directory.rename(moved)
        log.directory.mkdir()
        return building(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cleaner_module, "_build_offset_map", deleted_meanwhile)
    compaction = compact(job)

    assert compaction.groups
    assert list(moved.glob("*.cleaned"))
    assert list(log.directory.iterdir()) == []


def test_a_round_planned_for_a_deleted_topic_does_not_read_its_successor(logs: Logs) -> None:
    log = logs.open()
    build_three_segments(log)
    job = plan_clean(log, None, T0)
    log.close(T0)
    log.directory.rename(log.directory.with_name("compacted-0.1234-delete"))
    again = logs.open()  # the same name, a new log
    build_three_segments(again)

    with pytest.raises(CleaningAborted):
        compact(job)
    assert not list(again.directory.glob("*.cleaned"))
