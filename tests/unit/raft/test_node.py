"""Scenarios of the Raft core that a random schedule rarely builds on purpose."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import pytest

from broker.raft import (
    Diverging,
    ElectionState,
    Entry,
    Fetch,
    FetchReply,
    FetchSnapshotReply,
    Message,
    QuorumTimeouts,
    RaftNode,
    Role,
    Snapshot,
    SnapshotId,
    Vote,
    VoteReply,
)

from .sim import QUIET, Simulation

TIMEOUTS = QuorumTimeouts()


def _isolate(sim: Simulation, node: int) -> None:
    sim.cut |= {frozenset((node, other)) for other in sim.ids if other != node}


def test_a_single_voter_leads_and_commits_on_its_own() -> None:
    node = RaftNode(1, [1], rng=random.Random(0), now_ms=0)
    # At once, as Kafka's sole voter: `make run` starts without waiting an election timeout.
    assert (node.role, node.epoch, node.leader) == (Role.LEADER, 1, 1)
    node.tick(2 * TIMEOUTS.election_ms)
    assert (node.role, node.epoch, node.leader) == (Role.LEADER, 1, 1)
    first = node.propose([b"a", b"b"], 2 * TIMEOUTS.election_ms)
    ready = node.ready()
    assert ready.election == ElectionState(1, 1, 1)
    assert [entry.payload for entry in ready.entries] == [b"", b"a", b"b"]
    assert ready.high_watermark is None, "committed before its entries were on disk"
    node.advance(2 * TIMEOUTS.election_ms)
    assert node.ready().high_watermark == first + 2


def test_a_single_voter_restarts_as_leader_of_a_new_epoch() -> None:
    before = ElectionState(4, voted_for=1, leader=1)
    entries = [Entry(4, b"", control=True), Entry(4, b"a")]
    node = RaftNode(1, [1], election=before, entries=entries, rng=random.Random(0), now_ms=0)
    assert (node.role, node.epoch) == (Role.LEADER, 5)
    ready = node.ready()
    assert ready.election == ElectionState(5, 1, 1)
    node.advance(0)
    # Its own entries of the earlier epoch commit with the first of the new one.
    assert node.ready().high_watermark == 3


def test_a_vote_is_persisted_with_the_message_that_grants_it() -> None:
    node = RaftNode(2, [1, 2, 3], rng=random.Random(0), now_ms=0)
    node.step(Vote(sender=1, epoch=1, last_epoch=0, end_offset=0), 10)
    ready = node.ready()
    assert ready.election == ElectionState(1, voted_for=1)
    assert ready.messages == [(1, VoteReply(2, 1, granted=True, pre_vote=False))]
    # A second candidate in the same epoch is refused: one vote per epoch.
    node.step(Vote(sender=3, epoch=1, last_epoch=0, end_offset=0), 20)
    assert node.ready().messages == [(3, VoteReply(2, 1, granted=False, pre_vote=False))]


def test_a_voter_cut_off_does_not_raise_the_epoch() -> None:
    """Pre-vote (KIP-996): a voter that lost its links campaigns without a majority of
    pre-votes, so it never raises its epoch; once back, it follows the same leader."""
    sim = Simulation(7, voters=3, faults=QUIET)
    sim.run(5_000)
    leader = sim.leader()
    assert leader is not None
    follower = next(n for n in sim.live() if n.role is Role.FOLLOWER)
    epoch = leader.epoch
    _isolate(sim, follower.id)
    sim.run(10_000)
    assert follower.epoch == epoch
    sim.heal()
    sim.run(3_000)
    assert sim.leader() is leader
    assert leader.epoch == epoch
    assert (follower.role, follower.leader) == (Role.FOLLOWER, leader.id)


def test_a_returning_leader_drops_its_uncommitted_tail() -> None:
    """A leader cut off from the others keeps taking proposals it can never commit; the others
    elect a new leader and commit their own. Back, the old leader truncates its tail to the
    new leader's log, and none of its proposals is in anyone's committed history."""
    sim = Simulation(11, voters=3, faults=QUIET)
    sim.run(5_000)
    old = sim.leader()
    assert old is not None
    _isolate(sim, old.id)
    stranded = [old.propose([f"stranded-{n}".encode()], sim.now) for n in range(5)]
    sim.carry_out(old)
    sim.run(8_000)
    new = max((n for n in sim.live() if n.role is Role.LEADER), key=lambda n: n.epoch)
    assert new is not old
    assert new.epoch > old.epoch
    sim.heal()
    sim.run(5_000, propose_every_ms=None)
    assert (old.role, old.leader) == (Role.FOLLOWER, new.id)
    assert old.log.end_offset == new.log.end_offset
    start = max(old.log.start_offset, new.log.start_offset)  # snapshots cut logs' starts
    assert old.log.read(start, 1 << 30) == new.log.read(start, 1 << 30)
    committed = [entry.payload for entry in sim.history]
    assert not [p for p in committed if p.startswith(b"stranded-")], stranded


class _Scripted(Simulation):
    """The simulation's nodes, disks and checks, with a network that delivers at once what
    `allow` lets through and time that moves only when the script says so."""

    def __init__(self, voters: int) -> None:
        super().__init__(
            0, voters=voters, faults=QUIET, timeouts=QuorumTimeouts(fetch_max_entries=1)
        )
        self.allow: Callable[[int, int, Message], bool] = lambda sender, to, message: True

    def _send(self, sender: int, to: int, message: Message) -> None:
        if self.allow(sender, to, message):
            self._sequence += 1
            heapq.heappush(self.queue, (self.now + 1, self._sequence, to, message))

    def pump(self) -> None:
        while self.queue:
            self.now += 1
            self._deliver_due()

    def elect(self, node: int) -> RaftNode:
        raft = self.nodes[node]
        assert raft is not None
        for _ in range(5):
            self.now += 3 * TIMEOUTS.election_ms
            raft.tick(self.now)
            self.carry_out(raft)
            self.pump()
            if raft.role is Role.LEADER:
                return raft
        raise AssertionError(f"node {node} was not elected: {raft.role}, epoch {raft.epoch}")


def _links(*nodes: int) -> Callable[[int, int, Message], bool]:
    return lambda sender, to, message: sender in nodes and to in nodes


def test_a_proposal_is_fetched_and_committed_whole() -> None:
    """A controller's decision (a topic and its partitions) is one proposal. A fetch carries
    it whole though it is longer than a fetch's entry limit (one here), and the high
    watermark never stops inside it: a voter that has part of it does not commit that part."""
    sim = _Scripted(voters=3)
    leader = sim.elect(1)
    sim.pump()
    first = leader.log.end_offset
    assert leader.high_watermark == first
    replies: list[FetchReply] = []

    def watch(sender: int, to: int, message: Message) -> bool:
        if isinstance(message, FetchReply) and message.entries:
            replies.append(message)
        return True

    sim.allow = watch
    leader.propose([b"topic", b"partition-0", b"partition-1"], sim.now)
    sim.carry_out(leader)
    sim.pump()
    assert replies, "the parked fetches were not answered"
    assert {tuple(e.payload for e in r.entries) for r in replies} == {
        (b"topic", b"partition-0", b"partition-1")
    }
    assert leader.high_watermark == first + 3
    # Voter 3 is cut off; voter 2 says it has two of the next proposal's three entries.
    sim.allow = _links(1, 2)
    leader.propose([b"topic-2", b"partition-0", b"partition-1"], sim.now)
    sim.carry_out(leader)
    leader.step(Fetch(2, leader.epoch, first + 5, leader.epoch), sim.now)
    sim.carry_out(leader)
    assert leader.high_watermark == first + 3, "two entries of a proposal were committed alone"
    leader.step(Fetch(2, leader.epoch, first + 6, leader.epoch), sim.now)
    sim.carry_out(leader)
    assert leader.high_watermark == first + 6


def test_a_leader_commits_nothing_of_an_older_epoch_by_counting_replicas() -> None:
    """Raft's "figure 8", which random schedules do not build: an entry of an old epoch that
    a later leader copies to a majority is not committed by that count alone, or the leader
    after it may overwrite it. Here X (epoch 1) ends up on S1, S2 and S3 under S1's epoch 3,
    but S1's own epoch-3 entry reaches nobody; S5, elected after S1 crashes, overwrites X."""
    sim = _Scripted(voters=5)
    s1 = sim.elect(1)
    s1.propose([b"before"], sim.now)
    sim.carry_out(s1)
    sim.pump()
    k = s1.log.end_offset
    # (a) X reaches S2 only.
    sim.allow = _links(1, 2)
    s1.propose([b"X"], sim.now)
    sim.carry_out(s1)
    sim.pump()
    sim.crash(1)
    # (b) S5 wins epoch 2 with S3 and S4, and its first entry (at k, where X is) reaches nobody.
    sim.allow = lambda sender, to, message: (
        sender in (3, 4, 5) and to in (3, 4, 5) and not isinstance(message, (Fetch, FetchReply))
    )
    s5 = sim.elect(5)
    assert s5.log[k].epoch == s5.epoch
    sim.crash(5)
    # (c) S1 comes back and wins epoch 3 with S2 and S3; X reaches S3, S1's epoch-3 entry
    # reaches no one. X is on a majority (S1, S2, S3) and must still not be committed.
    sim.start(1)
    sim.allow = lambda sender, to, message: (
        sender in (1, 2, 3)
        and to in (1, 2, 3)
        and not (isinstance(message, FetchReply) and any(e.epoch > 1 for e in message.entries))
    )
    s1 = sim.elect(1)
    assert [node.log[k].payload for node in (s1, sim.nodes[2], sim.nodes[3]) if node] == [b"X"] * 3
    assert s1.high_watermark <= k, "X was committed by counting the replicas of an old epoch"
    sim.crash(1)
    # (d) S5 comes back and wins with S2, S3 and S4: X is overwritten, which is safe only
    # because it was never committed (the simulation's checks fail otherwise).
    sim.start(5)
    sim.allow = _links(2, 3, 4, 5)
    s5 = sim.elect(5)
    s5.propose([b"after"], sim.now)
    sim.carry_out(s5)
    sim.pump()
    sim.now += 1
    for node in sim.live():
        node.tick(sim.now)
        sim.carry_out(node)
    sim.pump()
    payloads = [entry.payload for entry in sim.history]
    assert b"X" not in payloads
    assert payloads[-1] == b"after"


