"""The log dirs of one broker: which partitions live where, and the work that spans them.

What it owns, per `log.dirs` entry as Kafka lays it out: the `.lock` that keeps a second
process out, the clean-shutdown marker (`.kafka_cleanshutdown`) that lets the next start skip
recovery, the `recovery-point-offset-checkpoint`, `log-start-offset-checkpoint` and
`replication-offset-checkpoint` (high watermarks) files, and
asynchronous deletion (segments renamed `.deleted`, partition directories renamed
`<topic>-<partition>.<id>-delete`, both removed `file.delete.delay.ms` later), and which
compacted log the cleaner takes next (`cleaner-offset-checkpoint`).

Each partition directory carries its topic id (`partition.metadata`, KIP-516). A log asked for
under a topic id other than its own belongs to an earlier topic of the same name (deleted and
created again while this node was away): it is a *stray*, renamed
`<topic>-<partition>.<id>-stray`, never served, and removed `file.delete.delay.ms` later, as
Kafka does; a new, empty log takes its place. `strays` counts them for the metrics.

Compaction is done in rounds, one log at a time, in three steps so that the slow one can run
elsewhere: `plan_cleaning` picks the filthiest log and fixes the round's work (a picklable
`CleanJob`; the log counts as being cleaned, so retention leaves its segments alone until
`end_cleaning`), `cleaner.compact(job)` writes the cleaned segments (the node runs it in a
worker process), and `swap_cleaned` puts them in place, yielding each time a directory must be
fsynced. A round that fails with anything but an I/O error marks its partition *uncleanable*
(`uncleanable`, as Kafka's cleaner does) so it is not retried on every round; an I/O error takes
the log dir offline.

Every `producer.id.expiration.check.interval.ms`, `tick` has each log forget the idempotent
producers idle for longer than `producer.id.expiration.ms`.

A partition whose log cannot be loaded is reported by name in `offline` and left alone; every
other partition still loads. Time is an argument (`now_ms`): `tick` is called by the server.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import logging
import os
import resource
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .checkpoints import CheckpointError, read_offset_checkpoint, write_offset_checkpoint
from .cleaner import (
    MAP_BYTES_PER_KEY,
    CleaningAborted,
    CleanJob,
    CleanResult,
    Compaction,
    compact,
    filthiest_log,
    plan_clean,
    read_cleaner_checkpoint,
    result_of,
    swap_in,
    write_cleaner_checkpoint,
)
from .config import LogConfig
from .errors import LogDirFailure, LogOffline, StorageError
from .files import fsync_dir
from .log import Log, parse_partition_dir
from .partition_metadata import read_topic_id, write_topic_id
from .producer_state import PRODUCER_ID_EXPIRATION_MS
from .segments import LogSegment

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "DEDUPE_BUFFER_SIZE",
    "CleaningRound",
    "LogManager",
    "TopicPartition",
    "delete_dir_name",
    "stray_dir_name",
]

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
LOCK_FILE = ".lock"
_CLOSING_THREADS = 8
"""Threads a clean shutdown closes the logs on."""
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_CHECKPOINT = "replication-offset-checkpoint"
"""Each partition's high watermark (Kafka's name and format), so that a restarted replica
serves what was committed before it stopped at once, not from its log start."""
DELETE_DIR_SUFFIX = "-delete"
STRAY_DIR_SUFFIX = "-stray"

TopicPartition = tuple[str, int]

DEDUPE_BUFFER_SIZE = 134_217_728
"""`log.cleaner.dedupe.buffer.size`: the memory a round's offset map may take (Kafka's 128 MiB;
the map holds about 1 million keys of 16 bytes in it)."""


MAX_FILE_NAME = 255
"""The longest file name Linux filesystems take (ext4, xfs: NAME_MAX)."""


def delete_dir_name(topic: str, partition: int, kind: str = DELETE_DIR_SUFFIX) -> str:
    """Where a deleted partition's directory is renamed until it is removed, as Kafka names it:
    `<topic>-<partition>.<uuid>-delete`, the topic cut short so the whole name stays within
    `MAX_FILE_NAME` (a legal 249-character topic would otherwise not fit)."""
    suffix = f"-{partition}.{uuid.uuid4().hex}{kind}"
    return topic[: MAX_FILE_NAME - len(suffix)] + suffix


def stray_dir_name(topic: str, partition: int) -> str:
    """Where a stray partition directory is renamed until it is removed (Kafka's
    `<topic>-<partition>.<uuid>-stray`)."""
    return delete_dir_name(topic, partition, STRAY_DIR_SUFFIX)


@dataclass(slots=True)
class CleaningRound:
    """A compaction round under way (`LogManager.plan_cleaning` → `end_cleaning`)."""

    key: TopicPartition
    log: Log
    job: CleanJob
    result: CleanResult | None = None
    """Set by `swap_cleaned` once every cleaned group is in place."""


@dataclass(slots=True)
class LoadProgress:
    """How many partition logs `LogManager.startup` has loaded (or tried: a log that fails
    goes offline) of how many, and the log dirs it recovers so far (no clean-shutdown marker
    or recovery-point checkpoint: each log's tail is read and checked)."""

    loaded: int = 0
    total: int = 0
    recovering: tuple[str, ...] = ()


def _partition_dirs(log_dir: Path, reserved: frozenset[str]) -> int:
    """How many partition directories `log_dir` holds for the manager to load (a quick count
    before loading them)."""
    try:
        children = list(log_dir.iterdir())
    except OSError:
        return 0
    count = 0
    for child in children:
        if child.name.endswith((DELETE_DIR_SUFFIX, STRAY_DIR_SUFFIX)) or not child.is_dir():
            continue
        try:
            topic, _ = parse_partition_dir(child.name)
        except ValueError:
            continue
        count += topic not in reserved
    return count


@dataclass
class _PendingDeletion:
    due_ms: int
    segments: list[LogSegment] = field(default_factory=list)
    directory: Path | None = None
    source: Log | None = None
    """The deleted log whose `directory` this is."""


class LogManager:
    def __init__(
        self,
        log_dirs: list[Path],
        default_config: LogConfig,
        *,
        checkpoint_interval_ms: int = 60_000,
        producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
        producer_id_expiration_check_interval_ms: int = 600_000,
        retention_check_interval_ms: int = 300_000,
        dedupe_buffer_size: int = DEDUPE_BUFFER_SIZE,
        background_flush: bool = False,
    ) -> None:
        """`checkpoint_interval_ms`: how often `tick` writes the recovery-point and log-start
        checkpoints (Kafka's `log.flush.offset.checkpoint.interval.ms`, 1 minute).
        `producer_id_expiration_ms`: Kafka's `producer.id.expiration.ms` (1 day), how long a
        partition keeps an idle producer's state; `producer_id_expiration_check_interval_ms`:
        Kafka's `producer.id.expiration.check.interval.ms` (10 minutes), how often `tick`
        looks for them. `retention_check_interval_ms`: Kafka's
        `log.retention.check.interval.ms` (5 minutes), how often `tick` applies retention.
        `dedupe_buffer_size`: `log.cleaner.dedupe.buffer.size`, the bytes a round's offset map
        may take. `background_flush`: fsync rolled segments on a thread of the manager's own
        (the node's choice, so a roll never waits for the disk; tests keep them inline)."""
        if not log_dirs:
            raise ValueError("at least one log dir is required (log.dirs)")
        self.log_dirs = [Path(d) for d in log_dirs]
        self.default_config = default_config
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.producer_id_expiration_check_interval_ms = producer_id_expiration_check_interval_ms
        self.retention_check_interval_ms = retention_check_interval_ms
        self._last_retention_ms = 0
        self.logs: dict[TopicPartition, Log] = {}
        self.offline: dict[TopicPartition, str] = {}
        self.offline_dirs: dict[Path, str] = {}
        self._dir_of: dict[TopicPartition, Path] = {}
        self._logs_in: collections.Counter[Path] = collections.Counter()
        """How many partitions each log dir holds (`_dir_of`, counted)."""
        self._planned: set[TopicPartition] = set()
        """Logs `plan_log` placed that are not created yet."""
        self._locks: list[TextIO] = []
        self._pending: list[_PendingDeletion] = []
        self._last_checkpoint_ms = 0
        self._last_producer_expiration_ms = 0
        self._first_dirty: dict[TopicPartition, int] = {}
        self.dedupe_buffer_size = max(dedupe_buffer_size, MAP_BYTES_PER_KEY)
        self.uncleanable: dict[TopicPartition, str] = {}
        """Partitions the cleaner gave up on, and why (Kafka's uncleanable partitions): left
        out of compaction until the partition is recreated or the node restarts."""
        self.cleaning: CleaningRound | None = None
        self.loading = LoadProgress()
        """How far `startup` has got (read from other threads: the node's `/v1/state`)."""
        self._flusher = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-flush")
            if background_flush
            else None
        )
        self._deleter = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-delete")
            if background_flush
            else None
        )
        """Where retired files are removed: a thread of its own, so that a checkpoint a
        DeleteRecords waits for never queues behind the unlink of a large segment."""
        self._checkpoint_writes: list[tuple[Future[None], Path]] = []
        self._locked: set[Path] = set()
        self._fd_estimate = len(os.listdir("/proc/self/fd"))
        """Descriptors open in this process, give or take the ones opened since the last
        count (see `_check_descriptors`)."""
        self.reserved_topics: frozenset[str] = frozenset({"__cluster_metadata"})
        """Partition dirs that are not this manager's to load (the metadata log's own)."""
        self.strays = 0
        self.clean_shutdown_epochs: dict[Path, int | None] = {}
        """What each dir's clean-shutdown marker said at start: the broker epoch of the clean
        stop it was left by (-1 if it named none), None if there was no marker (a crash, or
        a dir formatted since: a replaced disk)."""
        """Partition directories found not to belong to the metadata and set aside."""

    # -- startup and shutdown ---------------------------------------------------------------

    def lock(self) -> None:
        """Take every log dir's `.lock` (fatal if another process holds one), before anything
        in the dirs is read — the metadata log is read before the partitions are loaded."""
        for log_dir in self.log_dirs:
            if log_dir in self._locked:
                continue
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                self._lock(log_dir)
            except OSError as exc:
                self.offline_dirs[log_dir] = f"{type(exc).__name__}: {exc}"

    def unlock(self) -> None:
        """Let go of the log dirs without touching what is in them: a node that stops before
        it loaded its logs must not write their checkpoints or a clean-shutdown marker."""
        for handle in self._locks:
            handle.close()
        self._locks.clear()
        self._locked.clear()

    def startup(self, now_ms: int, configs: dict[str, LogConfig] | None = None) -> None:
        """Lock and load every log dir; `configs` holds per-topic overrides."""
        configs = configs or {}
        self.lock()
        online = [d for d in self.log_dirs if d not in self.offline_dirs]
        self.loading = LoadProgress(
            total=sum(_partition_dirs(d, self.reserved_topics) for d in online)
        )
        for log_dir in online:
            try:
                self._load_dir(log_dir, now_ms, configs)
            except OSError as exc:
                self.offline_dirs[log_dir] = f"{type(exc).__name__}: {exc}"
        self._last_checkpoint_ms = now_ms
        self._last_producer_expiration_ms = now_ms
        self._last_retention_ms = now_ms

    def _load_dir(self, log_dir: Path, now_ms: int, configs: dict[str, LogConfig]) -> None:
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        self.clean_shutdown_epochs[log_dir] = _marked_epoch(marker)
        found = _read_checkpoints(log_dir)
        clean = marker.exists() and found.recovery_points is not None
        if not clean:
            self.loading.recovering += (str(log_dir),)
        recovery_points = found.recovery_points or {}
        start_offsets, high_watermarks = found.start_offsets, found.high_watermarks
        first_dirty = found.first_dirty
        for child in sorted(log_dir.iterdir()):
            if not child.is_dir():
                continue
            if child.name.endswith(DELETE_DIR_SUFFIX):
                shutil.rmtree(child, ignore_errors=True)
                continue
            if child.name.endswith(STRAY_DIR_SUFFIX):
                # Set aside before a restart: still removed only after the delay.
                due = now_ms + self.default_config.file_delete_delay_ms
                self._pending.append(_PendingDeletion(due, directory=child))
                continue
            try:
                key = parse_partition_dir(child.name)
            except ValueError:
                continue
            if key[0] in self.reserved_topics:
                continue
            self.loading.loaded += 1  # counted once tried: an offline log is not tried again
            if key in self.logs:
                self.offline[key] = f"also found in {self._dir_of[key]}; refusing {child}"
                logger.error("partition %s-%d is offline: %s", *key, self.offline[key])
                continue
            try:
                self._check_descriptors()
                log = Log(
                    child,
                    configs.get(key[0], self.default_config),
                    now_ms=now_ms,
                    clean_shutdown=clean,
                    recovery_point=recovery_points.get(key, 0),
                    log_start_offset=start_offsets.get(key, 0),
                    high_watermark=high_watermarks.get(key, 0),
                    producer_id_expiration_ms=self.producer_id_expiration_ms,
                )
                log.topic_id = read_topic_id(child)
            except Exception as exc:  # any failure takes this partition alone offline
                self.offline[key] = f"{child}: {type(exc).__name__}: {exc}"
                logger.error(
                    "partition %s-%d cannot be loaded and is offline (its clients get "
                    "KAFKA_STORAGE_ERROR): %s",
                    *key,
                    self.offline[key],
                )
                continue
            self.adopt_log(log)
            if key in first_dirty:
                self._first_dirty[key] = first_dirty[key]
        # The marker is only true for the start right after a clean stop.
        marker.unlink(missing_ok=True)
        self._write_checkpoints(log_dir)

    def _lock(self, log_dir: Path) -> None:
        handle = open(log_dir / LOCK_FILE, "a")  # noqa: SIM115 - held until shutdown
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise StorageError(
                f"log dir {log_dir} is in use by another process (its {LOCK_FILE} is locked)"
            ) from None
        self._locks.append(handle)
        self._locked.add(log_dir)

    @property
    def previous_broker_epoch(self) -> int:
        """The broker epoch of the clean stop every online dir's marker names (KIP-966's
        previous broker epoch), else -1: this node crashed, or one of its dirs is new."""
        epochs = {
            self.clean_shutdown_epochs.get(d) for d in self.log_dirs if d not in self.offline_dirs
        }
        if len(epochs) != 1:
            return -1
        (epoch,) = epochs
        return -1 if epoch is None else epoch

    def shutdown(self, now_ms: int, *, broker_epoch: int = -1) -> None:
        """Clean shutdown: flush and close every log, checkpoint, and leave the marker that
        lets the next start skip recovery, naming `broker_epoch` (Kafka's format:
        `{"version":0,"brokerEpoch":N}`), which the next registration tells the controller."""
        unclean: set[Path] = set()
        if self._flusher is not None:
            self._flusher.shutdown(wait=True)  # the rolled segments' fsyncs finish first
            self._flusher = None
            for log in self.logs.values():
                try:
                    log.complete_flushes()
                except LogDirFailure as exc:
                    # A write that failed at the end (a leader-epoch checkpoint on a full
                    # disk): no clean-shutdown marker, so the next start recovers this dir.
                    logger.error("%s; %s is not shut down cleanly", exc, log.directory.parent)
                    unclean.add(log.directory.parent)
        if self._deleter is not None:
            self._deleter.shutdown(wait=True)
            self._deleter = None
        # Their fsyncs side by side, which the disk commits together (Kafka closes its logs
        # on `num.recovery.threads.per.data.dir` threads): ten thousand logs close in
        # seconds, not in ten thousand fsyncs one after another.
        with ThreadPoolExecutor(_CLOSING_THREADS, thread_name_prefix="close-logs") as closing:
            for _ in closing.map(lambda log: log.close(now_ms), list(self.logs.values())):
                pass
        for pending in self._pending:
            self._finish_deletion(pending)
        self._pending.clear()
        for log_dir in self.log_dirs:
            if log_dir in self.offline_dirs:
                continue
            self._write_checkpoints(log_dir)
            if log_dir in unclean:
                continue
            (log_dir / CLEAN_SHUTDOWN_FILE).write_text(
                json.dumps({"version": 0, "brokerEpoch": broker_epoch}) + "\n"
            )
        self.unlock()
        self.logs.clear()

    # -- partitions -------------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log:
        key = (topic, partition)
        if key in self.offline:
            raise LogOffline(f"{topic}-{partition} is offline: {self.offline[key]}")
        return self.logs[key]

    def __iter__(self) -> Iterator[tuple[TopicPartition, Log]]:
        return iter(list(self.logs.items()))

    def create_log(
        self,
        topic: str,
        partition: int,
        now_ms: int,
        config: LogConfig | None = None,
        *,
        topic_id: uuid.UUID | None = None,
    ) -> Log:
        """Create (or return) a partition's log, in the online log dir holding fewest logs.
        With a `topic_id`, a log on disk is returned only if it was created for that topic:
        one of another topic of the same name is set aside as a stray (`mark_stray`) and a new
        log created; one from before topic ids takes the id."""
        found = self.plan_log(topic, partition, now_ms, topic_id=topic_id)
        if isinstance(found, Log):
            return found
        try:
            log = open_new_log(
                found,
                config or self.default_config,
                now_ms,
                topic_id=topic_id,
                producer_id_expiration_ms=self.producer_id_expiration_ms,
            )
        except BaseException:
            self.drop_plan(topic, partition)
            raise
        self.adopt_log(log)
        return log

    def plan_log(
        self, topic: str, partition: int, now_ms: int, *, topic_id: uuid.UUID | None = None
    ) -> Log | Path:
        """`create_log`'s first step, on the caller's thread: the partition's log if it has
        one (of this topic id), else the directory a new one goes to, counted in its log dir
        from now on (`open_new_log` creates it, anywhere; then `adopt_log` takes it in, or
        `drop_plan` forgets it, on the caller's thread again). Raises as `create_log`
        does."""
        key = (topic, partition)
        existing = self.logs.get(key)
        if existing is not None and topic_id is not None and existing.topic_id != topic_id:
            if existing.topic_id is None:
                write_topic_id(existing.directory, topic_id)
                existing.topic_id = topic_id
            else:
                self.mark_stray(
                    topic,
                    partition,
                    now_ms,
                    f"it holds topic id {existing.topic_id}, the metadata's is {topic_id}",
                )
                existing = None
        if existing is not None:
            return existing
        if key in self.offline:
            raise LogOffline(f"{topic}-{partition} is offline: {self.offline[key]}")
        online = [d for d in self.log_dirs if d not in self.offline_dirs]
        if not online:
            raise StorageError("every log dir is offline")
        reserved = self._dir_of.get(key) if key in self._planned else None
        if reserved in online:  # planned before and not created yet: counted already
            assert reserved is not None
            return reserved / f"{topic}-{partition}"
        log_dir = min(online, key=lambda d: self._logs_in[d])
        self._check_descriptors()
        self._place(key, log_dir)
        self._planned.add(key)
        return log_dir / f"{topic}-{partition}"

    def adopt_log(self, log: Log) -> None:
        """Take in a log `open_new_log` created where `plan_log` said."""
        key = (log.topic, log.partition)
        log.flusher = self._flusher
        log.producer_state.remove_later = self._remove_later
        self.logs[key] = log
        self._place(key, log.directory.parent)
        self._planned.discard(key)
        self._fd_estimate += len(log.segments)

    def drop_plan(self, topic: str, partition: int) -> None:
        """Forget a `plan_log` whose log was not created."""
        key = (topic, partition)
        if key in self._planned:
            self._planned.discard(key)
            self._unplace(key)

    def _place(self, key: TopicPartition, log_dir: Path) -> None:
        previous = self._dir_of.get(key)
        if previous is not None:
            self._logs_in[previous] -= 1
        self._dir_of[key] = log_dir
        self._logs_in[log_dir] += 1

    def _unplace(self, key: TopicPartition) -> Path:
        log_dir = self._dir_of.pop(key)
        self._logs_in[log_dir] -= 1
        return log_dir

    def _check_descriptors(self) -> None:
        """Refuse to open another log when it would leave fewer than a tenth of the process's
        descriptors (at least 64) for connections, imports and the metadata log: a partition
        then stays offline, naming the limit to raise, instead of the whole node failing on
        its next accept. Counted exactly (/proc/self/fd) only near the limit."""
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            return
        reserve = max(64, limit // 10)
        if self._fd_estimate + 2 * reserve < limit:
            self._fd_estimate += 1
            return
        # Each log planned and not created yet opens at least one.
        self._fd_estimate = len(os.listdir("/proc/self/fd")) + len(self._planned)
        if self._fd_estimate + reserve >= limit:
            raise StorageError(
                f"out of file descriptors: {self._fd_estimate} of {limit} are open and "
                f"{reserve} are kept for connections; raise the open-files limit "
                "(ulimit -n, LimitNOFILE)"
            )

    def delete_log(self, topic: str, partition: int, now_ms: int, *, stray: bool = False) -> None:
        """Take a partition away now and remove its files after `file.delete.delay.ms`
        (`stray`: renamed `-stray` rather than `-delete`, see `mark_stray`)."""
        key = (topic, partition)
        log = self.logs.pop(key, None)
        self.offline.pop(key, None)
        if log is None:
            return
        log.close(now_ms)
        name = stray_dir_name(topic, partition) if stray else delete_dir_name(topic, partition)
        target = log.directory.with_name(name)
        os.replace(log.directory, target)
        self._pending.append(
            _PendingDeletion(now_ms + log.config.file_delete_delay_ms, directory=target, source=log)
        )
        self._first_dirty.pop(key, None)
        self.uncleanable.pop(key, None)
        log_dir = self._unplace(key)
        self._write_checkpoints(log_dir)

    def mark_stray(self, topic: str, partition: int, now_ms: int, reason: str) -> None:
        """A log on disk that the metadata does not assign here under its topic id (a topic
        deleted while this node was away, or deleted and created again): never served, renamed
        `-stray` and removed after `file.delete.delay.ms`, with a warning and a count."""
        log = self.logs.get((topic, partition))
        if log is None:
            return
        logger.warning(
            "%s is a stray log of %s-%d (%s): set aside, never served, removed after %d ms",
            log.directory,
            topic,
            partition,
            reason,
            log.config.file_delete_delay_ms,
        )
        self.strays += 1
        self.delete_log(topic, partition, now_ms, stray=True)

    def fail_dir_of(self, topic: str, partition: int, reason: str) -> list[TopicPartition]:
        """An I/O error hit a partition's log: take its whole log dir offline, as Kafka's
        log-dir failure handling does. Every partition there answers KAFKA_STORAGE_ERROR
        (`offline`), its logs are closed as far as the disk allows, and the dir is left
        without checkpoints or a clean-shutdown marker, so its next load recovers from the
        last fsync. Returns the partitions taken offline."""
        log_dir = self._dir_of.get((topic, partition))
        if log_dir is None:
            return []
        self.offline_dirs.setdefault(log_dir, reason)
        failed = [key for key, d in self._dir_of.items() if d == log_dir and key in self.logs]
        for key in failed:
            log = self.logs.pop(key)
            self.offline[key] = f"log dir {log_dir} failed: {reason}"
            self._first_dirty.pop(key, None)
            for segment in log.segments:
                with contextlib.suppress(OSError):
                    segment.close()
        logger.error(
            "log dir %s is offline (%s): its %d partitions answer KAFKA_STORAGE_ERROR until the "
            "node restarts with the disk repaired",
            log_dir,
            reason,
            len(failed),
        )
        return failed

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """DeleteRecords: advance the log start offset and checkpoint it at once, so that the
        deleted records stay deleted across a crash."""
        new_start = self.get_log(topic, partition).delete_records(offset)
        self._write_checkpoints(self._dir_of[(topic, partition)])
        return new_start

    def log_dir_of(self, topic: str, partition: int) -> Path:
        return self._dir_of[(topic, partition)]

    # -- periodic work ----------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Retention, time-based flushes, producer expiration, deferred deletions and
        checkpoints that are due."""
        expire_producers = (
            now_ms - self._last_producer_expiration_ms
            >= self.producer_id_expiration_check_interval_ms
        )
        apply_retention = now_ms - self._last_retention_ms >= self.retention_check_interval_ms
        if apply_retention:
            self._last_retention_ms = now_ms
        self._complete_checkpoints()
        cleaning = None if self.cleaning is None else self.cleaning.key
        for key, log in self:
            try:
                log.complete_flushes()
                # As in Kafka, retention waits for a round in progress on the same log.
                retain = apply_retention and key != cleaning
                doomed = log.delete_old_segments(now_ms) if retain else []
                if doomed:
                    self.retire(doomed, now_ms + log.config.file_delete_delay_ms)
                log.maybe_flush(now_ms)
                if expire_producers:
                    log.remove_expired_producers(now_ms)
            except (OSError, LogDirFailure) as exc:
                self.fail_dir_of(*key, f"{type(exc).__name__}: {exc}")
        if expire_producers:
            self._last_producer_expiration_ms = now_ms
        # A deleted log's directory outlives a round still reading it: its inode then cannot
        # be reused by a new log of the same name before the round has ended.
        in_use = None if self.cleaning is None else self.cleaning.log
        due = [
            p
            for p in self._pending
            if p.due_ms <= now_ms and (in_use is None or p.source is not in_use)
        ]
        for pending in due:
            self._finish_deletion(pending)
            self._pending.remove(pending)
        if now_ms - self._last_checkpoint_ms >= self.checkpoint_interval_ms:
            self.checkpoint()
            self._last_checkpoint_ms = now_ms

    def clean_filthiest(
        self, now_ms: int, *, high_watermarks: dict[TopicPartition, int] | None = None
    ) -> tuple[TopicPartition, CleanResult] | None:
        """One whole compaction round in this thread (tests, tools): `plan_cleaning`,
        `compact`, `swap_cleaned`. None if no log needs cleaning or the round failed."""
        round_ = self.plan_cleaning(now_ms, high_watermarks=high_watermarks)
        if round_ is None:
            return None
        try:
            for directory in self.swap_cleaned(round_, compact(round_.job), now_ms):
                fsync_dir(directory)
        except Exception as exc:
            self.cleaning_failed(round_, exc)
        finally:
            self.end_cleaning(round_)
        return None if round_.result is None else (round_.key, round_.result)

    def plan_cleaning(
        self, now_ms: int, *, high_watermarks: dict[TopicPartition, int] | None = None
    ) -> CleaningRound | None:
        """Start a round on the compacted log that needs it most (Kafka's
        `grabFilthiestCompactedLog`), uncleanable partitions aside; None if none does or a
        round is under way. `high_watermarks` bounds what may be cleaned (never past what
        consumers may read)."""
        if self.cleaning is not None:
            return None
        candidates = {k: log for k, log in self.logs.items() if k not in self.uncleanable}
        chosen = filthiest_log(
            candidates, self._first_dirty, now_ms, last_stable_offsets=high_watermarks
        )
        if chosen is None:
            return None
        key, _ = chosen
        log = self.logs[key]
        job = plan_clean(
            log,
            self._first_dirty.get(key),
            now_ms,
            last_stable_offset=None if high_watermarks is None else high_watermarks.get(key),
            max_map_bytes=self.dedupe_buffer_size,
        )
        self.cleaning = CleaningRound(key, log, job)
        return self.cleaning

    def swap_cleaned(
        self, round_: CleaningRound, compaction: Compaction, now_ms: int
    ) -> Iterator[Path]:
        """Put a round's cleaned segments in place (`cleaner.swap_in`), yielding each
        directory to fsync before going on, then record the new cleaner checkpoint. Raises
        CleaningAborted if the log was deleted or changed meanwhile."""
        key, log = round_.key, round_.log
        if self.logs.get(key) is not log:
            raise CleaningAborted(f"{key[0]}-{key[1]} went away while it was cleaned")
        retired: list[LogSegment] = []
        try:
            yield from swap_in(log, compaction, now_ms, retired)
        finally:
            if retired:
                self.retire(retired, now_ms + log.config.file_delete_delay_ms)
        if self.logs.get(key) is not log:
            raise CleaningAborted(f"{key[0]}-{key[1]} went away while it was cleaned")
        self._first_dirty[key] = compaction.first_dirty_offset
        self._write_checkpoints(self._dir_of[key], wait=False)
        round_.result = result_of(compaction, retired)

    def cleaning_failed(self, round_: CleaningRound, exc: BaseException) -> None:
        """A round that failed, as Kafka's cleaner takes it: an aborted round is let go; an I/O
        error takes the log dir offline; anything else (a batch that cannot be decoded, a
        worker that died on it twice) marks the partition uncleanable, named in the log."""
        key = round_.key
        if isinstance(exc, CleaningAborted):
            logger.info("cleaning of %s-%d aborted: %s", *key, exc)
        elif isinstance(exc, (OSError, LogDirFailure)):
            if self.logs.get(key) is round_.log:
                self.fail_dir_of(*key, f"cleaning failed: {type(exc).__name__}: {exc}")
        else:
            self.uncleanable[key] = f"{type(exc).__name__}: {exc}"
            logger.error(
                "%s-%d is uncleanable and left out of compaction until the node restarts: %s",
                *key,
                self.uncleanable[key],
            )

    def end_cleaning(self, round_: CleaningRound) -> None:
        if self.cleaning is round_:
            self.cleaning = None

    def retire(self, segments: list[LogSegment], due_ms: int) -> None:
        """Segments already marked `.deleted`, to close and remove at `due_ms`."""
        self._pending.append(_PendingDeletion(due_ms, segments=list(segments)))

    @property
    def pending_deletions(self) -> int:
        return sum(len(p.segments) + (p.directory is not None) for p in self._pending)

    def _remove_later(self, paths: list[Path]) -> None:
        """Remove files no longer needed on the deletion thread (at once without one)."""
        if self._deleter is None:
            for path in paths:
                path.unlink(missing_ok=True)
            return
        self._deleter.submit(_remove_quietly, paths)

    def _finish_deletion(self, pending: _PendingDeletion) -> None:
        """Close the segments now and remove their files, on the deletion thread when there is
        one: unlinking a large file waits for the filesystem to free its blocks, 100 ms and
        more while the disk is busy writing back (Kafka deletes on its scheduler's thread)."""
        paths = [path for segment in pending.segments for path in segment.close_for_deletion()]
        directory = pending.directory

        def remove() -> None:
            _remove_quietly(paths)
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)

        if self._deleter is None:
            remove()
        else:
            self._deleter.submit(remove)

    def checkpoint(self) -> None:
        """Write every online log dir's checkpoints, on the flush thread when there is one (the
        caller does not wait; a write that fails takes its dir offline at the next `tick`)."""
        for log_dir in self.log_dirs:
            if log_dir in self.offline_dirs:
                continue
            try:
                self._write_checkpoints(log_dir, wait=False)
            except OSError as exc:
                self._checkpoint_failed(log_dir, exc)

    def _checkpoint_failed(self, log_dir: Path, exc: BaseException) -> None:
        any_key = next((k for k, d in self._dir_of.items() if d == log_dir), None)
        if any_key is None:
            self.offline_dirs[log_dir] = f"checkpoint failed: {exc}"
        else:
            self.fail_dir_of(*any_key, f"checkpoint failed: {exc}")

    def _complete_checkpoints(self) -> None:
        pending = []
        for write, log_dir in self._checkpoint_writes:
            if not write.done():
                pending.append((write, log_dir))
            elif (error := write.exception()) is not None and log_dir not in self.offline_dirs:
                self._checkpoint_failed(log_dir, error)
        self._checkpoint_writes = pending

    def _write_checkpoints(self, log_dir: Path, *, wait: bool = True) -> None:
        """The dir's recovery-point, log-start and cleaner checkpoints as of now. With a flush
        thread, they are written there, in order with every other write of the dir (so an
        older one never lands after a newer one); `wait` for it when the caller's answer
        depends on it being on disk."""
        logs = {tp: log for tp, log in self.logs.items() if self._dir_of.get(tp) == log_dir}
        recovery = {tp: log.recovery_point for tp, log in logs.items()}
        starts = {tp: log.log_start_offset for tp, log in logs.items()}
        high_watermarks = {
            tp: log.loaded_high_watermark if log.committed is None else log.committed()
            for tp, log in logs.items()
        }
        dirty = {tp: offset for tp, offset in self._first_dirty.items() if tp in logs}

        def write() -> None:
            write_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT, recovery)
            write_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT, starts)
            write_offset_checkpoint(log_dir / REPLICATION_CHECKPOINT, high_watermarks)
            write_cleaner_checkpoint(log_dir, dirty)

        if self._flusher is None:
            write()
            return
        done = self._flusher.submit(write)
        if wait:
            done.result()
        else:
            self._checkpoint_writes.append((done, log_dir))


