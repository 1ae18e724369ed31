"""The messages voters and observers of the metadata quorum exchange, as the Raft core sees
them: KRaft's Vote (with pre-vote, KIP-996), BeginQuorumEpoch, EndQuorumEpoch and the
pull-based Fetch (KIP-595), without their wire encoding. The quorum driver maps them to and from
Kafka's request and response bodies; the core never sees bytes of the protocol.

Every message names its sender and the epoch it was sent in. A reply is matched to its request
by kind and epoch alone: the core keeps no table of requests in flight, so a reply that comes
late, twice or out of order is judged on what it says.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BeginQuorumEpoch",
    "Diverging",
    "EndQuorumEpoch",
    "Entry",
    "Fetch",
    "FetchReply",
    "Message",
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
    entries: tuple[Entry, ...] = ()
    diverging: Diverging | None = None
    rejected: bool = False
    """The replier is not the leader of the request's epoch: nothing was read, and `epoch` and
    `leader` say what it knows instead."""


Message = Vote | VoteReply | BeginQuorumEpoch | EndQuorumEpoch | Fetch | FetchReply
