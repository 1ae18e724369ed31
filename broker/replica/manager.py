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

import logging
import time
from collections.abc import Callable, Iterable

from broker.metadata import (
    TOPIC_RESOURCE,
    ConfigChanged,
    MetadataImage,
    PartitionChanged,
    TopicRemoved,
)
from broker.metadata.image import Change
from broker.storage import LogConfig, LogManager, StorageError

from .appends import Appends
from .follower import FollowerReplication
from .leader import LeaderReplication
from .offsets import Offsets
from .partition import Partition, TopicPartition
from .quota import ReplicationQuota

__all__ = ["ReplicaManager"]

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
        self._appending = {}
        self._finishing = set()
        self._replicated = {}
        self._trimmed = {}
        self.on_append = None
        self.on_role_change = None
        self.on_isr_change = None
        self.min_insync_replicas = lambda topic: int(
            self._topic_setting(topic, "min.insync.replicas", "1")
        )
        self.replica_lag_time_max_ms = 30_000
        self._steady = steady_ms
        self.leader_quota = ReplicationQuota()
        self.follower_quota = ReplicationQuota()

    def apply(self, change: Change) -> None:
        if isinstance(change, PartitionChanged):
            self._partition_changed(change)
        elif isinstance(change, TopicRemoved):
            for index in change.topic.partitions:
                self.partitions.pop((change.topic.name, index), None)
                self._delete_log((change.topic.name, index))
                self._wake((change.topic.name, index))
                self._not_leader_any_more((change.topic.name, index))
            self._roles_changed()
        elif isinstance(change, ConfigChanged):
            self._reconfigure(change)

    def _partition_changed(self, change: PartitionChanged) -> None:
        key = (change.topic.name, change.partition)
        if self.node_id not in change.state.replicas:
            if key in self.partitions:
                del self.partitions[key]
                self._delete_log(key)
                self._not_leader_any_more(key)
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
            return
        if key in self.logs.offline:
            return  # it could not be loaded: it answers KAFKA_STORAGE_ERROR (see `get`)
        try:
            # Under the topic's id: a directory of an earlier topic of the same name (deleted
            # and created again while this node was away) is set aside, never adopted.
            log_ = self.logs.create_log(
                *key, self._clock(), self._log_config(key[0]), topic_id=change.topic.topic_id
            )
        except (OSError, StorageError) as exc:
            # The metadata is committed whatever the disk says: this partition is offline
            # here (out of descriptors, a full or failed disk) and the rest carries on.
            log.error("cannot create the log of %s-%d, it is offline: %s", *key, exc)
            self.logs.offline[key] = f"cannot create its log: {type(exc).__name__}: {exc}"
            return
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
        if not partition.is_leader:
            self._roles_changed()

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
