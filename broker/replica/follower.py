"""The follower side of replication: what this node does with the partitions it follows.

What it owns: which partitions the replica fetchers follow (`followed`), a follower's append of
what its leader sent (offsets and epochs as the leader wrote them) with the leader's high
watermark, and the follower replication throttle (`follower_throttled`, `follower_took`).

What it must never do: fetch (the replica fetchers in `fetcher` do, and call this), assign
offsets or leader epochs, or move the high watermark past this replica's log end.
"""

from __future__ import annotations

import logging

from broker.protocol.errors import ErrorCode
from broker.protocol.records import read_batch_header

from .appends import Appends
from .partition import AppendResult, Partition, TopicPartition
from .quota import ReplicationQuota

__all__ = ["FollowerReplication"]

log = logging.getLogger(__name__)


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
        self,
        partition: Partition,
        records: bytes,
        leader_high_watermark: int,
        leader_log_start: int = -1,
    ) -> AppendResult:
        """A follower appends what its leader sent (offsets and epochs as the leader wrote
        them), takes the leader's high watermark, up to its own log end, and then the
        leader's log start (`follow_log_start`)."""
        key = (partition.topic, partition.index)
        log_ = partition.log
        if records:
            first = read_batch_header(records)
            end = log_.log_end_offset
            if first.base_offset < end <= first.last_offset and not self._realigned(
                partition, first.base_offset
            ):
                return AppendResult(ErrorCode.none)  # the next fetch asks from the new log end
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
        return self.follow_log_start(partition, leader_log_start)

    def follow_log_start(self, partition: Partition, leader_log_start: int) -> AppendResult:
        """The leader's log start moved (DeleteRecords, retention): this replica's follows,
        up to its high watermark (Kafka's follower does so from every fetch answer), and is
        checkpointed before the next fetch tells the leader, so that a leader lost at once
        never leaves a replica that serves deleted records again. It reaches the leader in
        the next fetch's `log_start_offset`, and DeleteRecords answers once every replica's
        has passed the offset."""
        log_ = partition.log
        target = min(leader_log_start, partition.high_watermark)
        if target <= log_.log_start_offset:
            return AppendResult(ErrorCode.none)
        outcome = self._guarded(
            partition.topic,
            partition.index,
            lambda: self.logs.delete_records(partition.topic, partition.index, target),
        )
        return outcome if isinstance(outcome, AppendResult) else AppendResult(ErrorCode.none)

    def _realigned(self, partition: Partition, base_offset: int) -> bool:
        """This log ends strictly inside the leader's first batch (which starts at
        `base_offset`): cut it back to where that batch starts. True if the log now ends
        there, so that the batch can be appended as it is; False if the cut went further
        (this log's own last batch started below `base_offset`), and the next fetch asks from
        the new log end.

        Replicas copy whole batches, so a follower never ends inside one of its leader's
        batches, and an empty log restarted at a log start that DeleteRecords put inside a
        batch starts where that batch does (as Kafka's follower). Any other log that ends
        inside a batch holds a tail the leader does not have (its batches are not the
        leader's); without this cut it would ask for the same offset, and be refused the same
        batch, forever, behind its leader. Kafka gives such a partition up (it marks it
        failed); cutting back to the batch's start heals it instead: nothing past the
        leader's batch start is kept that the leader did not write."""
        log_ = partition.log
        end = log_.log_end_offset
        if end == log_.log_start_offset:
            self.start_over(partition, base_offset)
            return True
        log.warning(
            "%s-%d ends at %d, inside its leader's batch from offset %d: truncating to %d",
            partition.topic,
            partition.index,
            end,
            base_offset,
            base_offset,
        )
        self.truncate(partition, base_offset)
        return log_.log_end_offset == base_offset

    def truncate(self, partition: Partition, offset: int) -> None:
        """Cut this replica's log back to `offset` (a divergence, a log past the leader's end,
        a misaligned tail), and its high watermark with it, as Kafka's truncateTo does: what
        it knew committed above the cut is no longer in this log, and must not count as
        committed when it appends again (or leads) before its leader says so."""
        partition.log.truncate_to(offset)
        self._after_cut(partition)

    def start_over(self, partition: Partition, offset: int) -> None:
        """Empty this replica's log and start it at `offset` (the leader's log start, which
        this log had fallen behind), its high watermark cut with it."""
        partition.log.truncate_fully_and_start_at(offset, self._clock())
        self._after_cut(partition)

    def _after_cut(self, partition: Partition) -> None:
        log_ = partition.log
        partition.stored_high_watermark = max(
            min(partition.stored_high_watermark, log_.log_end_offset), log_.log_start_offset
        )

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
