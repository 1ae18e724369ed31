"""One log segment: `<base offset>.log` with its `.index` and `.timeindex`, in Kafka's layout.

The `.log` file holds record batches exactly as they travel on the wire, so a read is a file
slice that the network layer can `sendfile`. Appends go through `pwritev` with each batch's
first 16 bytes (base offset, length, leader epoch — all outside the CRC) patched in a small
separate buffer: the payload itself is never copied or re-encoded.

A segment never trusts its indexes over its log: `recover` rebuilds both from a scan that
keeps every complete, valid batch and cuts the file at the first byte that is not one.
"""

from __future__ import annotations

import os
import struct
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.protocol.errors import MalformedInput
from broker.protocol.records import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    iter_records,
    read_batch_header,
    validate_batch,
)

from .config import LogConfig
from .errors import LogDirFailure
from .files import fsync_file
from .indexes import IndexCorrupt, OffsetIndex, TimeIndex

__all__ = [
    "FileSlice",
    "LogSegment",
    "PinnedSlice",
    "batch_headers",
    "segment_file_name",
    "write_one",
]

DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
"""A segment being written by the log cleaner; discarded when a log loads."""
SWAP_SUFFIX = ".swap"
"""A cleaned segment ready to replace the segments it covers; completed when a log loads."""
_PREFIX = struct.Struct(">qii")
_CHUNK = 1024 * 1024
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
"""Buffers one `pwritev` may take (1024 on Linux): a follower's fetch can carry more batches."""


def segment_file_name(base_offset: int, suffix: str) -> str:
    """Kafka's names: the base offset as 20 zero-padded digits, then `.log`, `.index`, …"""
    return f"{base_offset:020d}{suffix}"


@dataclass(frozen=True, slots=True)
class FileSlice:
    """A range of a segment file, as `Log.read` finds it. It borrows the segment's descriptor,
    so it is only good while the segment is open; a fetch response holds its `pin()`ned copy."""

    fd: int
    position: int
    size: int

    def read(self) -> bytes:
        """The bytes, for listeners that cannot `sendfile` (TLS)."""
        return os.pread(self.fd, self.size, self.position)

    def pin(self) -> PinnedSlice:
        """The same range through a descriptor of its own, still readable after the segment
        closes or is deleted (retention, compaction, topic deletion) — what a response that
        waits for the socket holds. Its owner closes it."""
        return PinnedSlice(os.dup(self.fd), self.position, self.size)