@dataclass(frozen=True, slots=True)
class _Checkpoints:
    recovery_points: dict[TopicPartition, int] | None
    """None: unreadable, so every log of the dir recovers from its start."""
    start_offsets: dict[TopicPartition, int]
    high_watermarks: dict[TopicPartition, int]
    first_dirty: dict[TopicPartition, int]


def open_new_log(
    directory: Path,
    config: LogConfig,
    now_ms: int,
    *,
    topic_id: uuid.UUID | None,
    producer_id_expiration_ms: int,
) -> Log:
    """A new, empty log in `directory` with its `partition.metadata` on disk: the part of
    creating a log that waits for the disk, safe on any thread (it touches no manager)."""
    log = Log(directory, config, now_ms=now_ms, producer_id_expiration_ms=producer_id_expiration_ms)
    if topic_id is not None:
        write_topic_id(log.directory, topic_id)
        log.topic_id = topic_id
    return log


def _read_checkpoints(log_dir: Path) -> _Checkpoints:
    """A log dir's checkpoints; one that cannot be read counts as empty, as in Kafka."""
    recovery_points: dict[TopicPartition, int] | None
    try:
        recovery_points = read_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT)
    except CheckpointError as exc:
        logger.warning("%s; recovering every log in %s from its start", exc, log_dir)
        recovery_points = None
    try:
        start_offsets = read_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT)
    except CheckpointError as exc:
        logger.warning("%s; log start offsets fall back to each log's first segment", exc)
        start_offsets = {}
    try:
        high_watermarks = read_offset_checkpoint(log_dir / REPLICATION_CHECKPOINT)
    except CheckpointError as exc:
        logger.warning("%s; high watermarks start at each log's start", exc)
        high_watermarks = {}
    try:
        first_dirty = read_cleaner_checkpoint(log_dir)
    except CheckpointError as exc:
        logger.warning("%s; the cleaner starts over on every compacted log", exc)
        first_dirty = {}
    return _Checkpoints(recovery_points, start_offsets, high_watermarks, first_dirty)


def _marked_epoch(marker: Path) -> int | None:
    """The broker epoch a clean-shutdown marker names; -1 if it names none (an older
    marker, or a node that was not a registered broker), None if there is no marker."""
    try:
        text = marker.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return -1
    try:
        epoch = json.loads(text).get("brokerEpoch", -1)
    except (ValueError, AttributeError):
        return -1
    return epoch if isinstance(epoch, int) else -1


def _remove_quietly(paths: list[Path]) -> None:
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("could not remove %s: %s", path, exc)
