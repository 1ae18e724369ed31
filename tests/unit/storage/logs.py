"""Helpers for the storage tests: batches as a producer sends them, logs in a temporary
directory, crashes, and reading a log back the way a consumer does."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from broker.protocol import Codec
from broker.protocol.records import BatchHeader, Record, build_batch, iter_batches, iter_records
from broker.storage import Log, LogConfig

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=128)
"""Segments of about a dozen small batches, with index entries every few batches."""


def batch(
    count: int = 3,
    *,
    timestamp: int = 1_000,
    timestamps: Sequence[int] | None = None,
    offset: int = 0,
    epoch: int = -1,
    codec: Codec = Codec.NONE,
    value: bytes = b"v" * 20,
) -> bytes:
    """One batch of `count` records, as a producer would send it (offsets from `offset`, which a
    leader append replaces); `timestamps` gives each record its own."""
    stamps = list(timestamps) if timestamps is not None else [timestamp] * count
    return build_batch(
        [Record(offset + i, ts, f"k{i}".encode(), value) for i, ts in enumerate(stamps)],
        codec=codec,
        partition_leader_epoch=epoch,
    )


class LogOpener:
    """Opens partition logs for one test (by default `<tmp>/orders-0`, reopened as often as the
    test likes) and, at its end, closes what the test left open, so that a failing assertion
    does not leak files into the next test's warnings."""

    def __init__(self, root: Path) -> None:
        self.directory = root / "orders-0"
        self._opened: list[Log] = []

    def __call__(
        self,
        config: LogConfig = SMALL,
        *,
        directory: Path | None = None,
        now_ms: int = 0,
        clean_shutdown: bool = True,
        recovery_point: int = 0,
        log_start_offset: int = 0,
    ) -> Log:
        log = Log(
            directory or self.directory,
            config,
            now_ms=now_ms,
            clean_shutdown=clean_shutdown,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
        )
        self._opened.append(log)
        return log

    def close_leftovers(self) -> None:
        for log in self._opened:
            for segment in log.segments:
                if not segment.closed:
                    segment.close()


def fill(log: Log, batches: int, *, records: int = 3, epoch: int = 0, now_ms: int = 0) -> None:
    """Append `batches` leader batches of `records` records each."""
    for _ in range(batches):
        log.append_as_leader(batch(records), leader_epoch=epoch, now_ms=now_ms)


def abandon(log: Log) -> None:
    """Let go of a log as a crashed broker does: close its files without flushing the log, moving
    the recovery point or writing anything else. Appends reach the kernel through `pwritev`, so
    the `.log` files hold what a killed process leaves; tests then damage them as a crash or a
    bad disk would, and reopen with `clean_shutdown=False`."""
    for segment in log.segments:
        segment.close()


def consume(log: Log, start: int | None = None, max_bytes: int = 1 << 20) -> list[bytes]:
    """Every batch from `start` (default: the log start) to the log end, fetched as a consumer
    does: read, keep the whole batches, continue after the last one."""
    offset = log.log_start_offset if start is None else start
    batches: list[bytes] = []
    while offset < log.log_end_offset:
        chunk = log.read(offset, max_bytes)
        assert chunk is not None, f"nothing to read at {offset} below LEO {log.log_end_offset}"
        data = chunk.read()
        progress = offset
        for position, header in iter_batches(data, allow_partial_tail=True):
            batches.append(data[position : position + header.size])
            offset = header.next_offset
        assert offset > progress, f"a read at {progress} made no progress"
    return batches


def headers(batches: Sequence[bytes]) -> list[BatchHeader]:
    return [header for data in batches for _, header in iter_batches(data)]


def records_of(batches: Sequence[bytes]) -> list[Record]:
    return [record for data in batches for record in iter_records(data)]


def offsets_of(log: Log) -> list[int]:
    """The offset of every record a consumer gets from the log."""
    return [record.offset for record in records_of(consume(log))]


def segment_names(directory: Path, suffix: str = ".log") -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(suffix))


def file_sizes(directory: Path) -> dict[str, int]:
    return {p.name: os.path.getsize(p) for p in sorted(directory.iterdir())}
