"""The messages voters and observers of the metadata quorum exchange, as the Raft core sees
them: KRaft's Vote (with pre-vote, KIP-996), BeginQuorumEpoch, EndQuorumEpoch, the pull-based
Fetch (KIP-595) and FetchSnapshot (KIP-630), without their wire encoding. The quorum driver
maps them to and from Kafka's request and response bodies; the core never sees bytes of the
protocol.

Every message names its sender and the epoch it was sent in. A reply is matched to its request
by kind and epoch alone: the core keeps no table of requests in flight, so a reply that comes
late, twice or out of order is judged on what it says.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BeginQuorumEpoch",
    "BeginQuorumEpochReply",
    "Diverging",
    "EndQuorumEpoch",
    "Entry",
    "Fetch",
    "FetchReply",
    "FetchSnapshot",
    "FetchSnapshotReply",
    "Message",
    "Snapshot",
    "SnapshotId",
    "Vote",
    "VoteReply",
]


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of the replicated log: what was proposed, and the epoch of the leader that
    appended it. Its offset is its position in the log."""

    epoch: int
    payload: bytes
    control: bool = False
    """Written by the quorum itself (the leader's first entry of its epoch), not proposed."""
    continued: bool = False
    """The next entry belongs to the same proposal: entries proposed together are committed,
    applied, fetched and stored together, never a part of them alone (Kafka's atomic batch)."""


@dataclass(frozen=True, slots=True, order=True)
class SnapshotId:
    """A snapshot of the log below `end_offset`, whose last entry has `epoch` (Kafka's
    `OffsetAndEpoch`, and the name of its `.checkpoint` file)."""

    end_offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state that the entries below `id.end_offset` built, as the state machine wrote it:
    opaque to the core, which only keeps and hands it over whole."""

    id: SnapshotId
    data: bytes


@dataclass(frozen=True, slots=True)
class Vote:
    """Asks for a vote. A pre-vote asks whether the receiver *would* vote for the sender in
    `epoch` and changes nothing on either side: a node cut off from the quorum cannot disrupt
    it by raising the epoch every election timeout (KIP-996)."""

    sender: int
    epoch: int
    """The epoch the sender campaigns in (for a pre-vote: the one it would campaign in)."""
    last_epoch: int
    end_offset: int
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class VoteReply:
    sender: int
    epoch: int
    """The epoch of the request, or the receiver's own if it is higher."""
    granted: bool
    pre_vote: bool
    leader: int | None = None
    """The leader the receiver knows in `epoch`, if any."""


@dataclass(frozen=True, slots=True)
class BeginQuorumEpoch:
    """From a new leader to every voter: it won `epoch`."""

    sender: int
    epoch: int


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochReply:
    """A voter's answer to a BeginQuorumEpoch of an older epoch than its own (Kafka's
    FENCED_LEADER_EPOCH): its epoch, and the leader it knows there. It moves the old leader to
    that epoch, so an election follows in which the voter takes part again."""

    sender: int
    epoch: int
    leader: int | None = None


@dataclass(frozen=True, slots=True)
class EndQuorumEpoch:
    """From a leader that resigns to every voter: elect another now, rather than after the
    fetch timeout. `successors` are the voters it prefers, most caught up first."""

    sender: int
    epoch: int
    successors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Fetch:
    """From a follower or observer to the leader: entries from `fetch_offset`, whose previous
    entry, if any, has `last_fetched_epoch`. Also the follower's acknowledgement that it holds
    everything before `fetch_offset`."""

    sender: int
    epoch: int
    fetch_offset: int
    last_fetched_epoch: int


@dataclass(frozen=True, slots=True)
class Diverging:
    """The fetcher's log disagrees with the leader's from the end of `epoch` on, which in the
    leader's log is `end_offset`: truncate there and fetch again."""

    epoch: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class FetchReply:
    sender: int
    epoch: int
    leader: int | None
    """The leader of `epoch` as the replier knows it (None: not known)."""
    high_watermark: int
    fetch_offset: int
    """The offset the entries start at (the request's)."""
    last_fetched_epoch: int = 0
    """The request's: with `fetch_offset`, which state of the fetcher's log this answers. A
    reply to an older state (a duplicate, or one overtaken by a truncation) is ignored."""
    entries: tuple[Entry, ...] = ()
    diverging: Diverging | None = None
    snapshot: SnapshotId | None = None
    """The fetch offset is below the leader's log start, or its epoch ends there: fetch this
    snapshot instead (FetchSnapshot), then the log after it."""
    rejected: bool = False
    """The replier is not the leader of the request's epoch: nothing was read, and `epoch` and
    `leader` say what it knows instead."""


@dataclass(frozen=True, slots=True)
class FetchSnapshot:
    """From a follower or observer to the leader: the bytes of snapshot `id` from `position`."""

    sender: int
    epoch: int
    id: SnapshotId
    position: int


@dataclass(frozen=True, slots=True)
class FetchSnapshotReply:
    sender: int
    epoch: int
    leader: int | None
    id: SnapshotId
    size: int
    """The snapshot's whole size in bytes."""
    position: int
    chunk: bytes = b""
    missing: bool = False
    """The leader no longer has that snapshot (it took a newer one): fetch again."""
    rejected: bool = False
    """As for `FetchReply`: the replier is not the leader of the request's epoch."""


Message = (
    Vote
    | VoteReply
    | BeginQuorumEpoch
    | BeginQuorumEpochReply
    | EndQuorumEpoch
    | Fetch
    | FetchReply
    | FetchSnapshot
    | FetchSnapshotReply
)