def test_a_voter_far_behind_catches_up_from_the_leaders_snapshot() -> None:
    """A voter down while the others commit and snapshot past its log's end comes back to a
    leader whose log starts after its own ends: it fetches the leader's snapshot in chunks,
    installs it in place of its log, and catches up from there with the same history."""
    sim = Simulation(5, voters=3, faults=QUIET, snapshot_every=20)
    sim.run(3_000)
    down = next(n for n in sim.live() if n.role is Role.FOLLOWER).id
    sim.crash(down)
    sim.run(6_000)
    leader = sim.leader()
    assert leader is not None
    disk = sim.disks[down]
    assert leader.log.start_offset > disk.start + len(disk.entries), "no snapshot to fetch"
    assert leader.snapshot is not None
    assert len(leader.snapshot.data) > sim.timeouts.snapshot_chunk_bytes, "fits one chunk"
    installed = sim.installed
    sim.start(down)
    sim.run(4_000)
    sim.run(2_000, propose_every_ms=None)
    assert sim.installed > installed
    node = sim.nodes[down]
    assert node is not None
    assert node.high_watermark == leader.high_watermark
    high = leader.high_watermark
    assert sim.applied[down][:high] == sim.applied[leader.id][:high]


def test_a_snapshot_must_cover_only_committed_entries_on_disk() -> None:
    node = RaftNode(1, [1], rng=random.Random(0), now_ms=0)
    node.tick(2 * TIMEOUTS.election_ms)
    node.propose([b"a", b"b"], 2 * TIMEOUTS.election_ms)
    node.ready()
    with pytest.raises(ValueError, match="high watermark"):
        node.take_snapshot(2, b"state")  # on disk, not committed yet
    node.advance(2 * TIMEOUTS.election_ms)
    node.ready()
    snapshot_id = node.take_snapshot(2, b"state")
    assert (snapshot_id.end_offset, snapshot_id.epoch) == (2, 1)
    assert node.ready().delete_before == 2
    assert node.log.start_offset == 2


