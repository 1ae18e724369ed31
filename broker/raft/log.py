"""The replicated log as the Raft core keeps it: the entries after its latest snapshot, in
memory, with the epoch boundaries that fetches are checked against.

The metadata log is small (snapshots bound it), so the core reads and checks it without asking
the driver, which keeps the disk copy: it appends and truncates what `Ready` hands it. Offsets
are absolute: the log starts at `start_offset`, the end of the snapshot that holds everything
before it (0 when there is none), and `start_epoch` is the epoch of that snapshot's last entry.
Epochs never decrease along the log, and 0 is no leader's epoch.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

from .messages import Entry, SnapshotId

__all__ = ["RaftLog"]


class RaftLog:
    def __init__(self, entries: Iterable[Entry] = (), *, start: SnapshotId | None = None) -> None:
        """The entries from `start.end_offset` on (from 0 without a snapshot)."""
        self.start_offset = 0 if start is None else start.end_offset
        self.start_epoch = 0 if start is None else start.epoch
        self._entries: list[Entry] = []
        self._epochs: list[int] = []
        """Each epoch in the log once, ascending, the snapshot's first; `_starts[i]` is the
        first offset of `_epochs[i]` (for the snapshot's epoch: the log start)."""
        self._starts: list[int] = []
        if start is not None and start.end_offset > 0:
            self._epochs.append(start.epoch)
            self._starts.append(start.end_offset)
        self.append(entries)

    @property
    def end_offset(self) -> int:
        return self.start_offset + len(self._entries)

    @property
    def last_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else 0

    def epoch_at(self, offset: int) -> int:
        """The epoch of the entry at `offset` (at `start_offset - 1`: the snapshot's)."""
        if offset == self.start_offset - 1:
            return self.start_epoch
        return self[offset].epoch

    def __getitem__(self, offset: int) -> Entry:
        if not self.start_offset <= offset < self.end_offset:
            raise IndexError(f"offset {offset} is outside [{self.start_offset}, {self.end_offset})")
        return self._entries[offset - self.start_offset]

    def read(self, start: int, max_entries: int) -> tuple[Entry, ...]:
        """Up to `max_entries` from `start`, and on to the end of the proposal the last one
        belongs to: a read never ends inside a proposal (a fetch returns whole batches)."""
        if start < self.start_offset:
            raise IndexError(f"offset {start} is before the log start {self.start_offset}")
        first = start - self.start_offset
        end = min(first + max_entries, len(self._entries))
        while end < len(self._entries) and self._entries[end - 1].continued:
            end += 1
        return tuple(self._entries[first:end])

    def proposal_boundary(self, offset: int) -> int:
        """The largest offset at most `offset` (and at least the log start) where no proposal
        is cut in two: how far a high watermark may go, so that a proposal commits whole."""
        offset = min(offset, self.end_offset)
        while (
            offset > self.start_offset and self._entries[offset - 1 - self.start_offset].continued
        ):
            offset -= 1
        return offset

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """The largest epoch in the log (its snapshot's included) that is at most `epoch`, and
        the offset where it ends (the next epoch's first offset, or the log end): where a
        fetcher whose last entry has `epoch` must have its end. (0, 0) when there is none."""
        index = bisect_right(self._epochs, epoch) - 1
        if index < 0:
            return 0, 0
        end = self._starts[index + 1] if index + 1 < len(self._starts) else self.end_offset
        return self._epochs[index], end

    def append(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            if entry.epoch < self.last_epoch:
                raise ValueError(
                    f"an entry of epoch {entry.epoch} cannot follow epoch {self.last_epoch}"
                )
            if entry.epoch > self.last_epoch:
                self._epochs.append(entry.epoch)
                self._starts.append(self.end_offset)
            self._entries.append(entry)

    def truncate(self, end_offset: int) -> None:
        """Drop every entry from `end_offset` on; never what a snapshot holds."""
        if end_offset < self.start_offset:
            raise ValueError(
                f"cannot truncate to {end_offset}, before the log start {self.start_offset}"
            )
        if end_offset >= self.end_offset:
            return
        del self._entries[end_offset - self.start_offset :]
        # The first epoch stands for the snapshot's, when there is one: it stays.
        kept = 1 if self.start_offset > 0 else 0
        while len(self._starts) > kept and self._starts[-1] >= end_offset:
            self._starts.pop()
            self._epochs.pop()

    def compact(self, snapshot: SnapshotId) -> None:
        """A snapshot holds every entry before `snapshot.end_offset` (within this log): drop
        them; the log now starts there."""
        end = snapshot.end_offset
        if not self.start_offset <= end <= self.end_offset:
            raise ValueError(
                f"a snapshot ending at {end} is outside the log [{self.start_offset}, "
                f"{self.end_offset}]"
            )
        if end > self.start_offset and self.epoch_at(end - 1) != snapshot.epoch:
            raise ValueError(f"the entry before {end} is not of epoch {snapshot.epoch}")
        del self._entries[: end - self.start_offset]
        self.start_offset, self.start_epoch = end, snapshot.epoch
        # Epochs that end at or before the new start are gone; the one holding the snapshot's
        # last entry now starts, as far as this log knows, at the new start.
        if end == 0:
            return
        first = bisect_right(self._epochs, snapshot.epoch) - 1
        del self._epochs[:first]
        del self._starts[:first]
        self._starts[0] = end

    def reset(self, snapshot: SnapshotId) -> None:
        """Drop every entry: the log starts again after `snapshot` (one fetched whole)."""
        self._entries.clear()
        self.start_offset, self.start_epoch = snapshot.end_offset, snapshot.epoch
        self._epochs = [snapshot.epoch] if snapshot.end_offset > 0 else []
        self._starts = [snapshot.end_offset] if snapshot.end_offset > 0 else []

    def up_to_date(self, last_epoch: int, end_offset: int) -> bool:
        """Whether a log ending at `end_offset` with `last_epoch` is at least as complete as
        this one: Raft's vote rule, the later last epoch first, then the longer log."""
        return (last_epoch, end_offset) >= (self.last_epoch, self.end_offset)
