"""Log compaction (`cleanup.policy=compact` and `compact,delete`), after Kafka's LogCleaner.

A compacted log has a clean head and a dirty tail. The cleaner checkpoint of a log is its
*first dirty offset*: everything below it has been cleaned. Kafka keeps it per log dir in
`cleaner-offset-checkpoint` (`read_cleaner_checkpoint`, `write_cleaner_checkpoint`); the
caller persists the `CleanResult.first_dirty_offset` of each round.

Deciding (plain functions over segment sizes and timestamps, no I/O — `cleanable_range`,
`needs_cleaning`, `filthiest_log`):
- The cleanable range runs from the first dirty offset to the *first uncleanable offset*: the
  active segment's base, the base of the first dirty segment holding a record newer than
  `min.compaction.lag.ms` (its max timestamp is after `now - lag`), or the base of the segment
  holding the last stable offset when the caller passes one (the high watermark; with
  transactions it will be the first offset of an open transaction), whichever comes first.
- dirty ratio = cleanable bytes / (clean bytes + cleanable bytes), whole segments, as Kafka
  counts them. A log is cleaned when the ratio is above `min.cleanable.dirty.ratio`, or when
  its oldest dirty segment's first batch is older than `max.compaction.lag.ms` and anything at
  all is cleanable. A checkpoint below the log start or past the log end is reset to the log
  start (Kafka does the same after truncation or DeleteRecords).

Cleaning, in three steps (`clean` does all three inline; the node runs `compact` in a worker
process, ADR 0006): `plan_clean` fixes the round as a picklable `CleanJob` (files and sizes,
no `Log`), `compact` writes the cleaned segments as `.cleaned` files, `swap_in` puts them in
place.
- An offset map key → latest offset is built over the dirty part of the cleanable range (at
  most `max_map_entries` keys, and keys costing at most `max_map_bytes` in memory: a full map
  ends the round early, the rest stays dirty). Then
  every closed segment from the start of the log to the last mapped offset is rewritten. A
  record survives if its offset is past the map's last offset, or it has a key and no later
  offset for that key is in the map, and it is not an expired tombstone. Records without a key
  are dropped, as Kafka does (compacted topics refuse them on produce; older data may hold them).
- Offsets are never renumbered. A batch that loses records is rebuilt with `build_batch`,
  keeping its base offset, last offset delta (so the producer's last sequence stays right),
  producer id, epoch and base sequence, leader epoch, codec and timestamp type; a batch that
  loses nothing is copied byte for byte. An emptied batch goes, except the last data batch of
  a producer that is still active (its last batch is younger than the producer id expiration,
  Kafka's `producer.id.expiration.ms`): as in Kafka, its header stays as an empty batch (no
  records, no compression, its original offsets and sequence) so producer state survives.
- Tombstones follow Kafka ≥ 3.0 (KIP-534), with no file times involved: the first time a batch
  holding a surviving tombstone is rewritten, it gets a *delete horizon* = `now +
  delete.retention.ms`, stored as its base timestamp with attribute bit 6 set (record timestamp
  deltas are relative to it, so record timestamps are unchanged). Tombstones in a batch whose
  horizon has passed are removed by the next round; until then consumers still see them.
- Control batches and transactional batches are copied untouched and their keys are not
  mapped: transactions (aborted data, markers, the last stable offset) are out of scope here.
- The active segment is never read for cleaning or written. Consecutive cleaned segments are
  merged into one while their sizes sum to at most `segment.bytes`, their indexes to at most
  `segment.index.bytes` and their offsets stay within 2**31 - 1 of the group's base offset. A
  lone segment whose batches all come out unchanged is left as it is.

Crash safety, as in Kafka, one group at a time: a group is written as `<base>.log.cleaned`
(+ indexes) and fsynced, renamed `.swap`, swapped into the log in memory, the old segments
renamed `.deleted` (they are returned for deletion after `file.delete.delay.ms`), and the
`.swap` files renamed to their final names. When a log loads, `.cleaned` files are discarded
and `complete_interrupted_swaps` finishes any swap: every segment file whose base offset the
swap covers goes, then the swap files lose their suffix (an index without its swapped log is
discarded and rebuilt).

`compact` reads closed segments only, through a descriptor of the log's directory, and renames
nothing; `swap_in` checks that the log still holds the very segments planned before each group
(else CleaningAborted, and the round's files go). The caller must not retain or clean the same
log meanwhile (`LogManager` sees to it). Time is an argument (`now_ms`), never read from a
clock here.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import google_crc32c

from broker.protocol.errors import MalformedInput
from broker.protocol.records import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    Record,
    build_batch,
    iter_records,
    read_batch_header,
)

from .checkpoints import read_offset_checkpoint, write_offset_checkpoint
from .config import LogConfig
from .errors import CorruptRecordError
from .files import fsync_dir
from .indexes import OffsetIndex, TimeIndex
from .segments import (
    CLEANED_SUFFIX,
    SWAP_SUFFIX,
    LogSegment,
    batch_headers,
    segment_file_name,
)

if TYPE_CHECKING:
    from .log import Log

__all__ = [
    "CLEANER_CHECKPOINT_FILE",
    "CleanJob",
    "CleanResult",
    "CleanableRange",
    "CleanedGroup",
    "CleaningAborted",
    "Compaction",
    "SourceSegment",
    "clean",
    "cleanable_range",
    "compact",
    "complete_interrupted_swaps",
    "filthiest_log",
    "group_segments",
    "needs_cleaning",
    "plan_clean",
    "read_cleaner_checkpoint",
    "result_of",
    "swap_in",
    "write_cleaner_checkpoint",
]

CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"

_INT32_MAX = 2**31 - 1
_WRITE_CHUNK_BYTES = 1024 * 1024
_ATTRIBUTES = struct.Struct(">h")
_CRC = struct.Struct(">I")
_ATTRIBUTES_AT = 21
_CRC_AT = 17
_DELETE_HORIZON = 0x40
_SEGMENT_FILE = re.compile(r"^(?P<base>\d{20})\.(?P<kind>log|index|timeindex)$")

K = TypeVar("K")


# -- the cleaner checkpoint ----------------------------------------------------------------


def read_cleaner_checkpoint(log_dir: Path) -> dict[tuple[str, int], int]:
    """First dirty offset of every partition in `<log dir>/cleaner-offset-checkpoint`."""
    return read_offset_checkpoint(log_dir / CLEANER_CHECKPOINT_FILE)


def write_cleaner_checkpoint(log_dir: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    """Replace the log dir's cleaner checkpoint atomically (write, fsync, rename)."""
    write_offset_checkpoint(log_dir / CLEANER_CHECKPOINT_FILE, dict(offsets))