def _follower(entries: int, epoch: int = 1) -> RaftNode:
    """Node 2 of three, following leader 1 in epoch 2, with `entries` entries of `epoch`."""
    return RaftNode(
        2,
        [1, 2, 3],
        election=ElectionState(2, None, 1),
        entries=[Entry(epoch, b"") for _ in range(entries)],
        rng=random.Random(0),
        now_ms=0,
    )


def test_a_duplicated_divergence_does_not_truncate_what_was_fetched_since() -> None:
    """A divergence answers one fetch; a copy of it arriving after the fetcher truncated,
    fetched and acknowledged more must not truncate again (found in review)."""
    node = _follower(45)
    diverged = FetchReply(1, 2, 1, 0, 45, 1, diverging=Diverging(1, 40))
    node.step(diverged, 10)
    assert node.log.end_offset == 40
    node.step(FetchReply(1, 2, 1, 0, 40, 1, entries=(Entry(2, b"x"),) * 10), 20)
    assert node.log.end_offset == 50
    node.step(diverged, 30)
    assert node.log.end_offset == 50


def test_a_late_log_reply_does_not_overtake_a_snapshot_being_fetched() -> None:
    """While a snapshot is fetched, a late copy of an earlier fetch's entries is ignored: the
    snapshot replaces the log, and the high watermark never passes the log's end."""
    node = _follower(10)
    node.step(FetchReply(1, 2, 1, 60, 10, 1, snapshot=SnapshotId(50, 2)), 10)
    late = FetchReply(1, 2, 1, 190, 10, 1, entries=(Entry(2, b"y"),) * 190)
    node.step(late, 20)
    assert (node.log.end_offset, node.high_watermark) == (10, 0)
    node.step(FetchSnapshotReply(1, 2, 1, SnapshotId(50, 2), 5, 0, b"state"), 30)
    ready = node.ready()
    assert ready.install == Snapshot(SnapshotId(50, 2), b"state")
    assert (node.log.start_offset, node.log.end_offset, node.high_watermark) == (50, 50, 50)
