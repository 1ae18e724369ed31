"""The partitions this node hosts: what every part of the replica manager stands on.

What it owns: the hosted partitions by topic and index and their lookup (`get`, `get_leader`,
with the error a missing one answers), the clocks, the topic settings as they apply to this
broker (`min.insync.replicas`, the replication throttles), the fetches waiting for a partition
to change (`wait_for_append`, woken by every append, high watermark move, or role change), and
the word to the replica fetchers when the partitions this node follows change.

What it must never do: change a partition's log or its replication state — the parts built on
it do (`appends`, `leader`, `follower`, `offsets`, and `manager`, which follows the metadata).
It is never made on its own: `ReplicaManager.__init__` sets every field declared here and in
those parts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from broker.aio import wait_for
from broker.metadata import MetadataImage
from broker.protocol.errors import ErrorCode
from broker.storage import LogConfig, LogManager

from .partition import Partition, TopicPartition
from .quota import ALL_PARTITIONS, throttled_partitions

__all__ = ["HostedPartitions", "Watcher"]


class Watcher(Protocol):
    def touched(self, key: TopicPartition) -> None:
        """`key` was appended to, its high watermark or log start moved, its role changed, or
        it is gone."""


class HostedPartitions:
    node_id: int
    logs: LogManager
    image: MetadataImage
    _log_config: Callable[[str], LogConfig]
    _clock: Callable[[], int]
    _steady: Callable[[], int]
    partitions: dict[TopicPartition, Partition]
    _waiters: dict[TopicPartition, set[asyncio.Future[None]]]
    """Fetches waiting for a partition to change (`wait_for_append`)."""
    _watchers: dict[TopicPartition, set[Watcher]]
    """Fetch sessions told of every change of their partitions (`watch`)."""
    on_role_change: Callable[[], None] | None
    """Told when this node starts or stops following some partition's leader (the replica
    fetchers then follow the new set)."""
    _roles_update: asyncio.Handle | None
    min_insync_replicas: Callable[[str], int]
    """A topic's `min.insync.replicas` (the node resolves it through the broker's
    settings too: `MetadataService.min_insync_replicas`)."""

    def now_ms(self) -> int:
        return self._clock()

    def get(self, topic: str, index: int) -> Partition | ErrorCode:
        partition = self.partitions.get((topic, index))
        if partition is not None:
            return partition
        topic_state = self.image.topics.get(topic)
        if topic_state is None or index not in topic_state.partitions:
            return ErrorCode.unknown_topic_or_partition
        if (topic, index) in self.logs.offline:
            return ErrorCode.kafka_storage_error
        return ErrorCode.not_leader_or_follower

    def get_leader(self, topic: str, index: int) -> Partition | ErrorCode:
        """The partition if this node leads it (produce, consumer fetches, offsets): a follower
        answers NOT_LEADER_OR_FOLLOWER, as in Kafka, and the client asks where the leader is."""
        found = self.get(topic, index)
        if isinstance(found, Partition) and not found.is_leader:
            return ErrorCode.not_leader_or_follower
        return found

    def _topic_setting(self, topic: str, name: str, default: str) -> str:
        return self.image.topic_config(topic).get(name, default)

    def _throttled(self, partition: Partition, setting: str) -> bool:
        """Whether the topic's `setting` (`leader.` or `follower.replication.throttled.
        replicas`) throttles this partition's replica on this broker."""
        value = self.image.topic_config(partition.topic).get(setting)
        if not value:
            return False
        throttled = throttled_partitions(value, self.node_id)
        return throttled is ALL_PARTITIONS or partition.index in throttled

    def _roles_changed(self) -> None:
        """Tell `on_role_change` once this turn of the event loop is over: a metadata change
        that moves thousands of partitions tells it once per turn, not once per partition
        (it looks at every partition followed)."""
        if self.on_role_change is None or self._roles_update is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test driving the manager directly): at once
            self.on_role_change()
            return
        self._roles_update = loop.call_soon(self._tell_roles)

    def _tell_roles(self) -> None:
        self._roles_update = None
        if self.on_role_change is not None:
            self.on_role_change()

    async def wait_for_append(self, partitions: list[TopicPartition], timeout: float) -> None:
        """Return when any of `partitions` is appended to (or deleted), or after `timeout`."""
        if timeout <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in partitions:
            self._waiters.setdefault(key, set()).add(future)
        try:
            await wait_for(future, timeout)
        except TimeoutError:
            pass
        finally:
            for key in partitions:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiters[key]

    def watch(self, key: TopicPartition, watcher: Watcher) -> None:
        """Tell `watcher` of every change of `key` from now on: what wakes a waiting fetch
        (`wait_for_append`), without registering again for each fetch."""
        self._watchers.setdefault(key, set()).add(watcher)

    def unwatch(self, key: TopicPartition, watcher: Watcher) -> None:
        watching = self._watchers.get(key)
        if watching is not None:
            watching.discard(watcher)
            if not watching:
                del self._watchers[key]

    def _wake(self, key: TopicPartition) -> None:
        waiting = self._waiters.pop(key, None)
        if waiting:
            for future in waiting:
                if not future.done():
                    future.set_result(None)
        watching = self._watchers.get(key)
        if watching:
            for watcher in watching:
                watcher.touched(key)