# -- deciding what to clean ----------------------------------------------------------------


class SizedSegment(Protocol):
    """Where a segment starts and how big it is: what every step of the cleaner reads."""

    @property
    def base_offset(self) -> int: ...
    @property
    def size(self) -> int: ...


class SegmentView(SizedSegment, Protocol):
    """What the decisions read of a segment (a `LogSegment` is one)."""

    @property
    def max_timestamp(self) -> int: ...
    @property
    def first_batch_timestamp(self) -> int | None: ...


class LogView(Protocol):
    """What the decisions read of a log (a `Log` is one); the last segment is the active one."""

    @property
    def segments(self) -> Sequence[SegmentView]: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def config(self) -> LogConfig: ...


@dataclass(frozen=True, slots=True)
class CleanableRange:
    """Kafka's `LogToClean`: where a log's dirty section starts and what may be cleaned now."""

    first_dirty_offset: int
    """The checkpoint to clean from, after checking it against the log's offsets."""
    first_uncleanable_offset: int
    """Base offset of the first segment that must stay as it is (active or too recent)."""
    clean_bytes: int
    cleanable_bytes: int
    max_compaction_delay_ms: int
    """How far past `max.compaction.lag.ms` the oldest dirty segment is (0: not past it)."""
    checkpoint_reset: bool
    """The checkpoint was outside the log and was reset to the log start offset."""

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def dirty_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    def should_clean(self, config: LogConfig) -> bool:
        """Kafka's choice: past the max compaction lag with something to clean, or dirty
        enough."""
        if not config.compact or self.total_bytes == 0:
            return False
        if self.max_compaction_delay_ms > 0 and self.cleanable_bytes > 0:
            return True
        return self.dirty_ratio > config.min_cleanable_dirty_ratio


def _floor(segments: Sequence[SizedSegment], offset: int) -> int:
    """Index of the segment holding `offset` (the last one based at or below it), else 0."""
    bases = [segment.base_offset for segment in segments]
    return max(bisect.bisect_right(bases, offset) - 1, 0)


def _checked_first_dirty(checkpoint: int | None, start: int, end: int) -> tuple[int, bool]:
    if checkpoint is None:
        return start, False
    if checkpoint < start or checkpoint > end:
        return start, True
    return checkpoint, False


