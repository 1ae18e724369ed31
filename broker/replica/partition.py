"""A partition replica as this node holds it, and what operations on one answer.

What it owns: the `Partition` record (its log, its state in the metadata, and what a leader
knows of its followers), the high watermark rule, the result types of appends, fetches and
offset lookups, and the leader epoch check every client-facing operation makes (KIP-320).
What it must never do: act — no appends, no waiting, no event loop; the replica manager's
modules change these records, this one only says what they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker.metadata import PartitionState
from broker.protocol.errors import ErrorCode
from broker.storage import AppendInfo, FileSlice, Log

__all__ = [
    "AppendObserver",
    "AppendResult",
    "FetchResult",
    "OffsetResult",
    "Partition",
    "TopicPartition",
    "epoch_error",
]

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class Partition:
    """A partition this node holds a replica of, as leader or follower."""

    topic: str
    index: int
    log: Log
    state: PartitionState
    node_id: int
    stored_high_watermark: int = 0
    """The high watermark as replication moved it (see `high_watermark`)."""
    follower_ends: dict[int, int] = field(default_factory=dict)
    """As leader: each follower's log end offset, as its latest fetch told (absent: unknown
    since this node became leader)."""
    follower_starts: dict[int, int] = field(default_factory=dict)
    """As leader: each follower's log start offset, as its latest fetch told: DeleteRecords
    answers once every live replica's has passed its offset (`LeaderReplication.low_watermark`)."""
    caught_up_ms: dict[int, int] = field(default_factory=dict)
    """As leader: when each follower was last known to have everything (steady clock)."""
    last_fetch: dict[int, tuple[int, int]] = field(default_factory=dict)
    """As leader: each follower's previous fetch, as (this log's end then, when)."""
    leader_since_ms: int = 0
    leader_start_offset: int = 0
    """As leader: the log end when this node became leader (Kafka's leader epoch start
    offset): a follower joins the ISR only once it has come that far."""
    pending_isr: tuple[int, ...] | None = None
    """An ISR this leader asked the controller for and has not seen committed yet."""
    pending_since_epoch: int = -1
    """The partition epoch `pending_isr` was asked against."""
    min_isr: int = 1
    """The topic's `min.insync.replicas`, at most its replica count (Kafka's effective min
    ISR): below it the high watermark stands still (KIP-966's strict rule), so that a replica
    that left the ISR meanwhile still holds every committed record and may lead."""

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR, with the members a pending expansion adds: the high watermark waits for
        them too, so that a record below it is on every replica that may become leader."""
        if self.pending_isr is None:
            return self.state.isr
        return self.state.isr + tuple(r for r in self.pending_isr if r not in self.state.isr)

    @property
    def is_leader(self) -> bool:
        return self.state.leader == self.node_id

    @property
    def high_watermark(self) -> int:
        """The offset below which every in-sync replica has the records: what consumers may
        read. A leader alone in its ISR has it at its log end (when `min_isr` is 1);
        otherwise replication moves it (`ReplicaManager.follower_fetched` on the leader, the
        leader's answer on a follower), never past this replica's log end."""
        if self.is_leader and self.maximal_isr == (self.node_id,) and self.min_isr <= 1:
            return self.log.log_end_offset
        return min(self.stored_high_watermark, self.log.log_end_offset)

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: ErrorCode
    info: AppendInfo | None = None
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()
    """The records an INVALID_RECORD or INVALID_TIMESTAMP is about, each as (its index in the
    batch, why), in batch order: Produce v8+ lists them all (KIP-467)."""


AppendObserver = Callable[[str, AppendResult, int], None]
"""Told of each produce append: topic, result, and the record batches' size in bytes."""


@dataclass(slots=True)
class FetchResult:
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: FileSlice | None = None
    diverging_epoch: tuple[int, int] | None = None
    """To a follower whose log parted from the leader's: (the epoch, its end offset here) up to
    which the follower's log may be kept (KIP-595's divergence check, as in Kafka 2.7+)."""
    preferred_read_replica: int = -1
    """To a consumer (KIP-392): the replica to fetch from instead (no records then)."""


@dataclass(frozen=True, slots=True)
class OffsetResult:
    error: ErrorCode
    offset: int = -1
    timestamp: int = -1
    leader_epoch: int = -1


def epoch_error(partition: Partition, current_leader_epoch: int) -> ErrorCode | None:
    """KIP-320: a client that knows an older leader epoch is fenced, one that knows a newer
    epoch than this replica has is ahead of it; -1 means the client does not say."""
    if current_leader_epoch < 0 or current_leader_epoch == partition.leader_epoch:
        return None
    if current_leader_epoch < partition.leader_epoch:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.unknown_leader_epoch
