"""Producer state across restarts: `<offset>.snapshot` files in Kafka's format written at each
roll and at clean shutdown, the newest one at or below the log end read on start and the batches
after it replayed, after a crash too; corrupt or stale snapshots dropped; retention and expiry.

The snapshot format is checked by a reader and a writer written here from the format's
description (including their own CRC-32C), not by Gregor's code."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

import pytest

from broker.storage import InvalidProducerEpoch, LogConfig, LogManager, OutOfOrderSequence

from .logs import LogOpener, abandon, offsets_of
from .test_producer_state import PID, ROOMY, lead, produced

SNAPSHOT_HEADER = struct.Struct(">hIi")
SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")


class Entry(NamedTuple):
    producer_id: int
    epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def read_kafka_snapshot(path: Path) -> list[Entry]:
    """Kafka's producer snapshot: int16 version 1, uint32 CRC-32C of the rest, int32 count,
    then per entry producer id int64, epoch int16, last sequence int32, last offset int64,
    offset delta int32, timestamp int64, coordinator epoch int32, txn first offset int64."""
    data = path.read_bytes()
    version, crc, count = SNAPSHOT_HEADER.unpack_from(data)
    assert version == 1
    assert crc == crc32c(data[6:])
    assert len(data) == 10 + 46 * count
    return [Entry(*SNAPSHOT_ENTRY.unpack_from(data, 10 + 46 * i)) for i in range(count)]


def write_kafka_snapshot(path: Path, entries: list[Entry]) -> None:
    body = struct.pack(">i", len(entries)) + b"".join(SNAPSHOT_ENTRY.pack(*e) for e in entries)
    path.write_bytes(struct.pack(">hI", 1, crc32c(body)) + body)


def snapshot_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.snapshot"))


def test_the_independent_crc_is_crc32c() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_a_roll_snapshots_the_state_before_the_new_segment(open_log: LogOpener) -> None:
    log = open_log()  # small segments
    for i in range(20):
        lead(log, produced(3 * i, timestamp=1_000 + i))
    bases = [segment.base_offset for segment in log.segments]
    assert len(bases) >= 3
    assert snapshot_names(log.directory) == [f"{base:020d}.snapshot" for base in bases[1:]]
    for base in bases[1:]:
        last = base // 3 - 1  # the batch that ends just before the segment
        assert read_kafka_snapshot(log.directory / f"{base:020d}.snapshot") == [
            Entry(PID, 0, 3 * last + 2, base - 1, 2, 1_000 + last)
        ]


def test_a_clean_shutdown_snapshots_the_log_end_and_a_restart_reads_it(
    open_log: LogOpener,
) -> None:
    log = open_log(ROOMY)
    lead(log, produced(0, timestamp=1_000))
    lead(log, produced(0, epoch=1, producer_id=9, timestamp=2_000))
    last = produced(3, timestamp=3_000)
    lead(log, last)
    log.close(now_ms=10)
    snapshot = log.directory / f"{9:020d}.snapshot"
    assert snapshot_names(log.directory) == [snapshot.name]
    assert read_kafka_snapshot(snapshot) == [
        Entry(9, 1, 2, 5, 2, 2_000),
        Entry(PID, 0, 5, 8, 2, 3_000),
    ]
    # What the restart knows comes from the file: add producers the log has never seen, one
    # with its last batch, one known only by its epoch (no batch: offset and sequence -1).
    write_kafka_snapshot(
        snapshot,
        [
            *read_kafka_snapshot(snapshot),
            Entry(777, 3, 41, 2, 0, 2_500),
            Entry(888, 5, -1, -1, 0, 2_500),
        ],
    )
    log = open_log(ROOMY, now_ms=20)
    assert lead(log, last) == (6, 8, True)
    with pytest.raises(InvalidProducerEpoch):
        lead(log, produced(42, producer_id=777, epoch=2))
    assert lead(log, produced(42, producer_id=777, epoch=3)) == (9, 11, False)
    with pytest.raises(OutOfOrderSequence):
        lead(log, produced(7, producer_id=888, epoch=5))
    assert lead(log, produced(0, producer_id=888, epoch=5)) == (12, 14, False)
    assert snapshot_names(log.directory) == [snapshot.name], "nothing replayed, nothing written"


def test_a_crash_rebuilds_the_state_from_the_last_snapshot_and_the_log(
    open_log: LogOpener,
) -> None:
    log = open_log()
    sent = [produced(3 * i) for i in range(20)]
    for data in sent:
        lead(log, data)
    newest = log.producer_state.snapshot_offsets[-1]
    # Mark the roll snapshot: its content must survive into the rebuilt state.
    path = log.directory / f"{newest:020d}.snapshot"
    write_kafka_snapshot(path, [*read_kafka_snapshot(path), Entry(555, 3, 9, 1, 0, 1_000)])
    abandon(log)
    log = open_log(clean_shutdown=False, recovery_point=0)
    assert log.log_end_offset == 60
    replayed = (60 - newest) // 3
    assert replayed >= 1
    # Every batch replayed after the snapshot is known again, up to the last five.
    for i in range(20 - min(replayed, 5), 20):
        assert lead(log, sent[i]) == (3 * i, 3 * i + 2, True)
    with pytest.raises(InvalidProducerEpoch):
        lead(log, produced(10, producer_id=555, epoch=2))
    assert lead(log, produced(10, producer_id=555, epoch=3)) == (60, 62, False)
    assert f"{60:020d}.snapshot" in snapshot_names(log.directory), "the rebuild is snapshotted"


def test_a_crash_without_any_snapshot_replays_the_whole_log(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    sent = [produced(3 * i) for i in range(7)]
    for data in sent:
        lead(log, data)
    abandon(log)
    log = open_log(ROOMY, clean_shutdown=False)
    for i in range(2, 7):
        assert lead(log, sent[i]) == (3 * i, 3 * i + 2, True)
    with pytest.raises(OutOfOrderSequence):
        lead(log, sent[1])


def test_a_batch_cut_by_recovery_is_forgotten_and_a_stale_snapshot_dropped(
    open_log: LogOpener,
) -> None:
    log = open_log(ROOMY)
    sent = [produced(3 * i) for i in range(4)]
    for data in sent:
        lead(log, data)
    log.close(now_ms=1)  # a snapshot at 12
    segment_file = log.directory / f"{0:020d}.log"
    os.truncate(segment_file, segment_file.stat().st_size - 5)  # the disk lost the tail
    log = open_log(ROOMY, clean_shutdown=False)
    assert log.log_end_offset == 9
    assert f"{12:020d}.snapshot" not in snapshot_names(log.directory)
    assert lead(log, sent[2]) == (6, 8, True)
    assert lead(log, sent[3]) == (9, 11, False), "the retry of the lost batch is written"
    assert offsets_of(log) == list(range(12))


def test_a_corrupt_snapshot_is_deleted_and_an_older_one_used(open_log: LogOpener) -> None:
    log = open_log()
    sent = [produced(3 * i) for i in range(20)]
    for data in sent:
        lead(log, data)
    log.close(now_ms=1)
    newest = log.directory / f"{60:020d}.snapshot"
    damaged = bytearray(newest.read_bytes())
    damaged[-1] ^= 0xFF
    newest.write_bytes(bytes(damaged))
    log = open_log()
    assert lead(log, sent[19]) == (57, 59, True)
    with pytest.raises(OutOfOrderSequence):
        lead(log, produced(0))
    # The rebuilt state was snapshotted again under the same name, whole this time.
    assert read_kafka_snapshot(newest)[0].last_offset == 59


def test_retention_deletes_snapshots_below_the_log_start(open_log: LogOpener) -> None:
    config = LogConfig(segment_bytes=1024, index_interval_bytes=128, retention_bytes=2048)
    log = open_log(config)
    for i in range(40):
        lead(log, produced(3 * i))
    before = log.producer_state.snapshot_offsets
    doomed = log.delete_old_segments(now_ms=0)
    assert doomed
    start = log.log_start_offset
    kept = [offset for offset in before if offset >= start]
    assert kept
    assert log.producer_state.snapshot_offsets == kept
    assert snapshot_names(log.directory) == [f"{offset:020d}.snapshot" for offset in kept]
    for segment in doomed:
        segment.delete()


def test_producers_idle_too_long_are_not_loaded(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    lead(log, produced(0, producer_id=1, timestamp=1_000))
    lead(log, produced(0, producer_id=2, timestamp=100_000))
    log.close(now_ms=1)
    log = open_log(ROOMY, now_ms=1_000 + log.producer_id_expiration_ms)
    assert lead(log, produced(50, producer_id=1)) == (6, 8, False)
    with pytest.raises(OutOfOrderSequence):
        lead(log, produced(50, producer_id=2))


def test_the_log_manager_keeps_producer_state_across_a_clean_restart(tmp_path: Path) -> None:
    manager = LogManager([tmp_path], ROOMY)
    manager.startup(now_ms=0)
    log = manager.create_log("orders", 0, now_ms=0)
    last = produced(3)
    lead(log, produced(0))
    lead(log, last)
    manager.shutdown(now_ms=1)
    assert snapshot_names(tmp_path / "orders-0") == [f"{6:020d}.snapshot"]
    manager = LogManager([tmp_path], ROOMY)
    manager.startup(now_ms=2)
    log = manager.get_log("orders", 0)
    assert lead(log, last) == (3, 5, True)
    manager.shutdown(now_ms=3)
