"""The followers as a partition's leader sees them: replication, from the leader's side.

What it owns: follower fetches on the leader (`read_for_follower`: the divergence check, the
leader replication throttle), each follower's progress (`follower_fetched`), the ISR the leader
wants (a follower that caught up joins; one that lags `replica.lag.time.max.ms` leaves:
`check_isr`), the high watermark's moves, and the acks=all produces waiting for it; the low
watermark (the least log start of the live replicas) and the DeleteRecords waiting for it.

What it must never do: change the ISR itself (it asks the controller through `on_isr_change`,
and the answer comes back as a metadata change), move the high watermark down or past what
every in-sync replica has, or answer a consumer (`offsets` does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from broker.aio import wait_for
from broker.protocol.errors import ErrorCode
from broker.storage import OffsetOutOfRange

from .hosted import HostedPartitions
from .partition import FetchResult, Partition, TopicPartition, epoch_error
from .quota import ReplicationQuota

__all__ = ["LeaderReplication"]

log = logging.getLogger(__name__)


class LeaderReplication(HostedPartitions):
    _replicated: dict[TopicPartition, list[tuple[int, asyncio.Future[ErrorCode]]]]
    """acks=all produces waiting for the high watermark to pass their batch's end."""
    on_isr_change: Callable[[Partition, tuple[int, ...]], None] | None
    """Sends a led partition's wanted ISR to the active controller (AlterPartition); the
    answer comes back as a metadata change, or as `isr_change_failed`."""
    replica_lag_time_max_ms: int
    """`replica.lag.time.max.ms`: an in-sync follower that has not fetched up to the log
    end for this long leaves the ISR."""
    leader_quota: ReplicationQuota
    """`leader.replication.throttled.rate`: what this leader sends to throttled replicas
    that are catching up (`broker.replica.quota`)."""
    _trimmed: dict[TopicPartition, list[tuple[int, asyncio.Future[ErrorCode]]]]
    """DeleteRecords waiting for the low watermark to pass their offset."""

    def replica_fetch_error(self, replica_id: int, replica_epoch: int) -> ErrorCode | None:
        """Whether a fetch that names replica `replica_id` is that broker's (None: it is). It
        must carry the broker's current epoch (KIP-903's ReplicaEpoch: the epoch of its
        registration in this node's metadata image); otherwise it is refused whole with
        NOT_LEADER_OR_FOLLOWER, before it reads anything, moves the high watermark or lets
        the replica join an ISR, so that neither a fetch of an earlier process of that broker
        nor a client posing as a replica counts as the follower's progress.

        Stricter than Kafka, which refuses only an epoch older than the broker's
        (`Replica.updateFetchStateOrThrow`, NOT_LEADER_OR_FOLLOWER) and takes -1 (a fetch
        below v15, or a follower that does not say) unchecked, leaving forged fetches to its
        ClusterAction ACL. Gregor has no authorizer yet and its followers always send their
        epoch, so a client must at least know an epoch no client API tells it."""
        broker = self.image.brokers.get(replica_id)
        if broker is None or broker.epoch != replica_epoch:
            return ErrorCode.not_leader_or_follower
        return None

    def read_for_follower(
        self,
        topic: str,
        index: int,
        replica_id: int,
        offset: int,
        max_bytes: int,
        *,
        min_one_batch: bool,
        current_leader_epoch: int,
        last_fetched_epoch: int,
        log_start_offset: int = -1,
    ) -> FetchResult:
        """A follower's fetch, on the leader: records up to the log end (not the high
        watermark), after checking that the follower's log has not parted from this one's; the
        fetch offset is the follower's log end, which may move the high watermark, and its
        `log_start_offset` the low watermark."""
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return FetchResult(found)
        partition = found
        if replica_id not in partition.state.replicas:
            return FetchResult(ErrorCode.not_leader_or_follower)
        stale = epoch_error(partition, current_leader_epoch)
        if stale is not None:
            return FetchResult(stale)
        log_ = partition.log
        result = FetchResult(ErrorCode.none, -1, log_.log_start_offset)
        if last_fetched_epoch >= 0:
            # Kafka's divergence check: where the follower's last epoch ends here.
            epoch, end = log_.end_offset_for_epoch(last_fetched_epoch)
            result.high_watermark = partition.high_watermark
            if epoch < 0 or end < 0:
                # No epoch this old or older here: the follower starts over from this log.
                result.error = ErrorCode.offset_out_of_range
                return result
            if end < offset or epoch < last_fetched_epoch:
                result.diverging_epoch = (epoch, end)
                return result
        if offset > log_.log_end_offset or offset < log_.log_start_offset:
            result.error = ErrorCode.offset_out_of_range
            result.high_watermark = partition.high_watermark
            return result
        self.follower_fetched(partition, replica_id, offset, log_start_offset)
        result.high_watermark = partition.high_watermark
        throttled = (
            self.leader_quota.limit is not None
            and replica_id not in partition.state.isr
            and self._throttled(partition, "leader.replication.throttled.replicas")
        )
        now = self._steady() / 1000
        if throttled and self.leader_quota.exceeded(now):
            return result  # nothing for it this time (Kafka's shouldLeaderThrottle)
        try:
            result.records = log_.read(offset, max_bytes, min_one_batch=min_one_batch)
        except OffsetOutOfRange:
            result.error = ErrorCode.offset_out_of_range
        if throttled and result.records is not None:
            self.leader_quota.record(result.records.size, now)
        return result

    def follower_idle(
        self,
        topic: str,
        index: int,
        replica_id: int,
        offset: int,
        *,
        leader_epoch: int,
        high_watermark: int,
        log_start_offset: int,
    ) -> bool:
        """Whether a follower's fetch from `offset`, in a fetch session, finds nothing it was
        not told already: this node still leads in `leader_epoch`, the follower is in the ISR
        (no change pending) and at the log end it fetched from last time, and the high
        watermark and log start are the ones it was told. Then it is caught up now, as a read
        would record (Kafka reads every session partition on every fetch; this is that read
        for a partition where nothing moved)."""
        partition = self.partitions.get((topic, index))
        if (
            partition is None
            or not partition.is_leader
            or partition.leader_epoch != leader_epoch
            or partition.pending_isr is not None
            or replica_id not in partition.state.isr
        ):
            return False
        log_ = partition.log
        if (
            log_.log_end_offset != offset
            or partition.follower_ends.get(replica_id) != offset
            or partition.high_watermark != high_watermark
            or log_.log_start_offset != log_start_offset
            or log_.appending
        ):
            return False
        now = self._steady()
        partition.caught_up_ms[replica_id] = now
        partition.last_fetch[replica_id] = (offset, now)
        return True

    def follower_in_sync(self, topic: str, index: int, replica_id: int) -> bool:
        """Whether this node leads the partition with `replica_id` in its ISR."""
        partition = self.partitions.get((topic, index))
        return partition is not None and partition.is_leader and replica_id in partition.state.isr

    def readable_past(self, topic: str, index: int, offset: int, *, follower: bool) -> bool:
        """Whether this leader holds records past `offset` that a follower (up to the log
        end) could read, or this replica (leader, or a follower serving consumers: KIP-392)
        records a consumer (up to the high watermark) could."""
        partition = self.partitions.get((topic, index))
        if partition is None or (follower and not partition.is_leader):
            return False
        end = partition.log.log_end_offset if follower else partition.high_watermark
        return end > offset

    def leader_epoch_of(self, topic: str, index: int) -> int:
        """The leader epoch this node knows for a partition it hosts; -1 if it hosts none."""
        partition = self.partitions.get((topic, index))
        return -1 if partition is None else partition.leader_epoch

    def follower_fetched(
        self, partition: Partition, replica_id: int, offset: int, log_start_offset: int = 0
    ) -> None:
        """A follower fetched from `offset`: it has everything before it, and nothing before
        `log_start_offset` (-1: it did not say, and it does not join the ISR)."""
        if replica_id == self.node_id:
            return
        partition.follower_ends[replica_id] = offset
        if log_start_offset >= 0:
            partition.follower_starts[replica_id] = log_start_offset
        # Kafka's Replica.updateFetchState: caught up now if it fetched from the log end, or
        # as of its previous fetch if it has come as far as the log end was then.
        now, end = self._steady(), partition.log.log_end_offset
        previous = partition.last_fetch.get(replica_id)
        if offset >= end:
            partition.caught_up_ms[replica_id] = now
        elif previous is not None and offset >= previous[0]:
            partition.caught_up_ms[replica_id] = max(
                partition.caught_up_ms.get(replica_id, 0), previous[1]
            )
        partition.last_fetch[replica_id] = (end, now)
        if (
            replica_id not in partition.state.isr
            and partition.pending_isr is None
            and offset >= partition.high_watermark
            and offset >= partition.leader_start_offset
            and log_start_offset >= partition.log.log_start_offset
            and self._isr_eligible(replica_id)
        ):
            # Caught up (Kafka's isFollowerInSync), and with this log's start: a follower that
            # missed a DeleteRecords while it was away must not lead before it has taken it
            # (stricter than Kafka, whose fenced followers may rejoin without it).
            wanted = tuple(
                r for r in partition.state.replicas if r in partition.state.isr or r == replica_id
            )
            self._ask_isr(partition, wanted)
        self._advance_high_watermark(partition)

    def _isr_eligible(self, replica_id: int) -> bool:
        """Kafka's isReplicaIsrEligible: a fenced broker, or one shutting down, does not
        join an ISR (the controller would refuse it: INELIGIBLE_REPLICA)."""
        broker = self.image.brokers.get(replica_id)
        return broker is None or not (broker.fenced or broker.in_controlled_shutdown)

    def check_isr(self) -> None:
        """Every led partition: in-sync followers that have not fetched up to the log end for
        `replica.lag.time.max.ms` (stopped, slow, or partitioned away) leave the ISR, so the
        high watermark and acks=all go on without them."""
        now = self._steady()
        for partition in list(self.partitions.values()):
            if not partition.is_leader or partition.pending_isr is not None:
                continue
            if len(partition.state.isr) <= 1:
                continue
            lagging = {
                r
                for r in partition.state.isr
                if r != self.node_id
                and now - partition.caught_up_ms.get(r, partition.leader_since_ms)
                > self.replica_lag_time_max_ms
            }
            if lagging:
                log.info(
                    "%s-%d: replicas %s have not caught up for %d ms; shrinking the ISR",
                    partition.topic,
                    partition.index,
                    sorted(lagging),
                    self.replica_lag_time_max_ms,
                )
                self._ask_isr(partition, tuple(r for r in partition.state.isr if r not in lagging))

    def _ask_isr(self, partition: Partition, wanted: tuple[int, ...]) -> None:
        if self.on_isr_change is None or wanted == partition.state.isr:
            return
        # The high watermark as it stands is kept: a leader alone had it at its log end.
        partition.stored_high_watermark = partition.high_watermark
        partition.pending_isr = wanted
        partition.pending_since_epoch = partition.state.partition_epoch
        self.on_isr_change(partition, wanted)

    def isr_change_failed(self, partition: Partition, wanted: tuple[int, ...]) -> None:
        """The controller refused this ISR for certain: the next fetch or check may ask again.
        (An unanswered request stays pending and is sent again: it may have been committed.)"""
        if partition.pending_isr == wanted:
            partition.pending_isr = None

    def _advance_high_watermark(self, partition: Partition) -> None:
        """On the leader: the high watermark moves up to the least log end among the ISR
        (never down), then acks=all produces and consumers waiting for it are told. Not while
        the ISR is below `min.insync.replicas` (KIP-966, Kafka 4.1's default): a replica that
        left it then has every committed record, which makes it an eligible leader."""
        if not partition.is_leader:
            return
        if len(partition.maximal_isr) < partition.min_isr:
            return
        ends = [partition.log.log_end_offset]
        for replica in partition.maximal_isr:
            if replica != self.node_id:
                ends.append(partition.follower_ends.get(replica, -1))
        candidate = min(ends)
        key = (partition.topic, partition.index)
        if candidate > partition.stored_high_watermark:
            partition.stored_high_watermark = candidate
            self._wake(key)
        waiting = self._replicated.get(key)
        if waiting:
            self._complete_replicated(partition, waiting)
        trimming = self._trimmed.get(key)
        if trimming:
            self._complete_trimmed(partition, trimming)

    def _complete_replicated(
        self, partition: Partition, waiting: list[tuple[int, asyncio.Future[ErrorCode]]]
    ) -> None:
        high_watermark = partition.high_watermark
        still = []
        for end, future in waiting:
            if future.done():
                continue
            if end <= high_watermark:
                future.set_result(ErrorCode.none)
            else:
                still.append((end, future))
        key = (partition.topic, partition.index)
        if still:
            self._replicated[key] = still
        else:
            self._replicated.pop(key, None)

    def _not_leader_any_more(self, key: TopicPartition) -> None:
        for _, future in [*self._replicated.pop(key, ()), *self._trimmed.pop(key, ())]:
            if not future.done():
                future.set_result(ErrorCode.not_leader_or_follower)

    # -- the low watermark (DeleteRecords) ------------------------------------------------

    def low_watermark(self, partition: Partition) -> int:
        """Kafka's lowWatermarkIfLeader: the least log start offset of this leader and of
        every follower that is alive (registered and unfenced). A live follower not heard from
        since this node leads counts as -1, so DeleteRecords waits for its next fetch; a fenced
        one does not hold it up, and cannot join the ISR again before it has taken the log
        start (`follower_fetched`), unless it may lead without rejoining: an eligible leader
        replica (KIP-966), or one still in the ISR as this leader knows it (the controller
        may have fenced it and moved it to the ELR already). A DeleteRecords waits for those
        (and times out while they are away), stricter than Kafka, where they bring the
        deleted records back when they lead."""
        lowest = partition.log.log_start_offset
        for replica in partition.state.replicas:
            if replica == self.node_id:
                continue
            broker = self.image.brokers.get(replica)
            may_lead = replica in partition.state.elr or replica in partition.maximal_isr
            if broker is None or (broker.fenced and not may_lead):
                continue
            lowest = min(lowest, partition.follower_starts.get(replica, -1))
        return lowest

    async def wait_for_low_watermark(
        self, topic: str, index: int, offset: int, timeout: float
    ) -> tuple[ErrorCode, int]:
        """DeleteRecords after the leader moved its log start to `offset`: (error, the low
        watermark) once every live replica's log start has passed `offset`, as Kafka's
        DelayedDeleteRecords; REQUEST_TIMED_OUT after `timeout` seconds (the request's own),
        NOT_LEADER_OR_FOLLOWER if this node stops leading meanwhile."""
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return found, -1
        if self.low_watermark(found) < offset:
            key = (topic, index)
            future: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
            self._trimmed.setdefault(key, []).append((offset, future))
            try:
                error = await wait_for(asyncio.shield(future), max(timeout, 0))
            except TimeoutError:
                self._forget(self._trimmed, key, future)
                found = self.get_leader(topic, index)
                low = found if isinstance(found, ErrorCode) else self.low_watermark(found)
                return ErrorCode.request_timed_out, -1 if isinstance(low, ErrorCode) else low
            except asyncio.CancelledError:
                self._forget(self._trimmed, key, future)
                raise
            if error != ErrorCode.none:
                return error, -1
            found = self.get_leader(topic, index)
            if isinstance(found, ErrorCode):
                return found, -1
        return ErrorCode.none, self.low_watermark(found)

    def _complete_trimmed(
        self, partition: Partition, waiting: list[tuple[int, asyncio.Future[ErrorCode]]]
    ) -> None:
        low = self.low_watermark(partition)
        still = []
        for offset, future in waiting:
            if future.done():
                continue
            if offset <= low:
                future.set_result(ErrorCode.none)
            else:
                still.append((offset, future))
        key = (partition.topic, partition.index)
        if still:
            self._trimmed[key] = still
        else:
            self._trimmed.pop(key, None)

    def replicated_now(self, topic: str, index: int, end_offset: int) -> ErrorCode | None:
        """`wait_for_replication`'s answer if there is nothing to wait for (the high watermark
        has passed `end_offset` already: a leader alone in its ISR, or followers that were
        quick), without a task or a turn of the event loop; None when it must wait."""
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return found
        if found.high_watermark < end_offset:
            return None
        if len(found.maximal_isr) < self.min_insync_replicas(topic):
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    async def wait_for_replication(
        self, topic: str, index: int, end_offset: int, timeout: float
    ) -> ErrorCode:
        """acks=all: wait until every in-sync replica has the records before `end_offset`
        (the high watermark passed it). REQUEST_TIMED_OUT after `timeout` seconds (the
        produce's own), NOT_LEADER_OR_FOLLOWER if this node stops leading meanwhile,
        NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR is then below min.insync.replicas."""
        found = self.get_leader(topic, index)
        if isinstance(found, ErrorCode):
            return found
        partition = found
        if partition.high_watermark < end_offset:
            future: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
            self._replicated.setdefault((topic, index), []).append((end_offset, future))
            try:
                error = await wait_for(asyncio.shield(future), max(timeout, 0))
            except TimeoutError:
                self._forget_waiter((topic, index), future)
                return ErrorCode.request_timed_out
            except asyncio.CancelledError:
                self._forget_waiter((topic, index), future)
                raise
            if error != ErrorCode.none:
                return error
        min_isr = self.min_insync_replicas(topic)
        if len(partition.maximal_isr) < min_isr:
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    def _forget_waiter(self, key: TopicPartition, future: asyncio.Future[ErrorCode]) -> None:
        self._forget(self._replicated, key, future)

    @staticmethod
    def _forget(
        table: dict[TopicPartition, list[tuple[int, asyncio.Future[ErrorCode]]]],
        key: TopicPartition,
        future: asyncio.Future[ErrorCode],
    ) -> None:
        """A waiter that gave up (timed out, cancelled) leaves its partition's list."""
        future.cancel()
        waiting = table.get(key)
        if waiting is not None:
            waiting[:] = [(offset, f) for offset, f in waiting if f is not future]
            if not waiting:
                del table[key]
