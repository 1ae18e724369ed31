"""The leader epoch cache: which leader epoch started at which offset.

Replication asks it "where did epoch E end?" (OffsetForLeaderEpoch) so a follower truncates to
exactly the leader's history (KIP-101, KIP-279). Persisted as Kafka's `leader-epoch-checkpoint`
in the partition directory, rewritten on every change. A truncation (the log was cut back) is
written at once. A new epoch (a leader election, or a follower taking its leader's batches of
a new epoch) and the log start moving up (retention, DeleteRecords) go through `write_later`
when the log has a flush thread, as Kafka writes them since KAFKA-15046: two fsyncs (the file,
its directory) per partition on the event loop stalled every client when retention deleted
segments, and when a controlled shutdown moved thousands of leaders.

The flush thread runs in order, so the recovery point never passes batches of an epoch whose
checkpoint is not on disk yet. A crash before a write lands leaves the older checkpoint: its
epochs below the log start are dropped again when the log loads, and the epochs of the
batches past the recovery point are taken from the batches themselves (`Log` recovery, as
Kafka's `LogSegment.recover` assigns them).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from pathlib import Path

from .checkpoints import read_epoch_checkpoint, write_epoch_checkpoint

__all__ = ["UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET", "LeaderEpochCache"]

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
CHECKPOINT_NAME = "leader-epoch-checkpoint"


class LeaderEpochCache:
    def __init__(self, directory: Path) -> None:
        self._path = directory / CHECKPOINT_NAME
        entries = read_epoch_checkpoint(self._path)
        self._epochs = [epoch for epoch, _ in entries]
        self._offsets = [offset for _, offset in entries]
        self.write_later: Callable[[Callable[[], None]], None] | None = None
        """Runs a checkpoint write elsewhere, in order with the others (the log's flusher)."""
        self._writing = threading.Lock()
        self._version = 0
        """Of the newest checkpoint: a write queued before a newer one skips itself."""

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._offsets, strict=True))

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset` if it is newer than what we know."""
        if epoch < 0 or (self._epochs and epoch <= self._epochs[-1]):
            return
        self._epochs.append(epoch)
        self._offsets.append(start_offset)
        self._save(later=True)

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's `endOffsetFor`: (the largest epoch <= `epoch`, the offset where the next
        epoch starts); the log end offset for the latest epoch; undefined if unknown."""
        if epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epoch == self._epochs[-1]:
            return epoch, log_end_offset
        higher = bisect.bisect_right(self._epochs, epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return epoch, self._offsets[0]
        return self._epochs[higher - 1], self._offsets[higher]

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch that wrote `offset` (for ListOffsets' leader_epoch)."""
        i = bisect.bisect_right(self._offsets, offset)
        return self._epochs[i - 1] if i else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after `end_offset` (the log was truncated there)."""
        keep = bisect.bisect_left(self._offsets, end_offset)
        if keep < len(self._offsets):
            del self._epochs[keep:]
            del self._offsets[keep:]
            self._save()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: drop older epochs, keep the one in force."""
        i = bisect.bisect_right(self._offsets, start_offset)
        if i == 0:
            return
        if i == 1 and self._offsets[0] == start_offset:
            return
        self._epochs = self._epochs[i - 1 :]
        self._offsets = [start_offset, *self._offsets[i:]]
        self._save(later=True)

    def clear(self) -> None:
        self._epochs, self._offsets = [], []
        self._save()

    def _save(self, *, later: bool = False) -> None:
        path, entries = self._path, self.entries()
        with self._writing:
            self._version += 1
            version = self._version
            if not (later and self.write_later is not None):
                write_epoch_checkpoint(path, entries)
                return

        def write() -> None:
            with self._writing:
                if version == self._version:  # else a newer checkpoint was written since
                    write_epoch_checkpoint(path, entries)

        self.write_later(write)
