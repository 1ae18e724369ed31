"""The follower side of replication: what this node does with the partitions it follows.

What it owns: which partitions the replica fetchers follow (`followed`), a follower's append of
what its leader sent (offsets and epochs as the leader wrote them) with the leader's high
watermark, and the follower replication throttle (`follower_throttled`, `follower_took`).

What it must never do: fetch (the replica fetchers in `fetcher` do, and call this), assign
offsets or leader epochs, or move the high watermark past this replica's log end.
"""

from __future__ import annotations

from broker.protocol.errors import ErrorCode
from broker.protocol.records import read_batch_header

from .appends import Appends
from .partition import AppendResult, Partition, TopicPartition
from .quota import ReplicationQuota

__all__ = ["FollowerReplication"]


class FollowerReplication(Appends):
    """Built on `Appends`: a follower's append runs under the same guard as a leader's."""

    follower_quota: ReplicationQuota
    """`follower.replication.throttled.rate`: what this follower fetches for its throttled
    replicas while they are out of the ISR."""

    def followed(self) -> dict[TopicPartition, Partition]:
        """The partitions this node follows a live leader of (for the replica fetchers)."""
        return {
            key: p for key, p in self.partitions.items() if not p.is_leader and p.state.leader >= 0
        }

    def append_from_leader(
        self, partition: Partition, records: bytes, leader_high_watermark: int
    ) -> AppendResult:
        """A follower appends what its leader sent (offsets and epochs as the leader wrote
        them) and takes the leader's high watermark, up to its own log end."""
        key = (partition.topic, partition.index)
        log_ = partition.log
        if records and log_.log_end_offset == log_.log_start_offset:
            # An empty log restarted at the leader's log start, which DeleteRecords may have
            # put inside a batch: start where that batch does (Kafka's follower does too).
            first = read_batch_header(records)
            if first.base_offset < log_.log_end_offset <= first.last_offset:
                log_.truncate_fully_and_start_at(first.base_offset, self._clock())
        if records:
            info = self._guarded(
                partition.topic,
                partition.index,
                lambda: partition.log.append_as_follower(records, now_ms=self._clock()),
            )
            if isinstance(info, AppendResult):
                return info
        if leader_high_watermark > partition.stored_high_watermark:
            partition.stored_high_watermark = leader_high_watermark
            self._wake(key)
        return AppendResult(ErrorCode.none)

    def follower_throttled(self, partition: Partition) -> bool:
        """As a follower: hold this partition out of the next fetch (Kafka's
        shouldFollowerThrottle): it is out of the ISR, throttled, and over the rate."""
        return (
            self.follower_quota.limit is not None
            and self.node_id not in partition.state.isr
            and self._throttled(partition, "follower.replication.throttled.replicas")
            and self.follower_quota.exceeded(self._steady() / 1000)
        )

    def follower_took(self, partition: Partition, size: int) -> None:
        """As a follower: `size` bytes fetched for `partition` count against the follower
        rate if the partition is throttled and out of the ISR."""
        if (
            self.follower_quota.limit is not None
            and self.node_id not in partition.state.isr
            and self._throttled(partition, "follower.replication.throttled.replicas")
        ):
            self.follower_quota.record(size, self._steady() / 1000)
