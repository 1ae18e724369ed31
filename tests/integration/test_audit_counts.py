"""The retention audit's per-partition counts (`gregor_audit.scan`), computed by real Spark in
local mode over records shaped as Spark's Kafka source gives them, for the cases no broker will
write for a test: timestamps of -1 (message format v0), a record without a key in a compacted
topic, limits that do not apply (None), and a superseding record without a timestamp."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

from gregor_audit.cli import spark_session
from gregor_audit.findings import PartitionStats
from gregor_audit.scan import LIMITS_SCHEMA, aggregate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NOW = 1_800_000_000_000
DAY = 86_400_000
KAFKA_SOURCE = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[1]")
    yield session
    session.stop()


def _at(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def _counts(
    spark: Any, rows: list[tuple[Any, ...]], limits: tuple[Any, ...], *, compacted: bool
) -> PartitionStats:
    records = spark.createDataFrame(rows, KAFKA_SOURCE)
    table = spark.createDataFrame([limits], LIMITS_SCHEMA)
    (row,) = aggregate(records, table, compacted=compacted).collect()
    return PartitionStats(**row.asDict())


def test_unstamped_records_are_counted_but_never_old(spark: Any) -> None:
    rows = [
        (None, b"v" * 10, "t", 0, 0, _at(-1)),  # no timestamp (v0)
        (None, b"v" * 10, "t", 0, 1, _at(NOW - 10 * DAY)),
        (None, None, "t", 0, 2, _at(NOW)),
    ]
    stats = _counts(spark, rows, ("t", NOW - DAY, NOW + DAY, None, None), compacted=False)
    assert (stats.records, stats.bytes) == (3, 20)
    assert (stats.oldest_ms, stats.newest_ms) == (NOW - 10 * DAY, NOW)
    assert (stats.old_records, stats.old_bytes) == (1, 10)
    assert stats.future_records == 0


def test_limits_that_do_not_apply_count_nothing(spark: Any) -> None:
    rows = [
        (b"k", b"v", "t", 0, 0, _at(NOW - 100 * DAY)),
        (b"k", None, "t", 0, 1, _at(NOW - 99 * DAY)),
    ]
    stats = _counts(spark, rows, ("t", None, NOW + DAY, None, None), compacted=True)
    assert (stats.records, stats.old_records, stats.backlog_records, stats.stale_tombstones) == (
        2,
        0,
        0,
        0,
    )
    assert (stats.superseded, stats.tombstones) == (1, 1)


def test_compaction_counts_follow_each_key(spark: Any) -> None:
    old, mid = NOW - 10 * DAY, NOW - 5 * DAY
    rows = [
        (b"a", b"1", "t", 0, 0, _at(old)),
        (b"b", b"1", "t", 0, 1, _at(old)),
        (b"a", b"2", "t", 0, 2, _at(mid)),  # supersedes a@0 with an old value: backlog
        (None, b"x", "t", 0, 3, _at(old)),  # no key: neither superseded nor a tombstone
        (b"b", b"2", "t", 0, 4, _at(-1)),  # supersedes b@1 without a timestamp: not backlog
        (b"a", None, "t", 0, 5, _at(mid)),  # tombstone superseding a@2: backlog; stale
        (b"c", None, "t", 0, 6, _at(NOW)),  # a fresh tombstone
    ]
    stats = _counts(
        spark, rows, ("t", None, NOW + DAY, NOW - 3 * DAY, NOW - 4 * DAY), compacted=True
    )
    assert (stats.records, stats.superseded, stats.tombstones) == (7, 3, 2)
    assert (stats.backlog_records, stats.backlog_bytes) == (2, 4)
    assert (stats.backlog_oldest_ms, stats.backlog_newest_ms) == (old, mid)
    assert (stats.stale_tombstones, stats.stale_tombstone_bytes) == (1, 1)
