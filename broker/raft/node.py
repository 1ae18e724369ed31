"""One member of the metadata quorum as a pure state machine: KRaft's Raft (KIP-595, with
KIP-996's pre-vote), without sockets, clocks or an event loop.

Like etcd's raft, it is driven from outside:
- `step(message, now_ms)`, `tick(now_ms)` and `propose(payloads, now_ms)` change its state;
- `ready()` hands out what that requires, and the driver does it in this order: persist the
  election state, install a snapshot fetched from the leader, truncate and append the log on
  disk, delete what a snapshot holds, send the messages, then apply the entries below the high
  watermark;
- `advance()` says the disk has it, which may commit more;
- `unreachable(peer, now_ms)` says a request to `peer` failed without an answer (the
  connection was refused or broke), as etcd's `ReportUnreachable`: a fetch is then retried
  after `retry_backoff_ms` rather than after the request timeout;
- `take_snapshot(end_offset, data)` says the state machine has written a snapshot of the
  entries below `end_offset`: the log then starts there (KIP-630). When to take one is the
  driver's policy (`metadata.log.max.record.bytes.between.snapshots`).

A vote is never sent before the election state that records it is on disk, and a fetch that
acknowledges entries is never sent before they are: both are in the same `Ready`, persisted
first. Time comes in as `now_ms`; randomness (the election timeouts' jitter) from the `Random`
the driver passes, so a seeded simulation replays exactly.

The rules, as Kafka's `KafkaRaftClient` applies them:
1. A message from a higher epoch moves this node to that epoch first (as a follower if it
   names the leader, else unattached); one from a lower epoch is answered with this node's
   epoch and otherwise ignored.
2. A voter that hears nothing from a leader for the fetch timeout (a follower), or for an
   election timeout (anyone else), becomes prospective and asks for pre-votes; only with a
   majority of them does it raise the epoch and ask for votes (candidate).
3. A voter grants one vote per epoch, to a candidate whose log is at least as up to date; it
   grants a pre-vote when it has no live leader and the same log condition holds.
4. A candidate with a majority of votes leads: it appends a control entry in its epoch and
   tells every voter (BeginQuorumEpoch), again every half fetch timeout to a voter that has
   not fetched since: one that went to a higher epoch alone (an election nobody heard)
   answers with it, which moves the leader there (rule 1) and starts an election it takes
   part in. Followers and observers pull entries with Fetch.
5. A fetch whose last entry does not match the leader's log is answered with where they
   diverge; the fetcher truncates there. Only voters' fetches count towards the high
   watermark: the largest offset a majority of voters holds, once it covers the leader's
   first entry of its epoch.
6. A leader that has not been fetched from by a majority for 1.5 fetch timeouts resigns
   (check quorum), and one that resigns tells the voters to elect another (EndQuorumEpoch).
7. A fetch below the leader's log start, at the start with another epoch than the snapshot's,
   or with an older epoch than the snapshot's, is answered with the leader's latest snapshot
   id; the fetcher fetches that snapshot in chunks (FetchSnapshot), installs it in place of its
   whole log, and fetches on from its end. A snapshot only ever holds committed entries, so
   installing one commits them. A reply is acted on only if it answers the fetcher's log as it
   is now (its fetch offset and last epoch), and no log reply while a snapshot is fetched.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

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

__all__ = ["ElectionState", "NotLeader", "QuorumTimeouts", "RaftNode", "Ready", "Role"]

_Why = Literal["entries", "deadline", "all"]


class Role(enum.Enum):
    UNATTACHED = "unattached"
    PROSPECTIVE = "prospective"
    CANDIDATE = "candidate"
    LEADER = "leader"
    FOLLOWER = "follower"
    RESIGNED = "resigned"


@dataclass(frozen=True, slots=True)
class ElectionState:
    """What a node must remember across restarts (Kafka's `quorum-state` file): its epoch,
    whom it voted for in it, and the leader it knows in it."""

    epoch: int = 0
    voted_for: int | None = None
    leader: int | None = None


@dataclass(frozen=True, slots=True)
class QuorumTimeouts:
    """Kafka's `controller.quorum.*` settings, in milliseconds, with Kafka's defaults."""

    election_ms: int = 1000
    """`election.timeout.ms`: how long without a leader before campaigning, plus a random
    part of up to as much again, so that voters rarely campaign at once."""
    fetch_ms: int = 2000
    """`fetch.timeout.ms`: how long a follower waits for its leader before campaigning."""
    election_backoff_max_ms: int = 1000
    """`election.backoff.max.ms`: the longest wait before retrying a failed election."""
    request_ms: int = 2000
    """`request.timeout.ms`: a fetch unanswered for this long is sent again."""
    retry_backoff_ms: int = 20
    """`retry.backoff.ms`: after a fetch that failed without an answer (`unreachable`), how
    long before the next."""
    fetch_wait_ms: int = 500
    """How long a leader holds a fetch it has nothing new for (Kafka's raft fetch max wait)."""
    fetch_max_entries: int = 10_000
    """Entries per fetch reply (and on to the end of the proposal the last one is in): as
    many as one controller operation writes (Kafka's fetches carry up to 8 MiB), so that a
    decision written in many small proposals reaches the followers in one round trip."""
    snapshot_chunk_bytes: int = 8 * 1024 * 1024
    """Bytes of a snapshot per FetchSnapshot reply (Kafka's raft client asks for 8 MiB)."""


class NotLeader(Exception):
    """Proposed to a node that does not lead; `leader` is the one it knows, if any."""

    def __init__(self, leader: int | None) -> None:
        super().__init__(f"not the leader (the leader is {leader})")
        self.leader = leader


@dataclass(slots=True)
class Ready:
    """What the driver must do, in field order (see the module's docstring)."""

    election: ElectionState | None = None
    """Persist this election state first, when set."""
    install: Snapshot | None = None
    """Then, when set, persist this snapshot (fetched from the leader), load it into the state
    machine and drop the whole disk log: it starts again at the snapshot's end. It always ends
    past the node's high watermark. If the driver dies between persisting it and dropping the
    log, it must find out on restart: a log whose entry before the latest snapshot's end is
    missing or of another epoch does not continue that snapshot and goes whole."""
    truncate_to: int | None = None
    """Then drop the disk log's entries from this offset on, when set."""
    append_from: int = 0
    entries: tuple[Entry, ...] = ()
    """Then append these entries, the first at offset `append_from`."""
    delete_before: int | None = None
    """Then, when set, delete the disk log's entries below this offset: the snapshot the driver
    persisted before `take_snapshot` holds them."""
    messages: list[tuple[int, Message]] = field(default_factory=list)
    """Then send each message to its node."""
    high_watermark: int | None = None
    """Then apply the entries below this offset, when set (it only grows)."""

    def __bool__(self) -> bool:
        return bool(
            self.election is not None
            or self.install is not None
            or self.truncate_to is not None
            or self.entries
            or self.delete_before is not None
            or self.messages
            or self.high_watermark is not None
        )


class RaftNode:
    def __init__(
        self,
        node_id: int,
        voters: Sequence[int],
        *,
        election: ElectionState = ElectionState(),
        snapshot: Snapshot | None = None,
        entries: Sequence[Entry] = (),
        timeouts: QuorumTimeouts = QuorumTimeouts(),
        rng: random.Random,
        now_ms: int,
    ) -> None:
        """Restart from what was persisted: the election state, the latest snapshot (the driver
        loads it into the state machine) and the log on disk after it. The high watermark is
        not persisted: it starts at the snapshot's end, and the leader says the rest again."""
        self.id = node_id
        self.voters = frozenset(voters)
        self._timeouts = timeouts
        self._rng = rng
        self.log = RaftLog(entries, start=None if snapshot is None else snapshot.id)
        self.snapshot = snapshot
        """The latest snapshot: what a fetcher below the log start is sent."""
        self.election = election
        self.high_watermark = self.log.start_offset
        self._persisted = election
        self._persisted_end = self.log.end_offset
        self._changed_from: int | None = None
        """The lowest log offset changed since the last `ready`."""
        self._outbox: list[tuple[int, Message]] = []
        self._reported_high_watermark = self.high_watermark
        self._install: Snapshot | None = None
        """A snapshot fetched whole, for the next `ready` to install."""
        self._delete_before: int | None = None
        self._snapshot_fetch: tuple[SnapshotId, bytearray] | None = None
        """Follower: the snapshot being fetched from the leader, and its bytes so far."""
        # Per role; see `_become`.
        self.role = Role.UNATTACHED
        self._votes: set[int] = set()
        self._election_deadline = 0
        self._leader_deadline = 0
        self._heard_from_leader: int | None = None
        """When the leader last answered a fetch or announced itself; not when a hint named
        it (a hint may be stale, and a voter that counted it as a live leader would refuse
        pre-votes for a leader that is gone)."""
        self._fetch_due = 0
        self._fetch_sent_at: int | None = None
        self._fetch_target: int | None = None  # where the fetch in flight went
        self._epoch_start = 0
        self._acknowledged: dict[int, int] = {}
        """Leader: each voter's fetch offset in this epoch (its own: what is on disk)."""
        self._last_fetch: dict[int, int] = {}
        self._begin_sent: dict[int, int] = {}
        """Leader: when it last sent each voter BeginQuorumEpoch."""
        self._parked: dict[int, tuple[Fetch, int]] = {}
        """Leader: fetches with nothing to return yet, by fetcher, with their deadlines."""
        self.leader_high_watermark: int | None = None
        """Follower and observer: the leader's high watermark in its latest reply that
        continued this node's log; None until one has (a restart does not know the
        committed log's end before it hears from a leader)."""
        self._fetchers: dict[int, tuple[int, int]] = {}
        """Leader: each fetcher's (fetch offset, time of its last fetch) in this epoch, for
        DescribeQuorum; observers included."""
        if self.voters == {node_id}:
            # The only voter needs nobody's vote: it campaigns at once, as Kafka's does.
            self._become(Role.PROSPECTIVE, now_ms)
        elif election.leader == node_id:
            self._become(Role.RESIGNED, now_ms)
        elif election.leader is not None:
            self._become(Role.FOLLOWER, now_ms)
        else:
            self._become(Role.UNATTACHED, now_ms)

    # -- what the driver sees ---------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.election.epoch

    @property
    def leader(self) -> int | None:
        return self.election.leader

    @property
    def is_voter(self) -> bool:
        return self.id in self.voters

    @property
    def epoch_start(self) -> int:
        """Leader: the offset of its first entry of this epoch. Entries below it are all
        applied once the high watermark passes it."""
        return self._epoch_start

    def progress(self, now_ms: int) -> dict[int, tuple[int, int]]:
        """Leader: each fetcher's (fetch offset, time of its last fetch in ms) in this epoch,
        itself included (its log end on disk, now); empty elsewhere."""
        if self.role is not Role.LEADER:
            return {}
        return self._fetchers | {self.id: (self._persisted_end, now_ms)}

    @property
    def _majority(self) -> int:
        return len(self.voters) // 2 + 1

    def ready(self) -> Ready:
        """What to persist, send and apply since the last call; call `advance` once done."""
        ready = Ready(messages=self._outbox)
        self._outbox = []
        if self.election != self._persisted:
            ready.election = self._persisted = self.election
        ready.install, self._install = self._install, None
        ready.delete_before, self._delete_before = self._delete_before, None
        if self._changed_from is not None:
            start = self._changed_from
            if start < self._persisted_end:
                ready.truncate_to = start
            ready.append_from = start
            ready.entries = self.log.read(start, self.log.end_offset - start)
            self._changed_from = None
        if self.high_watermark > self._reported_high_watermark:
            ready.high_watermark = self._reported_high_watermark = self.high_watermark
        return ready

    def advance(self, now_ms: int) -> None:
        """The last `ready` is done: its entries are on disk, which counts for the leader."""
        self._persisted_end = self.log.end_offset
        if self.role is Role.LEADER:
            self._acknowledged[self.id] = self._persisted_end
            self._update_high_watermark(now_ms)

    def propose(self, payloads: Sequence[bytes], now_ms: int) -> int:
        """Append entries in the leader's epoch, as one proposal; the offset of the first.
        Committed together, once the high watermark passes them all (it never stops inside
        a proposal). Raises `NotLeader` elsewhere."""
        return self.propose_parts((payloads,), now_ms)

    def propose_parts(self, parts: Sequence[Sequence[bytes]], now_ms: int) -> int:
        """`propose` each part, one after the other, in one step: each part is a proposal of
        its own (committed and applied whole, maybe without the parts after it), and the
        fetches waiting for entries are answered once, with all of them."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        first = self.log.end_offset
        entries = []
        for part in parts:
            last = len(part) - 1
            entries += [Entry(self.epoch, p, continued=i < last) for i, p in enumerate(part)]
        self._append(entries)
        self._answer_parked(now_ms, why="entries")
        return first

    def take_snapshot(self, end_offset: int, data: bytes) -> SnapshotId:
        """The state machine has persisted `data`, its state after applying every entry below
        `end_offset` (committed and on disk): the log now starts there, and a fetcher below it
        is sent this snapshot. The next `ready` says which disk entries may go."""
        log = self.log
        if not (log.start_offset < end_offset <= self.high_watermark):
            raise ValueError(
                f"a snapshot must end after the log start {log.start_offset} and at or below "
                f"the high watermark {self.high_watermark}, not at {end_offset}"
            )
        if end_offset > self._persisted_end or (
            self._changed_from is not None and self._changed_from < end_offset
        ):
            raise ValueError(f"the entries below {end_offset} are not all on disk yet")
        snapshot_id = SnapshotId(end_offset, log.epoch_at(end_offset - 1))
        self.snapshot = Snapshot(snapshot_id, data)
        log.compact(snapshot_id)
        self._delete_before = end_offset
        return snapshot_id

    def resign(self, now_ms: int) -> None:
        """Step down gracefully (a controlled shutdown): tell the voters to elect another."""
        if self.role is Role.LEADER:
            self._resign(now_ms)

    def unreachable(self, peer: int, now_ms: int) -> None:
        """A request to `peer` failed without an answer. A fetch to it is given up, and the
        next goes out after the retry backoff: a voter retries its leader until the fetch
        timeout (Kafka's rule); an observer asks the voters again at once, so it finds a new
        leader soon after the election instead of a timeout per dead node it tries."""
        if self._fetch_sent_at is None or self._fetch_target != peer:
            return
        if not self.is_voter and self.role is Role.FOLLOWER and peer == self.leader:
            # An observer's leader is gone, or a voter that had not noticed named it: ask
            # the voters who leads now instead of waiting out the fetch timeout.
            self._follow_nobody(now_ms)
        self._fetch_sent_at = None
        self._fetch_due = now_ms + self._timeouts.retry_backoff_ms

    # -- time -------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        role = self.role
        if role is Role.LEADER:
            self._answer_parked(now_ms, why="deadline")
            if self._quorum_lost(now_ms):
                self._resign(now_ms)
                return
            self._remind_voters(now_ms)
            return
        if role is Role.FOLLOWER:
            if now_ms >= self._leader_deadline:
                if self.is_voter:
                    self._become(Role.PROSPECTIVE, now_ms)
                else:
                    self._follow_nobody(now_ms)
                return
            self._maybe_fetch(now_ms)
            return
        if not self.is_voter:
            self._maybe_fetch(now_ms)  # an observer looks for the leader among the voters
            return
        if now_ms < self._election_deadline:
            return
        if role in (Role.PROSPECTIVE, Role.CANDIDATE):
            # No majority in time: wait a random backoff as unattached, then ask again.
            self._become(Role.UNATTACHED, now_ms, keep_epoch=True)
            backoff = self._rng.randint(0, self._timeouts.election_backoff_max_ms)
            self._election_deadline = now_ms + backoff
        else:
            self._become(Role.PROSPECTIVE, now_ms)

    # -- messages ---------------------------------------------------------------------------

    def step(self, message: Message, now_ms: int) -> None:
        if message.epoch > self.epoch and not self._is_pre_vote(message):
            leader = _leader_named(message)
            if leader is not None and leader != self.id:
                self._follow(message.epoch, leader, now_ms)
            else:
                self._unattach(message.epoch, now_ms)
        if isinstance(message, Vote):
            self._on_vote(message, now_ms)
        elif isinstance(message, VoteReply):
            self._on_vote_reply(message, now_ms)
        elif isinstance(message, BeginQuorumEpoch):
            self._on_begin(message, now_ms)
        elif isinstance(message, BeginQuorumEpochReply):
            pass  # its epoch, if higher, has moved this node on (rule 1)
        elif isinstance(message, EndQuorumEpoch):
            self._on_end(message, now_ms)
        elif isinstance(message, Fetch):
            self._on_fetch(message, now_ms)
        elif isinstance(message, FetchReply):
            self._on_fetch_reply(message, now_ms)
        elif isinstance(message, FetchSnapshot):
            self._on_fetch_snapshot(message, now_ms)
        else:
            self._on_fetch_snapshot_reply(message, now_ms)

    @staticmethod
    def _is_pre_vote(message: Message) -> bool:
        return isinstance(message, (Vote, VoteReply)) and message.pre_vote

    def _on_vote(self, request: Vote, now_ms: int) -> None:
        if request.pre_vote:
            # Would this node vote for the sender in the epoch it names? It changes nothing.
            granted = (
                request.epoch > self.epoch
                and not self._has_live_leader(now_ms)
                and self.log.up_to_date(request.last_epoch, request.end_offset)
            )
            # A grant speaks of the epoch asked about, where no leader is known; a refusal
            # of this node's own epoch and the leader it knows there.
            if granted:
                reply = VoteReply(self.id, request.epoch, True, True)
            else:
                reply = VoteReply(self.id, self.epoch, False, True, self.leader)
            self._send(request.sender, reply)
            return
        if request.epoch < self.epoch:
            self._send(request.sender, VoteReply(self.id, self.epoch, False, False, self.leader))
            return
        granted = (
            self.is_voter
            and self.leader is None
            and self.election.voted_for in (None, request.sender)
            and self.log.up_to_date(request.last_epoch, request.end_offset)
        )
        if granted:
            self.election = ElectionState(self.epoch, request.sender, None)
            self._election_deadline = now_ms + self._election_timeout()
        self._send(request.sender, VoteReply(self.id, self.epoch, granted, False, self.leader))

    def _on_vote_reply(self, reply: VoteReply, now_ms: int) -> None:
        if reply.pre_vote:
            if self.role is not Role.PROSPECTIVE:
                return
            if reply.leader is not None and reply.leader != self.id and reply.epoch >= self.epoch:
                self._follow(reply.epoch, reply.leader, now_ms)
                return
            if reply.granted and reply.epoch == self.epoch + 1:
                self._votes.add(reply.sender)
                if len(self._votes) >= self._majority:
                    self._become(Role.CANDIDATE, now_ms)
            elif reply.epoch > self.epoch:
                self._unattach(reply.epoch, now_ms)
            return
        if self.role is Role.CANDIDATE and reply.epoch == self.epoch and reply.granted:
            self._votes.add(reply.sender)
            if len(self._votes) >= self._majority:
                self._become(Role.LEADER, now_ms)

    def _on_begin(self, message: BeginQuorumEpoch, now_ms: int) -> None:
        if message.epoch < self.epoch:
            self._send(message.sender, BeginQuorumEpochReply(self.id, self.epoch, self.leader))
            return
        if self.leader != message.sender or self.role is not Role.FOLLOWER:
            self._follow(message.epoch, message.sender, now_ms)
        self._heard_from_leader = now_ms

    def _on_end(self, message: EndQuorumEpoch, now_ms: int) -> None:
        if message.epoch != self.epoch or self.leader != message.sender or not self.is_voter:
            return
        # Campaign soon, the preferred successors first, instead of after the fetch timeout.
        rank = (
            message.successors.index(self.id)
            if self.id in message.successors
            else len(message.successors)
        )
        self.election = ElectionState(self.epoch, self.election.voted_for, None)
        self._become(Role.UNATTACHED, now_ms, keep_epoch=True)
        step = self._timeouts.election_backoff_max_ms // len(self.voters)
        self._election_deadline = now_ms + rank * step

    def _on_fetch(self, request: Fetch, now_ms: int) -> None:
        if self.role is not Role.LEADER or request.epoch != self.epoch:
            leader = None if self.role is Role.RESIGNED else self.leader
            self._reply_to_fetch(request, leader, rejected=True)
            return
        if request.sender in self.voters:
            self._last_fetch[request.sender] = now_ms
        self._fetchers[request.sender] = (request.fetch_offset, now_ms)
        found = self._validate(request)
        if isinstance(found, SnapshotId):
            self._reply_to_fetch(request, self.id, snapshot=found)
            return
        if found is not None:
            self._reply_to_fetch(request, self.id, diverging=found)
            return
        if request.sender in self.voters:
            known = self._acknowledged.get(request.sender, 0)
            self._acknowledged[request.sender] = max(known, request.fetch_offset)
            self._update_high_watermark(now_ms)
        if request.fetch_offset < self.log.end_offset:
            self._answer_fetch(request)
        else:
            self._parked[request.sender] = (request, now_ms + self._timeouts.fetch_wait_ms)

    def _validate(self, request: Fetch) -> Diverging | SnapshotId | None:
        """None if the fetcher's log matches this one up to its fetch offset; else where it
        diverges, or the snapshot to fetch (Kafka's `validateOffsetAndEpoch`)."""
        log = self.log
        offset, epoch = request.fetch_offset, request.last_fetched_epoch
        if offset == 0 and log.start_offset == 0:
            return None
        if log.start_offset > 0 and (
            offset < log.start_offset
            or (offset == log.start_offset and epoch != log.start_epoch)
            or epoch < log.start_epoch
        ):
            assert self.snapshot is not None  # the log starts after one
            return self.snapshot.id
        last_epoch, end = log.end_offset_for_epoch(epoch)
        if last_epoch != epoch or offset > end:
            return Diverging(last_epoch, end)
        return None

    def _answer_fetch(self, request: Fetch) -> None:
        self._parked.pop(request.sender, None)
        entries = self.log.read(request.fetch_offset, self._timeouts.fetch_max_entries)
        self._reply_to_fetch(request, self.id, entries=entries)

    def _reply_to_fetch(
        self,
        request: Fetch,
        leader: int | None,
        *,
        entries: tuple[Entry, ...] = (),
        diverging: Diverging | None = None,
        snapshot: SnapshotId | None = None,
        rejected: bool = False,
    ) -> None:
        reply = FetchReply(
            self.id,
            self.epoch,
            leader,
            self.high_watermark,
            request.fetch_offset,
            request.last_fetched_epoch,
            entries=entries,
            diverging=diverging,
            snapshot=snapshot,
            rejected=rejected,
        )
        self._send(request.sender, reply)

    def _on_fetch_snapshot(self, request: FetchSnapshot, now_ms: int) -> None:
        if self.role is not Role.LEADER or request.epoch != self.epoch:
            leader = None if self.role is Role.RESIGNED else self.leader
            self._reply_to_fetch_snapshot(request, leader, rejected=True)
            return
        if request.sender in self.voters:
            self._last_fetch[request.sender] = now_ms
        snapshot = self.snapshot
        if snapshot is None or snapshot.id != request.id:
            self._reply_to_fetch_snapshot(request, self.id, missing=True)
            return
        end = request.position + self._timeouts.snapshot_chunk_bytes
        self._reply_to_fetch_snapshot(
            request,
            self.id,
            size=len(snapshot.data),
            chunk=snapshot.data[request.position : end],
        )

    def _reply_to_fetch_snapshot(
        self,
        request: FetchSnapshot,
        leader: int | None,
        *,
        size: int = 0,
        chunk: bytes = b"",
        missing: bool = False,
        rejected: bool = False,
    ) -> None:
        reply = FetchSnapshotReply(
            self.id,
            self.epoch,
            leader,
            request.id,
            size,
            request.position,
            chunk,
            missing=missing,
            rejected=rejected,
        )
        self._send(request.sender, reply)

    def _answer_parked(self, now_ms: int, *, why: _Why) -> None:
        """Answer the parked fetches that have entries now ("entries"), also those whose wait
        is over ("deadline"), or all of them: the high watermark moved ("all")."""
        for request, deadline in list(self._parked.values()):
            if (
                why == "all"
                or request.fetch_offset < self.log.end_offset
                or (why == "deadline" and now_ms >= deadline)
            ):
                self._answer_fetch(request)

    def _from_leader(self, reply: FetchReply | FetchSnapshotReply, now_ms: int) -> bool:
        """Whether `reply` is an answer from the leader this node follows to carry on with; a
        refusal, or one from elsewhere, may make it follow the leader it names instead."""
        if self.role not in (Role.FOLLOWER, Role.UNATTACHED):
            return False
        if reply.epoch < self.epoch:
            if reply.sender == self._fetch_target and self._fetch_sent_at is not None:
                # An answer from a voter behind this node (it learnt the new epoch from
                # another): nothing to follow there, so ask again soon, not after a timeout.
                self._fetch_sent_at = None
                self._fetch_due = now_ms + self._timeouts.retry_backoff_ms
            return False
        if reply.rejected:
            self._fetch_sent_at = None
            if reply.leader is not None and reply.leader != self.id and reply.epoch >= self.epoch:
                self._follow(reply.epoch, reply.leader, now_ms)
            else:
                self._fetch_due = now_ms + self._timeouts.election_backoff_max_ms // 10
            return False
        if reply.sender != self.leader:
            if self.role is Role.UNATTACHED and not self.is_voter and reply.leader is not None:
                self._follow(reply.epoch, reply.leader, now_ms)
            return False
        self._fetch_sent_at = None
        self._leader_deadline = now_ms + self._timeouts.fetch_ms
        self._heard_from_leader = now_ms
        self._fetch_due = now_ms
        return True

    def _on_fetch_reply(self, reply: FetchReply, now_ms: int) -> None:
        if not self._from_leader(reply, now_ms):
            return
        fetching = self._snapshot_fetch
        current = (reply.fetch_offset, reply.last_fetched_epoch) == (
            self.log.end_offset,
            self.log.last_epoch,
        )
        if not current:
            pass  # answers a fetch from a log this node no longer has (a duplicate, a retry)
        elif reply.snapshot is not None:
            # Below the leader's log start: fetch its snapshot (a newer one than any under way).
            newer = fetching is None or reply.snapshot > fetching[0]
            held = max(self.log.start_offset, self.high_watermark)
            if newer and reply.snapshot.end_offset > held:
                self._snapshot_fetch = (reply.snapshot, bytearray())
        elif fetching is not None:
            pass  # a snapshot is being fetched: it replaces the log, which must wait for it
        elif reply.diverging is not None:
            _, local_end = self.log.end_offset_for_epoch(reply.diverging.epoch)
            end = min(reply.diverging.end_offset, local_end, self.log.end_offset)
            self._truncate(max(end, self.high_watermark))
        else:
            self._append(reply.entries)
            # The leader checked this log up to the fetch offset; it now matches the leader's
            # up to the end of these entries, and no further is known to match.
            matched = reply.fetch_offset + len(reply.entries)
            committed = self.log.proposal_boundary(min(reply.high_watermark, matched))
            self.high_watermark = max(self.high_watermark, committed)
            self.leader_high_watermark = reply.high_watermark
        self._maybe_fetch(now_ms)

    def _on_fetch_snapshot_reply(self, reply: FetchSnapshotReply, now_ms: int) -> None:
        if not self._from_leader(reply, now_ms):
            return
        fetching = self._snapshot_fetch
        if fetching is not None and fetching[0] == reply.id:
            snapshot_id, received = fetching
            if reply.missing or snapshot_id.end_offset <= max(
                self.log.start_offset, self.high_watermark
            ):
                # The leader has a newer one (fetch to learn it), or this node has come to
                # hold everything this one does.
                self._snapshot_fetch = None
            elif reply.position == len(received):
                received += reply.chunk
                if len(received) >= reply.size:
                    self._install_snapshot(Snapshot(snapshot_id, bytes(received[: reply.size])))
        self._maybe_fetch(now_ms)

    def _install_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the whole log with a snapshot fetched from the leader. A leader's snapshot
        holds only committed entries, so they are committed here too."""
        end = snapshot.id.end_offset
        self._snapshot_fetch = None
        self._delete_before = None  # the install drops the whole disk log anyway
        self.snapshot = self._install = snapshot
        self.log.reset(snapshot.id)
        self._changed_from = None
        self._persisted_end = end  # the disk log goes with the install
        self.high_watermark = max(self.high_watermark, end)
        self._reported_high_watermark = max(self._reported_high_watermark, end)

    # -- transitions ------------------------------------------------------------------------

    def _become(self, role: Role, now_ms: int, *, keep_epoch: bool = False) -> None:
        self.role = role
        self._votes = set()
        self._parked = {}
        self._fetch_sent_at = None
        self._snapshot_fetch = None
        timeouts = self._timeouts
        if role is Role.PROSPECTIVE:
            self.election = ElectionState(self.epoch, self.election.voted_for, None)
            self._election_deadline = now_ms + self._election_timeout()
            self._votes = {self.id}
            self._ask_for_votes(pre_vote=True)
            if len(self._votes) >= self._majority:
                self._become(Role.CANDIDATE, now_ms)
        elif role is Role.CANDIDATE:
            self.election = ElectionState(self.epoch + 1, self.id, None)
            self._election_deadline = now_ms + self._election_timeout()
            self._votes = {self.id}
            self._ask_for_votes(pre_vote=False)
            if len(self._votes) >= self._majority:
                self._become(Role.LEADER, now_ms)
        elif role is Role.LEADER:
            self.election = ElectionState(self.epoch, self.id, self.id)
            self._epoch_start = self.log.end_offset
            self._acknowledged = {self.id: self._persisted_end}
            self._last_fetch = {self.id: now_ms}
            self._fetchers = {}
            self._leader_deadline = now_ms
            self._append([Entry(self.epoch, b"", control=True)])
            self._begin_sent = {}
            self._remind_voters(now_ms)
            self._update_high_watermark(now_ms)
        elif role is Role.FOLLOWER:
            self._leader_deadline = now_ms + timeouts.fetch_ms
            self._fetch_due = now_ms
            self._maybe_fetch(now_ms)
        elif role is Role.RESIGNED:
            self._election_deadline = now_ms + self._election_timeout()
        else:  # UNATTACHED
            if not keep_epoch:
                self._election_deadline = now_ms + self._election_timeout()
            self._fetch_due = now_ms

    def _remind_voters(self, now_ms: int) -> None:
        """BeginQuorumEpoch to each voter that has not fetched in this epoch for half a fetch
        timeout, at most that often (rule 4): at once when elected, then as Kafka's leader
        resends it to voters that have not acknowledged it."""
        every = self._timeouts.fetch_ms // 2
        for voter in sorted(self.voters - {self.id}):
            fetched = self._last_fetch.get(voter)
            if fetched is not None and now_ms - fetched < every:
                continue
            sent = self._begin_sent.get(voter)
            if sent is not None and now_ms - sent < every:
                continue
            self._begin_sent[voter] = now_ms
            self._send(voter, BeginQuorumEpoch(self.id, self.epoch))

    def _unattach(self, epoch: int, now_ms: int) -> None:
        self.election = ElectionState(epoch)
        self._become(Role.UNATTACHED, now_ms)

    def _follow(self, epoch: int, leader: int, now_ms: int) -> None:
        voted_for = self.election.voted_for if epoch == self.epoch else None
        if (epoch, leader) != (self.epoch, self.leader):
            self._heard_from_leader = None
        self.election = ElectionState(epoch, voted_for, leader)
        self._become(Role.FOLLOWER, now_ms)

    def _follow_nobody(self, now_ms: int) -> None:
        """An observer whose leader went silent looks for the current one among the voters."""
        self.election = ElectionState(self.epoch, self.election.voted_for, None)
        self._become(Role.UNATTACHED, now_ms)

    def _resign(self, now_ms: int) -> None:
        by_progress = sorted(
            (voter for voter in self.voters if voter != self.id),
            key=lambda voter: -self._acknowledged.get(voter, 0),
        )
        for voter in by_progress:
            self._send(voter, EndQuorumEpoch(self.id, self.epoch, tuple(by_progress)))
        self._become(Role.RESIGNED, now_ms)

    def _ask_for_votes(self, *, pre_vote: bool) -> None:
        epoch = self.epoch + 1 if pre_vote else self.epoch
        for voter in sorted(self.voters - {self.id}):
            self._send(
                voter,
                Vote(self.id, epoch, self.log.last_epoch, self.log.end_offset, pre_vote),
            )

    # -- helpers ----------------------------------------------------------------------------

    def _election_timeout(self) -> int:
        election = self._timeouts.election_ms
        return election + self._rng.randint(0, election)

    def _has_live_leader(self, now_ms: int) -> bool:
        if self.role is Role.LEADER:
            return True
        heard = self._heard_from_leader
        return (
            self.role is Role.FOLLOWER
            and heard is not None
            and now_ms - heard < self._timeouts.fetch_ms
        )

    def _quorum_lost(self, now_ms: int) -> bool:
        """Check quorum: a majority of voters, this one included, fetched recently."""
        window = self._timeouts.fetch_ms * 3 // 2
        if now_ms - self._leader_deadline < window:
            return False  # a new leader gives the voters a full window to find it
        recent = sum(
            1
            for voter in self.voters
            if voter == self.id or now_ms - self._last_fetch.get(voter, -window) < window
        )
        return recent < self._majority

    def _maybe_fetch(self, now_ms: int) -> None:
        if self._fetch_sent_at is not None:
            if now_ms - self._fetch_sent_at < self._timeouts.request_ms:
                return
        elif now_ms < self._fetch_due:
            return
        target = self.leader
        fetching = self._snapshot_fetch
        if target is not None and fetching is not None:
            snapshot_id, received = fetching
            self._send(target, FetchSnapshot(self.id, self.epoch, snapshot_id, len(received)))
            self._fetch_sent_at, self._fetch_target = now_ms, target
            return
        if target is None:
            candidates = sorted(self.voters - {self.id})
            if not candidates:
                return
            target = self._rng.choice(candidates)
        last_epoch = self.log.last_epoch
        self._send(target, Fetch(self.id, self.epoch, self.log.end_offset, last_epoch))
        self._fetch_sent_at, self._fetch_target = now_ms, target

    def _update_high_watermark(self, now_ms: int) -> None:
        offsets = sorted((self._acknowledged.get(voter, 0) for voter in self.voters), reverse=True)
        committed = self.log.proposal_boundary(offsets[self._majority - 1])
        if committed > self._epoch_start and committed > self.high_watermark:
            self.high_watermark = committed
            self._answer_parked(now_ms, why="all")

    def _append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        start = self.log.end_offset
        self.log.append(entries)
        if self._changed_from is None or start < self._changed_from:
            self._changed_from = start

    def _truncate(self, end_offset: int) -> None:
        if end_offset >= self.log.end_offset:
            return
        self.log.truncate(end_offset)
        if self._changed_from is None or end_offset < self._changed_from:
            self._changed_from = end_offset

    def _send(self, to: int, message: Message) -> None:
        self._outbox.append((to, message))


def _leader_named(message: Message) -> int | None:
    """The leader of the message's epoch that the message names, if any."""
    if isinstance(message, BeginQuorumEpoch):
        return message.sender
    if isinstance(message, EndQuorumEpoch):
        return None
    if isinstance(message, (VoteReply, FetchReply, FetchSnapshotReply)):
        return message.leader
    return None
