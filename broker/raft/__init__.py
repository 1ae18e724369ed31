"""KRaft's Raft, sans-io: the core of the metadata quorum (`RaftNode`), the log it keeps and
the messages its members exchange. No sockets, clocks or event loop here: a driver feeds it
messages and time and carries out its `Ready`."""

from .log import RaftLog
from .messages import (
    BeginQuorumEpoch,
    BeginQuorumEpochReply,
    Diverging,
    EndQuorumEpoch,
    Entry,
    Fetch,
    FetchReply,
    FetchSnapshot,
    FetchSnapshotReply,
    Message,
    Snapshot,
    SnapshotId,
    Vote,
    VoteReply,
)
from .node import ElectionState, NotLeader, QuorumTimeouts, RaftNode, Ready, Role

__all__ = [
    "BeginQuorumEpoch",
    "BeginQuorumEpochReply",
    "Diverging",
    "ElectionState",
    "EndQuorumEpoch",
    "Entry",
    "Fetch",
    "FetchReply",
    "FetchSnapshot",
    "FetchSnapshotReply",
    "Message",
    "NotLeader",
    "QuorumTimeouts",
    "RaftLog",
    "RaftNode",
    "Ready",
    "Role",
    "Snapshot",
    "SnapshotId",
    "Vote",
    "VoteReply",
]