def cleanable_range(
    log: LogView,
    first_dirty_offset: int | None,
    now_ms: int,
    *,
    last_stable_offset: int | None = None,
) -> CleanableRange:
    """What of `log` can be cleaned at `now_ms`, given its cleaner checkpoint (None: none yet,
    clean from the log start). `last_stable_offset` is where the replication layer's high
    watermark is (Kafka never cleans at or past it: records there may still be truncated); the
    segment holding it is not cleaned."""
    segments = log.segments
    config = log.config
    active = segments[-1]
    first_dirty, reset = _checked_first_dirty(
        first_dirty_offset, log.log_start_offset, log.log_end_offset
    )
    dirty = segments[_floor(segments, first_dirty) : -1]
    uncleanable = active.base_offset
    if last_stable_offset is not None:
        uncleanable = min(uncleanable, last_stable_offset)
    lag = max(config.min_compaction_lag_ms, 0)
    if lag > 0:
        for segment in dirty:
            if segment.max_timestamp > now_ms - lag:
                uncleanable = min(uncleanable, segment.base_offset)
                break
    uncleanable = max(first_dirty, uncleanable)
    # The uncleanable section starts at a segment boundary.
    if uncleanable >= active.base_offset:
        first_uncleanable = active.base_offset
    else:
        first_uncleanable = segments[_floor(segments, uncleanable)].base_offset
    low = _floor(segments, min(first_dirty, first_uncleanable))
    cleanable_bytes = sum(
        segment.size for segment in segments[low:] if segment.base_offset < first_uncleanable
    )
    clean_bytes = sum(segment.size for segment in segments if segment.base_offset < first_dirty)
    return CleanableRange(
        first_dirty_offset=first_dirty,
        first_uncleanable_offset=first_uncleanable,
        clean_bytes=clean_bytes,
        cleanable_bytes=cleanable_bytes,
        max_compaction_delay_ms=_max_compaction_delay(dirty, config, now_ms),
        checkpoint_reset=reset,
    )


def _max_compaction_delay(dirty: Sequence[SegmentView], config: LogConfig, now_ms: int) -> int:
    """Kafka's `maxCompactionDelay`: by how much the first batch of the oldest dirty closed
    segment has outlived `max.compaction.lag.ms` (segments without timestamps do not count)."""
    stamps = [
        s.first_batch_timestamp
        for s in dirty
        if s.first_batch_timestamp is not None and s.first_batch_timestamp > 0
    ]
    if not stamps:
        return 0
    clean_until = now_ms - max(config.max_compaction_lag_ms, 0)
    earliest = min(stamps)
    return clean_until - earliest if earliest < clean_until else 0


def needs_cleaning(
    log: LogView,
    first_dirty_offset: int | None,
    now_ms: int,
    *,
    last_stable_offset: int | None = None,
) -> bool:
    """Whether a log with this cleaner checkpoint should be compacted at `now_ms`."""
    found = cleanable_range(log, first_dirty_offset, now_ms, last_stable_offset=last_stable_offset)
    return found.should_clean(log.config)


def filthiest_log(
    logs: Mapping[K, LogView],
    checkpoints: Mapping[K, int],
    now_ms: int,
    *,
    last_stable_offsets: Mapping[K, int] | None = None,
) -> tuple[K, CleanableRange] | None:
    """The log the cleaner takes next, as Kafka's `grabFilthiestCompactedLog`: among compacted
    logs that should be cleaned, the one with the highest dirty ratio."""
    best: tuple[K, CleanableRange] | None = None
    for key, log in logs.items():
        if not log.config.compact:
            continue
        lso = None if last_stable_offsets is None else last_stable_offsets.get(key)
        found = cleanable_range(log, checkpoints.get(key), now_ms, last_stable_offset=lso)
        if found.should_clean(log.config) and (
            best is None or found.dirty_ratio > best[1].dirty_ratio
        ):
            best = key, found
    return best


class GroupedSegment(SizedSegment, Protocol):
    """What grouping reads of a segment (`SourceSegment` and the cleaner's own view)."""

    @property
    def offset_index_bytes(self) -> int: ...
    @property
    def time_index_bytes(self) -> int: ...


G = TypeVar("G", bound=GroupedSegment)


