"""The replicated log as the Raft core keeps it: every entry in memory, with the epoch
boundaries that fetches are checked against.

The metadata log is small (snapshots bound it), so the core reads and checks it without asking
the driver, which keeps the disk copy: it appends and truncates what `Ready` hands it. Offsets
start at 0; epochs never decrease along the log, and 0 is no leader's epoch.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

from .messages import Entry

__all__ = ["RaftLog"]


class RaftLog:
    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self._entries: list[Entry] = []
        self._epochs: list[int] = []
        """Each epoch in the log once, ascending; `_starts[i]` is its first offset."""
        self._starts: list[int] = []
        self.append(entries)

    @property
    def end_offset(self) -> int:
        return len(self._entries)

    @property
    def last_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else 0

    def epoch_at(self, offset: int) -> int:
        """The epoch of the entry at `offset`."""
        return self._entries[offset].epoch

    def __getitem__(self, offset: int) -> Entry:
        return self._entries[offset]

    def read(self, start: int, max_entries: int) -> tuple[Entry, ...]:
        return tuple(self._entries[start : start + max_entries])

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """The largest epoch in the log that is at most `epoch`, and the offset where it ends
        (the next epoch's first offset, or the log end): where a fetcher whose last entry has
        `epoch` must have its end. (0, 0) when the log has no such epoch."""
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
                self._starts.append(len(self._entries))
            self._entries.append(entry)

    def truncate(self, end_offset: int) -> None:
        """Drop every entry from `end_offset` on."""
        if end_offset >= self.end_offset:
            return
        del self._entries[end_offset:]
        while self._starts and self._starts[-1] >= end_offset:
            self._starts.pop()
            self._epochs.pop()

    def up_to_date(self, last_epoch: int, end_offset: int) -> bool:
        """Whether a log ending at `end_offset` with `last_epoch` is at least as complete as
        this one: Raft's vote rule, the later last epoch first, then the longer log."""
        return (last_epoch, end_offset) >= (self.last_epoch, self.end_offset)
