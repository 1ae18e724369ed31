"""Sparse segment indexes in Kafka's on-disk formats.

`.index` (offset index): 8-byte entries, relative offset int32 + file position int32, both
big-endian. An entry is added after every `index.interval.bytes` of log, keyed, as Kafka does,
by the *last* offset of the batch that starts at that position.
`.timeindex`: 12-byte entries, timestamp int64 + relative offset int32; an entry is added only
when the segment's max timestamp grows, so timestamps are strictly increasing.

Entries live in `array`s (4–8 bytes each, bisectable); new ones wait in memory and `flush`
appends them to the file (on every log flush, roll and close), so an index holds no file
descriptor between flushes: a segment costs one descriptor, its `.log`, as in Kafka (whose
indexes are memory-mapped and their files closed). A crash can lose the unflushed tail of an
index, never of the log: recovery rebuilds indexes past the recovery point from the log. A file
that is not a whole number of entries, or whose entries go backwards, is `IndexCorrupt`: the
segment then rebuilds its indexes from the log, which is always the source of truth.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from pathlib import Path

__all__ = ["IndexCorrupt", "OffsetIndex", "TimeIndex"]

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


class IndexCorrupt(Exception):
    """An index file that cannot be trusted; the message says why."""


class _SparseIndex:
    """What both indexes share: two parallel arrays of entry fields, loaded from and appended
    to a file of fixed-size big-endian entries."""

    _ENTRY: struct.Struct

    def __init__(self, path: Path, base_offset: int, codes: tuple[str, str]) -> None:
        self.base_offset = base_offset
        self._first = array(codes[0])
        self._second = array(codes[1])
        if path.exists():
            data = path.read_bytes()
            if len(data) % self._ENTRY.size:
                raise IndexCorrupt(
                    f"{len(data)} bytes is not a whole number of {self._ENTRY.size}-byte entries"
                )
            for first, second in self._ENTRY.iter_unpack(data):
                self._check_next(first, second)
                self._first.append(first)
                self._second.append(second)
        else:
            path.touch()
        self.path = path
        self._unwritten = bytearray()
        """Entries made since the last flush, packed, waiting to be appended to the file."""

    def _check_next(self, first: int, second: int) -> None:
        """Raise `IndexCorrupt` if an entry read from disk does not follow the previous one."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._first)

    def _append_entry(self, first: int, second: int) -> None:
        self._first.append(first)
        self._second.append(second)
        self._unwritten += self._ENTRY.pack(first, second)

    def _keep(self, count: int) -> None:
        """Keep the first `count` entries and rewrite the file to match."""
        if count >= len(self._first):
            return
        del self._first[count:]
        del self._second[count:]
        self._unwritten.clear()
        with open(self.path, "wb") as out:
            for first, second in zip(self._first, self._second, strict=True):
                out.write(self._ENTRY.pack(first, second))

    def reset(self) -> None:
        self._keep(0)

    def flush(self, fsync: bool = False) -> None:
        """Append the entries made since the last flush to the file (and fsync it if asked)."""
        if not self._unwritten and not fsync:
            return
        with open(self.path, "ab") as out:
            out.write(self._unwritten)
            out.flush()
            if fsync:
                os.fsync(out.fileno())
        self._unwritten.clear()

    def rename(self, path: Path) -> None:
        os.replace(self.path, path)
        self.path = path

    def close(self) -> None:
        self.flush()


class OffsetIndex(_SparseIndex):
    """Entries (relative offset, position), both strictly increasing."""

    _ENTRY = _OFFSET_ENTRY
    ENTRY_SIZE = _OFFSET_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.max_entries = max(max_index_bytes // self.ENTRY_SIZE, 1)
        super().__init__(path, base_offset, ("i", "i"))
        self._relative = self._first
        self._positions = self._second

    def _check_next(self, relative: int, position: int) -> None:
        if relative < 0 or (
            self._first and (relative <= self._first[-1] or position <= self._second[-1])
        ):
            raise IndexCorrupt(f"entry ({relative}, {position}) goes backwards")

    @property
    def is_full(self) -> bool:
        return len(self._relative) >= self.max_entries

    @property
    def last_offset(self) -> int:
        return self.base_offset + self._relative[-1] if self._relative else self.base_offset

    @property
    def last_position(self) -> int:
        return self._positions[-1] if self._positions else 0

    def append(self, offset: int, position: int) -> None:
        self._append_entry(offset - self.base_offset, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """The last entry whose offset is at most `offset`, else (base offset, 0)."""
        i = bisect.bisect_right(self._relative, offset - self.base_offset)
        if i == 0:
            return self.base_offset, 0
        return self.base_offset + self._relative[i - 1], self._positions[i - 1]

    def entries(self) -> list[tuple[int, int]]:
        pairs = zip(self._relative, self._positions, strict=True)
        return [(self.base_offset + r, p) for r, p in pairs]

    def check(self, log_size: int) -> None:
        """Raise `IndexCorrupt` if an entry points past the end of the log."""
        if self._positions and self._positions[-1] >= max(log_size, 1):
            raise IndexCorrupt(f"entry at position {self._positions[-1]} is past the log's end")

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or after a file position (the log was truncated there)."""
        self._keep(bisect.bisect_left(self._positions, position))


class TimeIndex(_SparseIndex):
    """Entries (timestamp, relative offset): timestamps strictly increasing."""

    _ENTRY = _TIME_ENTRY
    ENTRY_SIZE = _TIME_ENTRY.size

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset, ("q", "i"))
        self._timestamps = self._first
        self._relative = self._second

    def _check_next(self, timestamp: int, relative: int) -> None:
        if relative < 0 or (
            self._first and (timestamp <= self._first[-1] or relative < self._second[-1])
        ):
            raise IndexCorrupt(f"entry ({timestamp}, {relative}) goes backwards")

    @property
    def last_timestamp(self) -> int:
        return self._timestamps[-1] if self._timestamps else -1

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Record a new max timestamp; entries only ever move forward."""
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        self._append_entry(timestamp, offset - self.base_offset)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """The last entry whose timestamp is at most `timestamp`, else (-1, base offset)."""
        i = bisect.bisect_right(self._timestamps, timestamp)
        if i == 0:
            return -1, self.base_offset
        return self._timestamps[i - 1], self.base_offset + self._relative[i - 1]

    def entries(self) -> list[tuple[int, int]]:
        pairs = zip(self._timestamps, self._relative, strict=True)
        return [(t, self.base_offset + r) for t, r in pairs]

    def check(self, last_offset: int) -> None:
        if self._relative and self.base_offset + self._relative[-1] > last_offset:
            raise IndexCorrupt("entry points past the log's last offset")

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries for offsets at or after `offset`."""
        self._keep(bisect.bisect_left(self._relative, offset - self.base_offset))