def group_segments(segments: Sequence[G], limit_offset: int, config: LogConfig) -> list[list[G]]:
    """Consecutive segments cleaned into one, as Kafka's `groupSegmentsBySize`: the group's log
    sizes sum to at most `segment.bytes`, each index's to at most `segment.index.bytes`, and
    every offset stays within 2**31 - 1 of the group's base offset. `limit_offset` is the base
    offset of the segment after the last one given."""
    groups: list[list[G]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        log_bytes = segments[i].size
        index_bytes = segments[i].offset_index_bytes
        time_bytes = segments[i].time_index_bytes
        i += 1
        while i < len(segments):
            candidate = segments[i]
            following = segments[i + 1].base_offset if i + 1 < len(segments) else limit_offset
            if (
                log_bytes + candidate.size > config.segment_bytes
                or index_bytes + candidate.offset_index_bytes > config.segment_index_bytes
                or time_bytes + candidate.time_index_bytes > config.segment_index_bytes
                or (candidate.size > 0 and following - 1 - group[0].base_offset > _INT32_MAX)
            ):
                break
            group.append(candidate)
            log_bytes += candidate.size
            index_bytes += candidate.offset_index_bytes
            time_bytes += candidate.time_index_bytes
            i += 1
        groups.append(group)
    return groups


# -- cleaning --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceSegment:
    """A closed segment as a round found it: enough to read and group it without the `Log`
    (the worker that compacts runs in a process of its own)."""

    base_offset: int
    file_name: str
    """Its `.log` file, in the log's directory."""
    size: int
    """Bytes of whole batches when the round was planned: the worker reads no further."""
    offset_index_bytes: int
    time_index_bytes: int

    @classmethod
    def of(cls, segment: LogSegment) -> SourceSegment:
        return cls(
            segment.base_offset,
            segment.log_path.name,
            segment.size,
            len(segment.offset_index) * OffsetIndex.ENTRY_SIZE,
            len(segment.time_index) * TimeIndex.ENTRY_SIZE,
        )


@dataclass(frozen=True, slots=True)
class CleanJob:
    """One compaction round of one log, fixed when it is planned (`plan_clean`) and carried
    out by `compact` anywhere, a worker process included: it pickles, and holds no `Log`."""

    directory: Path
    directory_id: tuple[int, int]
    """(st_dev, st_ino) of the directory when planned: a new log of the same name is not it."""
    config: LogConfig
    now_ms: int
    first_dirty_offset: int
    first_uncleanable_offset: int
    cleanable_bytes: int
    segments: tuple[SourceSegment, ...]
    """Every closed segment below the first uncleanable offset, from the log start."""
    active_producers: Mapping[int, int]
    """producer id → offset of its last data batch, for producers still active."""
    max_map_entries: int | None
    max_map_bytes: int | None
    """Bounds of the offset map (`log.cleaner.dedupe.buffer.size`); a full map ends the round
    early and the rest stays dirty."""


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """Consecutive source segments and what `compact` made of them."""

    base_offsets: tuple[int, ...]
    cleaned_size: int | None
    """Size of `<first base>.log.cleaned` (written with its indexes and fsynced), or None:
    nothing changed and the segments stay as they are."""


@dataclass(frozen=True, slots=True)
class Compaction:
    """What `compact` did, for the swap (`swap_in`) to put in place."""

    first_dirty_offset: int
    """The new cleaner checkpoint, once every cleaned group is swapped in."""
    groups: tuple[CleanedGroup, ...]
    bytes_before: int
    bytes_after: int
    records_read: int
    records_removed: int


@dataclass(frozen=True, slots=True)
class CleanResult:
    first_dirty_offset: int
    """The new cleaner checkpoint: every offset below it has been cleaned."""
    retired_segments: list[LogSegment]
    """Old segments, out of the log and renamed `.deleted`: close and remove them after
    `file.delete.delay.ms` (`LogManager.retire`)."""
    bytes_before: int
    """Size of the segments rewritten (or found unchanged) in this round."""
    bytes_after: int
    records_read: int
    records_removed: int


class CleaningAborted(Exception):
    """The log changed under a round (its segments are not those the round read): nothing of
    the round is swapped in, and its cleaned files are removed."""


MAP_BYTES_PER_KEY = 120
"""What one key of the offset map costs in memory, besides the key's own bytes: the dict slot,
the bytes object and the offset (measured on CPython 3.11: 112-120 bytes). The map stops
growing when its keys' cost reaches `max_map_bytes`."""


def plan_clean(
    log: Log,
    first_dirty_offset: int | None,
    now_ms: int,
    *,
    last_stable_offset: int | None = None,
    max_map_entries: int | None = None,
    max_map_bytes: int | None = None,
    active_producers: Mapping[int, int] | None = None,
    producer_id_expiration_ms: int | None = None,
) -> CleanJob:
    """The round `clean` would do now, whatever its dirty ratio (`needs_cleaning` decides
    whether to do one). `last_stable_offset`: as for `cleanable_range`. `active_producers`:
    by default the log's producer state says, with producers silent for
    `producer_id_expiration_ms` (by default the log's) counted as gone."""
    if max_map_entries is not None and max_map_entries < 1:
        raise ValueError("the offset map must hold at least one key")
    found = cleanable_range(log, first_dirty_offset, now_ms, last_stable_offset=last_stable_offset)
    if active_producers is None:
        if producer_id_expiration_ms is None:
            producer_id_expiration_ms = log.producer_id_expiration_ms
        active_producers = _active_producers(log, now_ms, producer_id_expiration_ms)
    closed = [s for s in log.segments[:-1] if s.base_offset < found.first_uncleanable_offset]
    return CleanJob(
        directory=log.directory,
        directory_id=_identity(os.stat(log.directory)),
        config=log.config,
        now_ms=now_ms,
        first_dirty_offset=found.first_dirty_offset,
        first_uncleanable_offset=found.first_uncleanable_offset,
        cleanable_bytes=found.cleanable_bytes,
        segments=tuple(SourceSegment.of(segment) for segment in closed),
        active_producers=dict(active_producers),
        max_map_entries=max_map_entries,
        max_map_bytes=max_map_bytes,
    )


def clean(
    log: Log,
    first_dirty_offset: int | None,
    now_ms: int,
    *,
    last_stable_offset: int | None = None,
    max_map_entries: int | None = None,
    max_map_bytes: int | None = None,
    active_producers: Mapping[int, int] | None = None,
    producer_id_expiration_ms: int | None = None,
) -> CleanResult:
    """Compact what is cleanable in `log` now, in this thread: `plan_clean`, `compact`, then
    `swap_in` with its directory fsyncs done at once. The node does the same three steps with
    `compact` in a worker process and the fsyncs off its event loop."""
    job = plan_clean(
        log,
        first_dirty_offset,
        now_ms,
        last_stable_offset=last_stable_offset,
        max_map_entries=max_map_entries,
        max_map_bytes=max_map_bytes,
        active_producers=active_producers,
        producer_id_expiration_ms=producer_id_expiration_ms,
    )
    compaction = compact(job)
    retired: list[LogSegment] = []
    for directory in swap_in(log, compaction, now_ms, retired):
        fsync_dir(directory)
    return result_of(compaction, retired)


def result_of(compaction: Compaction, retired: list[LogSegment]) -> CleanResult:
    return CleanResult(
        compaction.first_dirty_offset,
        retired,
        compaction.bytes_before,
        compaction.bytes_after,
        compaction.records_read,
        compaction.records_removed,
    )


def compact(job: CleanJob) -> Compaction:
    """Build the offset map over the job's dirty range and write every group of segments that
    changes as `<base>.log.cleaned` (+ indexes), fsynced. Reads only the job's files, through
    a descriptor of the log's directory taken first: if the directory is renamed meanwhile (the
    topic is deleted), the files written go with it, never into a new log of the same name.
    Raises CorruptRecordError for a batch that cannot be decoded, OSError for I/O; either way
    no `.cleaned` file of this round is left behind."""
    if job.cleanable_bytes == 0:
        return Compaction(job.first_dirty_offset, (), 0, 0, 0, 0)
    dir_fd = os.open(job.directory, os.O_RDONLY | os.O_DIRECTORY)
    sources: list[_Source] = []
    try:
        if _identity(os.fstat(dir_fd)) != job.directory_id:
            raise CleaningAborted(f"{job.directory} is not the directory planned for")
        directory = Path(f"/proc/self/fd/{dir_fd}")
        sources = [_Source(directory, job.directory, segment) for segment in job.segments]
        return _compact(job, directory, sources)
    finally:
        for source in sources:
            source.close()
        os.close(dir_fd)


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


def _compact(job: CleanJob, directory: Path, sources: list[_Source]) -> Compaction:
    offset_map = _build_offset_map(sources, job)
    if offset_map.latest_offset < job.first_dirty_offset:
        # No batch at all in the dirty range: it is as clean as it gets.
        return Compaction(job.first_uncleanable_offset, (), 0, 0, 0, 0)
    end_offset = offset_map.latest_offset + 1
    count = sum(1 for source in sources if source.base_offset < end_offset)
    limit = sources[count].base_offset if count < len(sources) else job.first_uncleanable_offset
    delete_retention_ms = job.config.delete_retention_ms
    rewrite = _Rewrite(offset_map, job.now_ms, delete_retention_ms, job.active_producers, 0, 0)
    groups: list[CleanedGroup] = []
    before = after = 0
    try:
        for group in group_segments(sources[:count], limit, job.config):
            before += sum(source.size for source in group)
            size = _clean_group(directory, group, rewrite, job)
            after += sum(source.size for source in group) if size is None else size
            groups.append(CleanedGroup(tuple(s.base_offset for s in group), size))
    except BaseException:
        for done in groups:
            _remove_segment_files(directory, done.base_offsets[0], CLEANED_SUFFIX)
        raise
    return Compaction(
        end_offset, tuple(groups), before, after, rewrite.records_read, rewrite.records_removed
    )


def swap_in(
    log: Log, compaction: Compaction, now_ms: int, retired: list[LogSegment]
) -> Iterator[Path]:
    """Put the cleaned groups in place of their segments, one group at a time, as Kafka does:
    `.cleaned` → `.swap`, swapped in memory, old segments renamed `.deleted` (appended to
    `retired`), `.swap` → final names. Yields the log's directory whenever it must be fsynced
    before the next step; the caller fsyncs it (off its event loop if it likes) and resumes.

    Raises CleaningAborted, after removing what is left of the round's files, if the log no
    longer holds a group's segments (it was truncated, deleted or taken offline meanwhile)."""
    pending = [group for group in compaction.groups if group.cleaned_size is not None]
    for index, group in enumerate(pending):
        base = group.base_offsets[0]
        old = _segments_at(log, group.base_offsets)
        if old is None:
            for rest in pending[index:]:
                _remove_segment_files(log.directory, rest.base_offsets[0], CLEANED_SUFFIX)
            raise CleaningAborted(f"{log.directory.name}: segments changed while cleaning")
        for kind in (".log", ".index", ".timeindex"):
            cleaned = log.directory / segment_file_name(base, kind + CLEANED_SUFFIX)
            os.replace(
                cleaned, cleaned.with_name(cleaned.name.removesuffix(CLEANED_SUFFIX) + SWAP_SUFFIX)
            )
        yield log.directory
        if _segments_at(log, group.base_offsets) != old:
            # Nothing of this group is in place: a crash must not complete its swap.
            for rest in pending[index:]:
                for suffix in (SWAP_SUFFIX, CLEANED_SUFFIX):
                    _remove_segment_files(log.directory, rest.base_offsets[0], suffix)
            raise CleaningAborted(f"{log.directory.name}: segments changed while swapping")
        swapped = LogSegment(log.directory, base, log.config, now_ms, file_suffix=SWAP_SUFFIX)
        swapped.load_clean()
        log.replace_segments([swapped], old)
        for segment in old:
            segment.mark_deleted()
        retired.extend(old)
        swapped.change_file_suffix(SWAP_SUFFIX, "")
    if pending:
        yield log.directory


def _segments_at(log: Log, base_offsets: Sequence[int]) -> list[LogSegment] | None:
    """The closed segments of `log` with exactly these consecutive base offsets, if it holds
    them still."""
    segments = log.segments
    start = bisect.bisect_left([s.base_offset for s in segments], base_offsets[0])
    found = segments[start : start + len(base_offsets)]
    if start + len(base_offsets) >= len(segments):
        return None
    if [s.base_offset for s in found] != list(base_offsets) or any(s.closed for s in found):
        return None
    return found


class _Source:
    """A closed segment opened read-only by `compact`."""

    def __init__(self, directory: Path, shown: Path, segment: SourceSegment) -> None:
        self.base_offset = segment.base_offset
        self.size = segment.size
        self.offset_index_bytes = segment.offset_index_bytes
        self.time_index_bytes = segment.time_index_bytes
        self.log_path = shown / segment.file_name
        """For messages: the path under the log's directory as the broker names it."""
        self.fd = os.open(directory / segment.file_name, os.O_RDONLY)
        if os.fstat(self.fd).st_size < self.size:
            os.close(self.fd)
            raise CleaningAborted(f"{self.log_path} shrank while cleaning")

    def batches(self) -> Iterator[tuple[int, BatchHeader]]:
        return batch_headers(self.fd, self.size)

    def read_batch(self, position: int, header: BatchHeader) -> bytes:
        return os.pread(self.fd, header.size, position)

    def close(self) -> None:
        os.close(self.fd)


@dataclass(slots=True)
class _OffsetMap:
    keys: dict[bytes, int]
    latest_offset: int
    """The last offset the map accounts for: records after it are kept whatever their key."""


def _build_offset_map(sources: Sequence[_Source], job: CleanJob) -> _OffsetMap:
    """key → latest offset over the records in [first dirty, first uncleanable) of the
    closed segments, until the map is full."""
    start, end = job.first_dirty_offset, job.first_uncleanable_offset
    offset_map = _OffsetMap({}, -1)
    keys = offset_map.keys
    max_entries = job.max_map_entries
    budget = job.max_map_bytes
    used = 0
    for source in sources[_floor(sources, start) :]:
        if source.base_offset >= end:
            break
        for position, header in source.batches():
            if header.last_offset < start:
                continue
            if not (header.is_control or header.is_transactional):
                data = source.read_batch(position, header)
                for record in _records(data, source, position):
                    key = record.key
                    if key is None or record.offset < start:
                        continue
                    if key not in keys:
                        cost = len(key) + MAP_BYTES_PER_KEY
                        full = (max_entries is not None and len(keys) >= max_entries) or (
                            budget is not None and keys and used + cost > budget
                        )
                        if full:
                            # The map covers everything before this record; the rest stays dirty.
                            offset_map.latest_offset = record.offset - 1
                            return offset_map
                        used += cost
                    keys[key] = record.offset
            offset_map.latest_offset = header.last_offset
    return offset_map


def _records(data: bytes, segment: _Source, position: int) -> list[Record]:
    try:
        return list(iter_records(data))
    except MalformedInput as exc:
        raise CorruptRecordError(
            f"{segment.log_path} at byte {position}: cannot be compacted: {exc}"
        ) from exc


def _active_producers(log: Log, now_ms: int, expiration_ms: int) -> dict[int, int]:
    """producer id → last offset of its last data batch, for producers heard from within
    `expiration_ms`, from the log's producer state (Kafka's `activeProducers`), which the log
    keeps in step with its batches: no segment is read for it."""
    return {
        producer_id: entry.last_offset
        for producer_id, entry in log.producer_state.producers.items()
        if entry.batches and now_ms - entry.last_timestamp < expiration_ms
    }


@dataclass(slots=True)
class _Rewrite:
    """What a cleaning round does to each batch: Kafka's record filter."""

    offset_map: _OffsetMap
    now_ms: int
    delete_retention_ms: int
    active_producers: Mapping[int, int]
    records_read: int
    records_removed: int

    def batch(
        self, data: bytes, header: BatchHeader, segment: _Source, position: int
    ) -> bytes | None:
        """`data` itself if the batch stays as it is, a rebuilt batch, or None if it goes."""
        if header.is_control or header.is_transactional:
            return data
        horizon = header.base_timestamp if header.has_delete_horizon else None
        records = _records(data, segment, position)
        retained = [record for record in records if self._retains(record, horizon)]
        self.records_read += len(records)
        self.records_removed += len(records) - len(retained)
        if not retained:
            if not self._is_last_of_active_producer(header):
                return None
            return data if not records else _empty_batch(header)
        needs_horizon = horizon is None and any(record.value is None for record in retained)
        if len(retained) == len(records) and not needs_horizon:
            return data
        if needs_horizon:
            horizon = self.now_ms + self.delete_retention_ms
        return _rebuilt(header, retained, horizon)

    def _retains(self, record: Record, horizon: int | None) -> bool:
        if record.offset > self.offset_map.latest_offset:
            return True
        if record.key is None:
            return False
        if record.offset < self.offset_map.keys.get(record.key, -1):
            return False
        return record.value is not None or horizon is None or self.now_ms < horizon

    def _is_last_of_active_producer(self, header: BatchHeader) -> bool:
        return (
            header.producer_id >= 0
            and self.active_producers.get(header.producer_id) == header.last_offset
        )


def _rebuilt(header: BatchHeader, records: list[Record], horizon: int | None) -> bytes:
    data = build_batch(
        records,
        codec=header.codec,
        base_offset=header.base_offset,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=horizon,
        max_timestamp=header.max_timestamp if header.is_log_append_time else None,
        partition_leader_epoch=header.partition_leader_epoch,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        log_append_time=header.is_log_append_time,
    )
    return data if horizon is None else _with_delete_horizon_flag(data)


def _empty_batch(header: BatchHeader) -> bytes:
    """Kafka's `writeEmptyHeader`: the batch's offsets, producer and sequence, no records."""
    return build_batch(
        [],
        base_offset=header.base_offset,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.max_timestamp,
        max_timestamp=header.max_timestamp,
        partition_leader_epoch=header.partition_leader_epoch,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        log_append_time=header.is_log_append_time,
    )


def _with_delete_horizon_flag(data: bytes) -> bytes:
    """Set attribute bit 6 (the base timestamp is the delete horizon) and redo the CRC."""
    batch = bytearray(data)
    (attributes,) = _ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_AT)
    _ATTRIBUTES.pack_into(batch, _ATTRIBUTES_AT, attributes | _DELETE_HORIZON)
    crc = int(google_crc32c.value(bytes(batch[_ATTRIBUTES_AT:])))
    _CRC.pack_into(batch, _CRC_AT, crc)
    return bytes(batch)


