"""Sparse segment indexes in Kafka's on-disk formats.

`.index` (offset index): 8-byte entries, relative offset int32 + file position int32, both
big-endian. An entry is added after every `index.interval.bytes` of log, keyed, as Kafka does,
by the *last* offset of the batch that starts at that position.
`.timeindex`: 12-byte entries, timestamp int64 + relative offset int32; an entry is added only
when the segment's max timestamp grows, so timestamps are strictly increasing.

Entries live in `array`s (4–8 bytes each, bisectable) and are appended to the file as they are
made; the OS writes them with the log and `flush` makes them durable. A file that is not a
whole number of entries, or whose entries go backwards, is `IndexCorrupt`: the segment then
rebuilds its indexes from the log, which is always the source of truth.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from pathlib import Path
from typing import BinaryIO

__all__ = ["IndexCorrupt", "OffsetIndex", "TimeIndex"]

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


class IndexCorrupt(Exception):
    """An index file that cannot be trusted; the message says why."""


class _IndexFile:
    """The append-only file behind an index."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 - owned for the index's life

    def append(self, entry: bytes) -> None:
        self._file.write(entry)

    def rewrite(self, data: bytes) -> None:
        self._file.close()
        with open(self.path, "wb") as out:
            out.write(data)
        self._file = open(self.path, "ab")  # noqa: SIM115

    def flush(self, fsync: bool) -> None:
        self._file.flush()
        if fsync:
            os.fsync(self._file.fileno())

    def rename(self, path: Path) -> None:
        self._file.flush()
        os.replace(self.path, path)
        self.path = path

    def close(self) -> None:
        self._file.close()


class OffsetIndex:
    ENTRY_SIZE = _OFFSET_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max(max_index_bytes // self.ENTRY_SIZE, 1)
        self._relative = array("i")
        self._positions = array("i")
        if path.exists():
            self._load(path.read_bytes())
        self._file = _IndexFile(path)

    @property
    def path(self) -> Path:
        return self._file.path

    def _load(self, data: bytes) -> None:
        if len(data) % self.ENTRY_SIZE:
            raise IndexCorrupt(f"{len(data)} bytes is not a whole number of 8-byte entries")
        previous = (-1, -1)
        for relative, position in _OFFSET_ENTRY.iter_unpack(data):
            if relative <= previous[0] or position <= previous[1] or relative < 0:
                raise IndexCorrupt(f"entry ({relative}, {position}) goes backwards")
            self._relative.append(relative)
            self._positions.append(position)
            previous = (relative, position)

    def __len__(self) -> int:
        return len(self._relative)

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
        relative = offset - self.base_offset
        self._relative.append(relative)
        self._positions.append(position)
        self._file.append(_OFFSET_ENTRY.pack(relative, position))

    def lookup(self, offset: int) -> tuple[int, int]:
        """The last entry whose offset is at most `offset`, else (base offset, 0)."""
        i = bisect.bisect_right(self._relative, offset - self.base_offset)
        if i == 0:
            return self.base_offset, 0
        return self.base_offset + self._relative[i - 1], self._positions[i - 1]

    def entries(self) -> list[tuple[int, int]]:
        return [
            (self.base_offset + r, p) for r, p in zip(self._relative, self._positions, strict=True)
        ]

    def check(self, log_size: int) -> None:
        """Raise `IndexCorrupt` if an entry points past the end of the log."""
        if self._positions and self._positions[-1] >= max(log_size, 1):
            raise IndexCorrupt(f"entry at position {self._positions[-1]} is past the log's end")

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or after a file position (the log was truncated there)."""
        keep = bisect.bisect_left(self._positions, position)
        if keep == len(self._positions):
            return
        del self._relative[keep:]
        del self._positions[keep:]
        self._file.rewrite(
            b"".join(
                _OFFSET_ENTRY.pack(r, p)
                for r, p in zip(self._relative, self._positions, strict=True)
            )
        )

    def reset(self) -> None:
        del self._relative[:]
        del self._positions[:]
        self._file.rewrite(b"")

    def flush(self, fsync: bool = False) -> None:
        self._file.flush(fsync)

    def rename(self, path: Path) -> None:
        self._file.rename(path)

    def close(self) -> None:
        self._file.close()


class TimeIndex:
    ENTRY_SIZE = _TIME_ENTRY.size

    def __init__(self, path: Path, base_offset: int) -> None:
        self.base_offset = base_offset
        self._timestamps = array("q")
        self._relative = array("i")
        if path.exists():
            self._load(path.read_bytes())
        self._file = _IndexFile(path)

    @property
    def path(self) -> Path:
        return self._file.path

    def _load(self, data: bytes) -> None:
        if len(data) % self.ENTRY_SIZE:
            raise IndexCorrupt(f"{len(data)} bytes is not a whole number of 12-byte entries")
        previous = (-(2**63), -1)
        for timestamp, relative in _TIME_ENTRY.iter_unpack(data):
            if timestamp <= previous[0] or relative < previous[1] or relative < 0:
                raise IndexCorrupt(f"entry ({timestamp}, {relative}) goes backwards")
            self._timestamps.append(timestamp)
            self._relative.append(relative)
            previous = (timestamp, relative)

    def __len__(self) -> int:
        return len(self._timestamps)

    @property
    def last_timestamp(self) -> int:
        return self._timestamps[-1] if self._timestamps else -1

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Record a new max timestamp; entries only ever move forward."""
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        relative = offset - self.base_offset
        self._timestamps.append(timestamp)
        self._relative.append(relative)
        self._file.append(_TIME_ENTRY.pack(timestamp, relative))

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """The last entry whose timestamp is at most `timestamp`, else (-1, base offset)."""
        i = bisect.bisect_right(self._timestamps, timestamp)
        if i == 0:
            return -1, self.base_offset
        return self._timestamps[i - 1], self.base_offset + self._relative[i - 1]

    def entries(self) -> list[tuple[int, int]]:
        return [
            (t, self.base_offset + r) for t, r in zip(self._timestamps, self._relative, strict=True)
        ]

    def check(self, last_offset: int) -> None:
        if self._relative and self.base_offset + self._relative[-1] > last_offset:
            raise IndexCorrupt("entry points past the log's last offset")

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries for offsets at or after `offset`."""
        keep = bisect.bisect_left(self._relative, offset - self.base_offset)
        if keep == len(self._relative):
            return
        del self._timestamps[keep:]
        del self._relative[keep:]
        self._file.rewrite(
            b"".join(
                _TIME_ENTRY.pack(t, r)
                for t, r in zip(self._timestamps, self._relative, strict=True)
            )
        )

    def reset(self) -> None:
        del self._timestamps[:]
        del self._relative[:]
        self._file.rewrite(b"")

    def flush(self, fsync: bool = False) -> None:
        self._file.flush(fsync)

    def rename(self, path: Path) -> None:
        self._file.rename(path)

    def close(self) -> None:
        self._file.close()
