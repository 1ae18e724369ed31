"""The replica manager: the partitions this node hosts, and appends, reads and offsets on them.

It follows the metadata image (a partition assigned to this node gets a log; a deleted topic
loses its logs; changed configs reach the logs) and ties together the rules that live in the
modules named for them:

- `partition`: a hosted replica (`Partition`), its high watermark, and what operations answer;
- `hosted`: the partitions by topic and index, their lookup, and the fetches waiting on them;
- `appends`: produce appends, and storage errors mapped to Kafka error codes;
- `leader`: the followers as the leader sees them: the ISR, the high watermark, acks=all;
- `follower`: what this node follows, and its appends of what its leaders sent;
- `offsets`: consumer reads, ListOffsets and DeleteRecords.

The high watermark is the offset every in-sync replica has; with this node the only replica,
as on a single node, it is the log end offset. Consumers never read past it.

What it must never do: decode requests or touch sockets (the handlers do), or decide a
partition's leader or ISR (the controller does: this node follows its metadata).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from broker.metadata import (
    TOPIC_RESOURCE,
    ConfigChanged,
    MetadataImage,
    PartitionChanged,
    TopicRemoved,
)
from broker.metadata.image import Change
from broker.storage import Log, LogConfig, LogManager, StorageError, open_new_log

from .appends import Appends
from .follower import FollowerReplication
from .leader import LeaderReplication
from .offsets import Offsets
from .partition import Partition, TopicPartition
from .quota import ReplicationQuota

__all__ = ["ReplicaManager"]

_Job = tuple[TopicPartition, Path, LogConfig, uuid.UUID, int]
"""A log to create: its partition, directory, config, topic id and (if led here) epoch."""
_CREATE_AT_ONCE = 16
"""New logs a turn of the event loop creates at once before the rest go to the background."""
_CREATE_BATCH = 512
"""New logs created per round (`ReplicaManager.create_in_background`)."""
_CREATE_THREADS = 2
"""Threads a round's logs are created on: mostly waiting for their fsyncs, which the disk
commits together (more would take more turns at the interpreter from the event loop)."""
_TAKE_IN_SLICE_S = 0.005
"""How long the created logs are taken in before the event loop serves others."""

log = logging.getLogger(__name__)


class ReplicaManager(FollowerReplication, Appends, LeaderReplication, Offsets):
    def __init__(
        self,
        node_id: int,
        logs: LogManager,
        image: MetadataImage,
        log_config: Callable[[str], LogConfig],
        clock: Callable[[], int],
        *,
        steady_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
        create_in_background: bool = False,
    ) -> None:
        """Sets the fields `hosted`, `leader`, `appends` and `follower` declare (their
        docstrings there say what each is for)."""
        self.node_id = node_id
        self.logs = logs
        self.image = image
        self._log_config = log_config
        self._clock = clock
        self.partitions = {}
        self._waiters = {}
        self._watchers = {}
        self._appending = {}
        self._finishing = set()
        self._replicated = {}
        self._trimmed = {}
        self.on_append = None
        self.on_role_change = None
        self._roles_update = None
        self.on_isr_change = None
        self.min_insync_replicas = lambda topic: int(
            self._topic_setting(topic, "min.insync.replicas", "1")
        )
        self.replica_lag_time_max_ms = 30_000
        self._steady = steady_ms
        self.leader_quota = ReplicationQuota()
        self.follower_quota = ReplicationQuota()
        self.create_in_background = create_in_background
        """Create new partitions' logs on a thread, in batches (the node's choice: creating
        thousands at once takes seconds of directories and fsyncs, which must not stall the
        event loop). Until its log exists a new partition answers NOT_LEADER_OR_FOLLOWER,
        as one whose leader has not taken over yet. Off (tests): created at once."""
        self._creating: dict[TopicPartition, PartitionChanged | None] = {}
        """Partitions whose logs are being created in the background, with the newest change
        that reached them meanwhile (None: no longer hosted here)."""
        self._creator: asyncio.Task[None] | None = None
        self._created_this_turn = 0
        """Logs created at once in this turn of the event loop (`_in_background`)."""
        self._created: dict[TopicPartition, list[asyncio.Future[None]]] = {}
        """Who waits for a partition's log to be created (`wait_created`)."""
        self._closing = False

    def apply(self, change: Change) -> None:
        if isinstance(change, PartitionChanged):
            self._partition_changed(change)
        elif isinstance(change, TopicRemoved):
            for index in change.topic.partitions:
                if (change.topic.name, index) in self._creating:
                    self._creating[(change.topic.name, index)] = None
                self.partitions.pop((change.topic.name, index), None)
                self._delete_log((change.topic.name, index))
                self._wake((change.topic.name, index))
                self._not_leader_any_more((change.topic.name, index))
            self._roles_changed()
        elif isinstance(change, ConfigChanged):
            self._reconfigure(change)

    def _partition_changed(self, change: PartitionChanged) -> None:
        key = (change.topic.name, change.partition)
        if key in self._creating:
            # Its log is being created: what it becomes is decided once it exists.
            self._creating[key] = change if self.node_id in change.state.replicas else None
            return
        if self.node_id not in change.state.replicas:
            if key in self.partitions:
                del self.partitions[key]
                self._delete_log(key)
                self._not_leader_any_more(key)
                self._wake(key)
                self._roles_changed()
            return
        min_isr = min(self.min_insync_replicas(key[0]), len(change.state.replicas))
        existing = self.partitions.get(key)
        if existing is not None and existing.log.topic_id not in (None, change.topic.topic_id):
            # Another topic of the same name, whose removal this node never saw apply: the
            # replica it hosts is not this topic's (`create_log` sets its log aside below).
            del self.partitions[key]
            self._not_leader_any_more(key)
            self._wake(key)
            existing = None
        if existing is not None:
            old, high_watermark = existing.state, existing.high_watermark
            existing.state = change.state
            existing.min_isr = min_isr
            # What this replica knew to be committed stays so, whatever changed.
            existing.stored_high_watermark = max(existing.stored_high_watermark, high_watermark)
            if change.state.partition_epoch != existing.pending_since_epoch:
                existing.pending_isr = None  # answered: the partition changed
            if old.leader != change.state.leader or old.leader_epoch != change.state.leader_epoch:
                self._new_leader(existing)
            elif existing.is_leader:
                self._advance_high_watermark(existing)  # the ISR may have changed
                if old != change.state:
                    self._wake(key)  # a follower that left the ISR is read again at once
            return
        if key in self.logs.offline:
            return  # it could not be loaded: it answers KAFKA_STORAGE_ERROR (see `get`)
        try:
            # Under the topic's id: a directory of an earlier topic of the same name (deleted
            # and created again while this node was away) is set aside, never adopted.
            found = self.logs.plan_log(*key, self._clock(), topic_id=change.topic.topic_id)
            if isinstance(found, Path) and self._in_background(change):
                self._creating[key] = change
                if self._creator is None or self._creator.done():
                    self._creator = asyncio.get_running_loop().create_task(
                        self._create_in_background(), name="create-logs"
                    )
                return
            log_ = self.logs.create_log(
                *key, self._clock(), self._log_config(key[0]), topic_id=change.topic.topic_id
            )
        except (OSError, StorageError) as exc:
            self._creation_failed(key, exc)
            return
        self._install(change, log_)

    def _in_background(self, change: PartitionChanged) -> bool:
        """Whether this new partition's log is created in the background: when the node asks
        for it, and many are created at once (more than `_CREATE_AT_ONCE` in this turn of the
        event loop, or some are being created in the background already). A few logs are
        created at once, as before, and so are internal topics' (the group coordinator
        serves `__consumer_offsets` as soon as it exists)."""
        if not self.create_in_background or change.topic.internal:
            return False
        if self._creating or self._created_this_turn >= _CREATE_AT_ONCE:
            return True
        if self._created_this_turn == 0:
            asyncio.get_running_loop().call_soon(self._new_turn)
        self._created_this_turn += 1
        return False

    def _new_turn(self) -> None:
        self._created_this_turn = 0

    def being_created(self, key: TopicPartition) -> bool:
        return key in self._creating

    async def wait_created(self, key: TopicPartition) -> None:
        """Until the partition's log is no longer being created (it exists, or failed, or the
        partition went meanwhile): what follows a metadata change that needs the partition
        hosted (the group coordinator loading `__consumer_offsets`) waits for it."""
        if key not in self._creating:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._created.setdefault(key, []).append(done)
        await done

    def _tell_created(self, key: TopicPartition) -> None:
        for done in self._created.pop(key, ()):
            if not done.done():
                done.set_result(None)

    async def close(self) -> None:
        """Stop creating logs: the batch on its thread is finished and taken in, the rest
        is left to the metadata the next start applies."""
        self._closing = True
        if self._creator is not None:
            await asyncio.gather(self._creator, return_exceptions=True)
        for key in list(self._created):
            self._tell_created(key)

    def _creation_failed(self, key: TopicPartition, exc: Exception) -> None:
        # The metadata is committed whatever the disk says: this partition is offline
        # here (out of descriptors, a full or failed disk) and the rest carries on.
        log.error("cannot create the log of %s-%d, it is offline: %s", *key, exc)
        self.logs.offline[key] = f"cannot create its log: {type(exc).__name__}: {exc}"

    def _install(self, change: PartitionChanged, log_: Log) -> None:
        key = (change.topic.name, change.partition)
        # The topic's configs as they are now (they may have changed since the log was
        # planned: a CreateTopics's configs are applied after its partitions).
        log_.update_config(self._log_config(key[0]))
        min_isr = min(self.min_insync_replicas(key[0]), len(change.state.replicas))
        partition = Partition(key[0], key[1], log_, change.state, self.node_id, min_isr=min_isr)
        partition.leader_since_ms = self._steady()
        partition.leader_start_offset = log_.log_end_offset
        if partition.is_leader:
            self._record_epoch(partition)
        # Until replication says more, a replica knows committed what was when it stopped (the
        # replication checkpoint; its log start if there is none); the high watermark then
        # moves with the leader's. A leader alone has everything committed.
        partition.stored_high_watermark = log_.loaded_high_watermark
        log_.committed = lambda: partition.high_watermark
        self.partitions[key] = partition
        self._wake(key)  # its fetches and fetch sessions (a follower's fetcher) look again
        if not partition.is_leader:
            self._roles_changed()

    async def _create_in_background(self) -> None:
        """Create the logs `_creating` waits for, `_CREATE_BATCH` at a time on
        `_CREATE_THREADS` threads (a leader's first epoch goes in its checkpoint there too),
        then take each in with the newest change that reached its partition meanwhile."""
        started, count = time.monotonic(), 0
        while self._creating and not self._closing:
            now = self._clock()
            jobs = self._plan_round(now)
            if not jobs:
                continue
            expiration_ms = self.logs.producer_id_expiration_ms
            chunks = [jobs[i::_CREATE_THREADS] for i in range(min(_CREATE_THREADS, len(jobs)))]
            done = await asyncio.gather(
                *(asyncio.to_thread(_open_logs, c, now, expiration_ms) for c in chunks)
            )
            deadline = time.perf_counter() + _TAKE_IN_SLICE_S
            for chunk, results in zip(chunks, done, strict=True):
                for (key, _, _, topic_id, _), result in zip(chunk, results, strict=True):
                    self._take_in(key, topic_id, result)
                    count += 1
                    if time.perf_counter() >= deadline:  # others' turn on the event loop
                        await asyncio.sleep(0)
                        deadline = time.perf_counter() + _TAKE_IN_SLICE_S
        if count:
            log.info(
                "created the logs of %d partitions in %.1f s", count, time.monotonic() - started
            )

    def _plan_round(self, now: int) -> list[_Job]:
        """The next round's logs to create; what needs none (gone, failed, found) is settled
        here."""
        jobs: list[_Job] = []
        for key, change in list(itertools.islice(self._creating.items(), _CREATE_BATCH)):
            if change is None:
                del self._creating[key]
                self.logs.drop_plan(*key)
                self._tell_created(key)
                continue
            try:
                target = self.logs.plan_log(*key, now, topic_id=change.topic.topic_id)
            except (OSError, StorageError) as exc:
                del self._creating[key]
                self.logs.drop_plan(*key)
                self._creation_failed(key, exc)
                self._tell_created(key)
                continue
            if isinstance(target, Log):  # it exists after all
                del self._creating[key]
                self._install(change, target)
                self._tell_created(key)
                continue
            state = change.state
            epoch = state.leader_epoch if state.leader == self.node_id else -1
            jobs.append((key, target, self._log_config(key[0]), change.topic.topic_id, epoch))
        return jobs

    def _take_in(self, key: TopicPartition, topic_id: uuid.UUID, result: Log | Exception) -> None:
        """A log created in the background (or what prevented it), taken in as the newest
        change that reached its partition meanwhile says."""
        latest = self._creating.pop(key, None)
        created, error = (result, None) if isinstance(result, Log) else (None, result)
        if created is not None:
            self.logs.adopt_log(created)
            log_dir = created.directory.parent
            if log_dir in self.logs.offline_dirs:
                self._delete_log(key)
                created, error = None, StorageError(f"its log dir {log_dir} went offline")
        else:
            self.logs.drop_plan(*key)
        if latest is not None and latest.topic.topic_id != topic_id:
            # The topic was deleted and created again meanwhile: this log (if any) is the old
            # one's, and the new one's partition starts over.
            if created is not None:
                self._delete_log(key)
            self._partition_changed(latest)
        elif error is not None:
            if latest is not None:
                self._creation_failed(key, error)
        elif latest is None or created is None:
            self._delete_log(key)  # gone meanwhile
        else:
            self._install(latest, created)
        if key not in self._creating:
            self._tell_created(key)

    def _new_leader(self, partition: Partition) -> None:
        """The partition's leader or leader epoch changed. A new leader starts with no
        knowledge of its followers and the high watermark it had (as Kafka's does); a replica
        that stopped leading fails its acks=all waiters."""
        key = (partition.topic, partition.index)
        partition.follower_ends = {}
        partition.follower_starts = {}
        partition.caught_up_ms = {}
        partition.pending_isr = None
        partition.last_fetch = {}
        if partition.is_leader:
            partition.leader_since_ms = self._steady()
            partition.leader_start_offset = partition.log.log_end_offset
            self._record_epoch(partition)
            self._advance_high_watermark(partition)
        else:
            self._not_leader_any_more(key)
        self._wake(key)
        self._roles_changed()

    def _record_epoch(self, partition: Partition) -> None:
        """A new leader's epoch starts at its log end, in its epoch cache at once (Kafka's
        makeLeader): a follower's divergence is judged against it before any append."""
        try:
            partition.log.epochs.assign(partition.leader_epoch, partition.log.log_end_offset)
        except OSError as exc:
            self.log_dir_failed(partition.topic, partition.index, exc)

    def _delete_log(self, key: TopicPartition) -> None:
        """Delete a partition's log; a disk that refuses leaves it as a stray, which the next
        start deletes again, instead of failing the metadata change that removed it."""
        try:
            self.logs.delete_log(*key, self._clock())
        except (OSError, StorageError) as exc:
            log.error("cannot delete the log of %s-%d (retried at the next start): %s", *key, exc)

    def _reconfigure(self, change: ConfigChanged) -> None:
        topics: Iterable[str]
        if change.resource_type == TOPIC_RESOURCE:
            topics = (change.resource_name,)
        else:
            topics = {tp[0] for tp in self.partitions}
        for topic in topics:
            config = self._log_config(topic)
            min_isr = self.min_insync_replicas(topic)
            for (name, _), partition in self.partitions.items():
                if name == topic:
                    partition.log.update_config(config)
                    high_watermark = partition.high_watermark
                    partition.min_isr = min(min_isr, len(partition.state.replicas))
                    # What was committed stays so, and may move on under the new bound.
                    partition.stored_high_watermark = max(
                        partition.stored_high_watermark, high_watermark
                    )
                    self._advance_high_watermark(partition)

    def remove_strays(self) -> None:
        """After replay: set aside the logs on disk that the metadata does not assign here
        (their topic was deleted while this node was down, or its replica moved away), as
        Kafka does with stray logs: renamed `-stray`, removed after `file.delete.delay.ms`."""
        for (topic, index), _ in self.logs:
            if (topic, index) not in self.partitions:
                try:
                    self.logs.mark_stray(
                        topic, index, self._clock(), "the metadata has no replica of it here"
                    )
                except (OSError, StorageError) as exc:
                    log.error("cannot set aside the stray log of %s-%d: %s", topic, index, exc)


def _open_logs(
    jobs: list[_Job],
    now_ms: int,
    producer_id_expiration_ms: int,
) -> list[Log | Exception]:
    """On a thread: each job's new log (or what prevented it); a leader's first epoch goes in
    its checkpoint at once."""
    created: list[Log | Exception] = []
    for _, directory, config, topic_id, leader_epoch in jobs:
        try:
            log_ = open_new_log(
                directory,
                config,
                now_ms,
                topic_id=topic_id,
                producer_id_expiration_ms=producer_id_expiration_ms,
            )
            if leader_epoch >= 0:
                log_.epochs.assign(leader_epoch, log_.log_end_offset)
        except Exception as exc:  # a disk's refusal, or a file it left unreadable
            created.append(exc)
            continue
        created.append(log_)
    return created