def _clean_group(
    directory: Path, group: list[_Source], rewrite: _Rewrite, job: CleanJob
) -> int | None:
    """Clean `group` into `<base>.log.cleaned` (+ indexes), fsynced; its size, or None (and no
    file) if nothing would change."""
    base = group[0].base_offset
    _remove_segment_files(directory, base, CLEANED_SUFFIX)
    cleaned = LogSegment(directory, base, job.config, job.now_ms, file_suffix=CLEANED_SUFFIX)
    try:
        changed = len(group) > 1
        for source in group:
            changed = _clean_into(cleaned, source, rewrite) or changed
        if changed:
            cleaned.flush()
    except BaseException:
        cleaned.delete()
        raise
    if not changed:
        cleaned.delete()
        return None
    size = cleaned.size
    cleaned.close()
    return size


def _clean_into(dest: LogSegment, source: _Source, rewrite: _Rewrite) -> bool:
    """Append what survives of `source` to `dest`; True if anything changed."""
    changed = False
    chunk = bytearray()
    placed: list[tuple[int, BatchHeader]] = []
    for position, header in source.batches():
        data = source.read_batch(position, header)
        kept = rewrite.batch(data, header, source, position)
        if kept is not data:
            changed = True
        if kept is None:
            continue
        placed.append((len(chunk), header if kept is data else read_batch_header(kept)))
        chunk += kept
        if len(chunk) >= _WRITE_CHUNK_BYTES:
            _append(dest, chunk, placed)
            chunk, placed = bytearray(), []
    if placed:
        _append(dest, chunk, placed)
    return changed


