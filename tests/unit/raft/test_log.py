"""The Raft log's bookkeeping across snapshots: offsets stay absolute, the epoch boundaries that
fetches are checked against survive compaction, and nothing a snapshot holds can be truncated."""

from __future__ import annotations

import pytest

from broker.raft import Entry, RaftLog, SnapshotId


def _log(*epochs: int) -> RaftLog:
    return RaftLog(Entry(epoch, f"{n}".encode()) for n, epoch in enumerate(epochs))


def test_compaction_keeps_offsets_and_epoch_boundaries() -> None:
    log = _log(1, 1, 2, 2, 2, 4, 4)
    log.compact(SnapshotId(4, 2))
    assert (log.start_offset, log.start_epoch, log.end_offset) == (4, 2, 7)
    assert log[4].payload == b"4"
    assert log.epoch_at(3) == 2  # the snapshot's last entry
    assert log.end_offset_for_epoch(2) == (2, 5)
    assert log.end_offset_for_epoch(3) == (2, 5)
    assert log.end_offset_for_epoch(4) == (4, 7)
    assert log.end_offset_for_epoch(1) == (0, 0)  # inside the snapshot: not known any more
    with pytest.raises(IndexError):
        log.read(3, 1)


def test_a_snapshot_at_an_epoch_boundary_ends_its_epoch_there() -> None:
    log = _log(1, 1, 3, 3)
    log.compact(SnapshotId(2, 1))
    assert log.end_offset_for_epoch(1) == (1, 2)
    assert log.end_offset_for_epoch(2) == (1, 2)
    assert log.end_offset_for_epoch(3) == (3, 4)
    assert log.last_epoch == 3


def test_nothing_a_snapshot_holds_can_be_truncated() -> None:
    log = _log(1, 1, 2, 2)
    log.compact(SnapshotId(3, 2))
    log.truncate(3)
    assert (log.end_offset, log.last_epoch) == (3, 2)  # the snapshot's epoch remains
    log.append([Entry(5, b"x")])
    assert log.end_offset_for_epoch(2) == (2, 3)
    with pytest.raises(ValueError, match="before the log start"):
        log.truncate(2)


def test_a_snapshot_must_match_the_log() -> None:
    log = _log(1, 2, 2)
    with pytest.raises(ValueError, match="not of epoch 1"):
        log.compact(SnapshotId(2, 1))
    with pytest.raises(ValueError, match="outside the log"):
        log.compact(SnapshotId(4, 2))


def test_a_fetched_snapshot_replaces_the_whole_log() -> None:
    log = _log(1, 1, 1)
    log.reset(SnapshotId(10, 3))
    assert (log.start_offset, log.end_offset, log.last_epoch) == (10, 10, 3)
    assert log.end_offset_for_epoch(5) == (3, 10)
    log.append([Entry(4, b"a")])
    assert log.end_offset_for_epoch(3) == (3, 10)
    assert log.up_to_date(4, 11)
    assert not log.up_to_date(3, 12)