@dataclass(slots=True, eq=False)
class PinnedSlice:
    """A `FileSlice` that owns its descriptor: the `Region` a Fetch response carries
    (`broker.protocol.fetch`), which the server sends and then closes."""

    fd: int
    position: int
    size: int

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        return os.pread(self.fd, self.size, self.position)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def batch_headers(fd: int, size: int, start: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of every batch in the first `size` bytes of a segment file, from
    `start` (a batch boundary), reading the 61-byte headers alone."""
    position = start
    while position + BATCH_HEADER_SIZE <= size:
        header = read_batch_header(os.pread(fd, BATCH_HEADER_SIZE, position))
        yield position, header
        position += header.size


def write_one(fd: int, data: memoryview, prefix: bytes, position: int) -> int | OSError:
    """Write the single batch `data`, its first bytes replaced by `prefix` (offsets and leader
    epoch), at `position` of the log file `fd`; the bytes written, or the error (returned, not
    raised, so that a thread can hand it back). Releases the GIL while the kernel copies."""
    try:
        return os.pwritev(fd, (prefix, data[len(prefix) :]), position)
    except OSError as exc:
        return exc


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        now_ms: int,
        *,
        file_suffix: str = "",
    ) -> None:
        """`file_suffix` names the files `<base>.log<suffix>`, … (`.cleaned` for compaction)."""
        self.base_offset = base_offset
        self.config = config
        self.log_path = directory / segment_file_name(base_offset, ".log" + file_suffix)
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.created_ms = now_ms
        self._max_segment_ms = config.max_segment_ms
        self.indexes_rebuilt = False
        self.offset_index = self._open_offset_index(directory, file_suffix)
        self.time_index = self._open_time_index(directory, file_suffix)
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.first_batch_timestamp: int | None = None
        self._bytes_since_index_entry = 0

    def _open_offset_index(self, directory: Path, file_suffix: str) -> OffsetIndex:
        path = directory / segment_file_name(self.base_offset, ".index" + file_suffix)
        self.indexes_rebuilt |= not path.exists()
        try:
            return OffsetIndex(path, self.base_offset, self.config.segment_index_bytes)
        except IndexCorrupt:
            path.unlink()
            self.indexes_rebuilt = True
            return OffsetIndex(path, self.base_offset, self.config.segment_index_bytes)

    def _open_time_index(self, directory: Path, file_suffix: str) -> TimeIndex:
        path = directory / segment_file_name(self.base_offset, ".timeindex" + file_suffix)
        self.indexes_rebuilt |= not path.exists()
        try:
            return TimeIndex(path, self.base_offset)
        except IndexCorrupt:
            path.unlink()
            self.indexes_rebuilt = True
            return TimeIndex(path, self.base_offset)

    # -- loading ---------------------------------------------------------------------------

    def load_clean(self) -> None:
        """Open after a clean shutdown: trust the indexes unless one is missing or corrupt, and
        scan only the tail after the last index entry for the end offset and max timestamp."""
        try:
            self.offset_index.check(self.size)
        except IndexCorrupt:
            self.indexes_rebuilt = True
        if self.indexes_rebuilt:
            self.recover()
            return
        self.max_timestamp, self.offset_of_max_timestamp = self.time_index.lookup(2**63 - 1)
        if self.max_timestamp < 0:
            self.offset_of_max_timestamp = self.base_offset
        self.next_offset = self.base_offset
        # The tail after the last index entry is read whole and checked even after a clean
        # shutdown: a batch torn by a full disk must never be counted, whatever the marker says.
        tail = self._scan_valid(self.offset_index.last_position)
        end = self.offset_index.last_position
        for position, header in tail:
            self._observe(position, header, index=False)
            end = position + header.size
        if end != self.size:
            self.recover()
            return
        if self.size:
            first = read_batch_header(os.pread(self.fd, BATCH_HEADER_SIZE, 0))
            self.first_batch_timestamp = first.max_timestamp
        try:
            self.time_index.check(self.next_offset - 1)
        except IndexCorrupt:
            self.recover()

    def recover(self) -> int:
        """Rebuild the indexes from the log, keeping every complete and valid batch and cutting
        the file at the first byte that is not one. Returns the bytes cut."""
        self.offset_index.reset()
        self.time_index.reset()
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp = None
        self._bytes_since_index_entry = 0
        valid_end = 0
        for position, header in self._scan_valid():
            self._observe(position, header, index=True)
            valid_end = position + header.size
        truncated = self.size - valid_end
        if truncated:
            os.ftruncate(self.fd, valid_end)
            self.size = valid_end
        self.indexes_rebuilt = False
        return truncated

    def _scan_headers(self, start: int) -> Iterator[tuple[int, BatchHeader]]:
        return batch_headers(self.fd, self.size, start)

    def _scan_valid(self, start: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """Batches from `start` (a batch boundary) until the first torn, corrupt or
        out-of-order one."""
        position = start
        expected = self.base_offset
        while position + BATCH_HEADER_SIZE <= self.size:
            (_, length, _) = _PREFIX.unpack(os.pread(self.fd, _PREFIX.size, position))
            size = length + LOG_OVERHEAD
            if length < BATCH_HEADER_SIZE - LOG_OVERHEAD or position + size > self.size:
                return
            try:
                header = validate_batch(os.pread(self.fd, size, position))
            except MalformedInput:
                return
            if header.base_offset < expected:
                return
            yield position, header
            expected = header.next_offset
            position += size

    def _observe(self, position: int, header: BatchHeader, *, index: bool) -> None:
        """Account for a batch now in the file at `position`."""
        self._account(
            position,
            header.batch_length + LOG_OVERHEAD,
            header.max_timestamp,
            header.base_offset + header.last_offset_delta,
            index=index,
        )

    def _account(
        self, position: int, size: int, max_timestamp: int, last_offset: int, *, index: bool
    ) -> None:
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = max_timestamp
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        # A full index only makes the index sparser; the segment rolls before the next append.
        if (
            index
            and self._bytes_since_index_entry > self.config.index_interval_bytes
            and not self.offset_index.is_full
        ):
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += size
        self.next_offset = last_offset + 1

    # -- appending -------------------------------------------------------------------------

    def append(
        self, data: memoryview, batches: list[tuple[int, BatchHeader]], prefixes: list[bytes]
    ) -> None:
        """Write batches whose first 16 bytes are replaced by `prefixes` (patched offsets and
        leader epochs); `batches` are (position in `data`, header with the assigned offsets)."""
        buffers: list[bytes | memoryview] = []
        expected = 0
        for (position, header), prefix in zip(batches, prefixes, strict=True):
            size = header.batch_length + LOG_OVERHEAD
            buffers.append(prefix)
            buffers.append(data[position + len(prefix) : position + size])
            expected += size
        written = 0
        try:
            for start in range(0, len(buffers), _IOV_MAX):
                written += os.pwritev(
                    self.fd, buffers[start : start + _IOV_MAX], self.size + written
                )
        except OSError as exc:
            self._undo_write(f"{exc.strerror or exc} after {written} of {expected} bytes")
        if written != expected:
            self._undo_write(f"short write: {written} of {expected} bytes")
        position = self.size
        for _, header in batches:
            self._observe(position, header, index=True)
            position += header.batch_length + LOG_OVERHEAD
        self.size = position

    def append_one(
        self, data: memoryview, prefix: bytes, size: int, max_timestamp: int, last_offset: int
    ) -> None:
        """`append` for a single batch that is the whole of `data` (what producers send)."""
        position = self.size
        written = write_one(self.fd, data, prefix, position)
        self.finish_one(position, written, size, max_timestamp, last_offset)

    def finish_one(
        self, position: int, written: int | OSError, size: int, max_timestamp: int, last_offset: int
    ) -> None:
        """Take in a single batch of `size` bytes that `write_one` wrote at `position`, here or
        on another thread; if it failed or fell short, cut the file back and raise."""
        if isinstance(written, OSError):
            self._undo_write(f"{written.strerror or written} writing {size} bytes")
        if written != size:
            self._undo_write(f"short write: {written} of {size} bytes")
        self._account(position, size, max_timestamp, last_offset, index=True)
        self.size = position + size

    def _undo_write(self, what: str) -> typing.NoReturn:
        """Cut the file back to its last whole batch after a failed write (a full disk writes
        part of a batch), so that no torn batch is ever left behind, then raise."""
        try:
            os.ftruncate(self.fd, self.size)
            cut = "the partial write was cut off"
        except OSError as exc:
            cut = f"the partial write could not be cut off ({exc}); recovery will"
        raise LogDirFailure(f"append to {self.log_path} failed ({what}); {cut}")

    def update_config(self, config: LogConfig) -> None:
        """New topic settings (`Log.update_config`): they govern this segment's roll and index
        entries from the next append on."""
        self.config = config
        self._max_segment_ms = config.max_segment_ms

    def should_roll(self, incoming_bytes: int, now_ms: int, incoming_max_timestamp: int) -> bool:
        """Kafka's `LogSegment.shouldRoll`. Time is measured as Kafka measures it: from the
        segment's first batch timestamp to the incoming batches' max timestamp, so records
        produced with an old CreateTime do not roll a segment per batch; only a segment
        without timestamps falls back to wall-clock time since it was created."""
        if self.size == 0:
            return False
        if self.size + incoming_bytes > self.config.segment_bytes:
            return True
        if self.offset_index.is_full:
            return True
        first = self.first_batch_timestamp
        if first is not None and first >= 0:
            waited = incoming_max_timestamp - first
        else:
            waited = now_ms - self.created_ms
        return waited > self._max_segment_ms

    # -- reading ---------------------------------------------------------------------------

    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is at least `offset`: where a read starts."""
        _, start = self.offset_index.lookup(offset)
        for position, header in self._scan_headers(start):
            if header.last_offset >= offset:
                return position, header
        return None

    def read(
        self, offset: int, max_bytes: int, max_position: int | None, min_one_batch: bool
    ) -> FileSlice | None:
        """Up to `max_bytes` from the batch holding `offset`, or None if it is not here.

        With `min_one_batch` the first batch is returned whole even if larger (KIP-74).
        """
        found = self.find_batch(offset)
        if found is None:
            return None
        position, header = found
        limit = self.size if max_position is None else min(max_position, self.size)
        if position >= limit:
            return FileSlice(self.fd, position, 0)
        size = min(limit - position, max_bytes)
        if min_one_batch and size < header.size:
            size = min(header.size, limit - position)
        return FileSlice(self.fd, position, size)

    def position_of(self, offset: int) -> int | None:
        """File position of the batch holding `offset`, or None if past this segment."""
        found = self.find_batch(offset)
        return None if found is None else found[0]

    def find_offset_by_timestamp(
        self, timestamp: int, start_offset: int = 0
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `start_offset` (the log start)
        with timestamp >= `timestamp`."""
        if self.max_timestamp < timestamp:
            return None
        _, indexed_offset = self.time_index.lookup(timestamp)
        _, start = self.offset_index.lookup(max(indexed_offset, start_offset))
        for position, header in self._scan_headers(start):
            if header.max_timestamp < timestamp or header.last_offset < start_offset:
                continue
            batch = os.pread(self.fd, header.size, position)
            for record in iter_records(batch):
                if record.timestamp >= timestamp and record.offset >= start_offset:
                    return record.offset, record.timestamp
        return None

    def max_timestamp_record(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record carrying this segment's largest timestamp:
        the batch comes from the segment's bookkeeping, the record from that batch alone
        (Kafka's `offsetOfMaxTimestamp`, KAFKA-16310: the record, not the batch's last
        offset)."""
        if self.max_timestamp < 0:
            return None
        found = self.find_batch(self.offset_of_max_timestamp)
        if found is None:
            return None
        position, header = found
        for record in iter_records(os.pread(self.fd, header.size, position)):
            if record.timestamp == header.max_timestamp:
                return record.offset, record.timestamp
        return header.last_offset, header.max_timestamp

    def batches(self, start_position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """Every batch header from a position on (compaction, audits, tests)."""
        return self._scan_headers(start_position)

    def read_batch(self, position: int, header: BatchHeader) -> bytes:
        return os.pread(self.fd, header.size, position)

    # -- truncation, flushing, deletion ----------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every batch at or after `offset`; return the bytes removed."""
        found = self.find_batch(offset)
        if found is None:
            return 0
        position, _ = found
        # As in Kafka, the batch holding `offset` goes whole: followers truncate at batch
        # boundaries, and a batch is never split.
        removed = self.size - position
        if removed <= 0:
            return 0
        os.ftruncate(self.fd, position)
        self.size = position
        self.offset_index.truncate_to_position(position)
        self.time_index.truncate_to_offset(offset)
        self._reload_tail()
        return removed

    def _reload_tail(self) -> None:
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp = None
        self._bytes_since_index_entry = 0
        for position, header in self._scan_headers(0):
            self._observe(position, header, index=False)

    def flush(self) -> None:
        os.fsync(self.fd)
        self.offset_index.flush(fsync=True)
        self.time_index.flush(fsync=True)

    def flush_detached(self) -> Callable[[], None]:
        """Write the indexes' new entries now, and return the fsyncs left (the log file, then
        both indexes) as a call that may run on another thread: it has its own descriptor of
        the log file, so the segment may be closed, deleted or renamed meanwhile (an index
        renamed away is not fsynced: it was deleted or replaced by then)."""
        self.offset_index.flush()
        self.time_index.flush()
        log_fd = os.dup(self.fd)
        index_paths = (self.offset_index.path, self.time_index.path)

        def fsync() -> None:
            try:
                os.fsync(log_fd)
            finally:
                os.close(log_fd)
            for path in index_paths:
                fsync_file(path)

        return fsync

    def flush_to_os(self) -> None:
        self.offset_index.flush()
        self.time_index.flush()

    def mark_deleted(self) -> list[Path]:
        """Rename the segment's files to `*.deleted`; open slices keep working until `close`."""
        renamed = []
        new_log = self.log_path.with_name(self.log_path.name + DELETED_SUFFIX)
        os.replace(self.log_path, new_log)
        self.log_path = new_log
        renamed.append(new_log)
        for index in (self.offset_index, self.time_index):
            target = index.path.with_name(index.path.name + DELETED_SUFFIX)
            index.rename(target)
            renamed.append(target)
        return renamed

    def change_file_suffix(self, old: str, new: str) -> None:
        """Rename the `.log` file, then both indexes, from `<name><old>` to `<name><new>` (the
        cleaner's `.cleaned` → `.swap` → final names); open slices keep working."""

        def renamed(path: Path) -> Path:
            if not path.name.endswith(old):
                raise ValueError(f"{path.name} does not end with {old!r}")
            return path.with_name(path.name.removesuffix(old) + new)

        target = renamed(self.log_path)
        os.replace(self.log_path, target)
        self.log_path = target
        for index in (self.offset_index, self.time_index):
            index.rename(renamed(index.path))

    def delete(self) -> None:
        """Close the segment and remove its files (under whatever suffix they carry now)."""
        for path in self.close_for_deletion():
            path.unlink(missing_ok=True)

    def close_for_deletion(self) -> tuple[Path, Path, Path]:
        """Close the segment; the files the caller is to remove."""
        self.close()
        return (self.log_path, self.offset_index.path, self.time_index.path)

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        if self.fd < 0:
            return
        self.offset_index.close()
        self.time_index.close()
        os.close(self.fd)
        self.fd = -1