def _append(dest: LogSegment, chunk: bytearray, placed: list[tuple[int, BatchHeader]]) -> None:
    with memoryview(chunk) as view:
        prefixes = [bytes(view[position : position + 16]) for position, _ in placed]
        dest.append(view, placed, prefixes)


def _remove_segment_files(directory: Path, base_offset: int, suffix: str) -> None:
    for kind in (".log", ".index", ".timeindex"):
        (directory / segment_file_name(base_offset, kind + suffix)).unlink(missing_ok=True)


# -- recovery --------------------------------------------------------------------------------


def complete_interrupted_swaps(directory: Path) -> list[Path]:
    """Finish a swap that a crash interrupted (Kafka's LogLoader), before the segments load.

    Every segment file (`.log`, `.index`, `.timeindex`) whose base offset lies between the
    lowest base offset and the highest next offset of the `.log.swap` files goes: those are
    the segments the swap replaces. Then the swap files lose their suffix. An index `.swap`
    without its `.log.swap` is discarded (its log was already renamed), so that index is
    rebuilt. Returns the completed `.log` files.
    """
    swaps: list[tuple[Path, int, str]] = []
    for path in directory.iterdir():
        if not path.name.endswith(SWAP_SUFFIX):
            continue
        match = _SEGMENT_FILE.match(path.name.removesuffix(SWAP_SUFFIX))
        if match is not None:
            swaps.append((path, int(match["base"]), match["kind"]))
    logs = {base: path for path, base, kind in swaps if kind == "log"}
    for path, base, kind in swaps:
        if kind != "log" and base not in logs:
            path.unlink()
    if not logs:
        return []
    low = min(logs)
    high = max(max(_next_offset(path, base), base + 1) for base, path in logs.items())
    for path in directory.iterdir():
        match = _SEGMENT_FILE.match(path.name)
        if match is not None and low <= int(match["base"]) < high:
            path.unlink()
    completed = []
    for path, base, _ in swaps:
        if base in logs:
            final = path.with_name(path.name.removesuffix(SWAP_SUFFIX))
            os.replace(path, final)
            if final.name.endswith(".log"):
                completed.append(final)
    fsync_dir(directory)
    return sorted(completed)


def _next_offset(path: Path, base_offset: int) -> int:
    """The offset after the last whole batch of a segment file, from its headers alone."""
    next_offset = base_offset
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position = 0
        while position + BATCH_HEADER_SIZE <= size:
            try:
                header = read_batch_header(os.pread(fd, BATCH_HEADER_SIZE, position))
            except MalformedInput:
                break
            if position + header.size > size:
                break
            next_offset = header.next_offset
            position += header.size
    finally:
        os.close(fd)
    return next_offset
