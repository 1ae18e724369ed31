"""Scenarios of the Raft core that a random schedule rarely builds on purpose."""

from __future__ import annotations

import random

from broker.raft import ElectionState, QuorumTimeouts, RaftNode, Role, Vote, VoteReply

from .sim import Faults, Simulation

QUIET = Faults(drop=0, duplicate=0, crash_every_ms=0, partition_every_ms=0)
TIMEOUTS = QuorumTimeouts()


def _isolate(sim: Simulation, node: int) -> None:
    sim.cut |= {frozenset((node, other)) for other in sim.ids if other != node}


def test_a_single_voter_leads_and_commits_on_its_own() -> None:
    node = RaftNode(1, [1], rng=random.Random(0), now_ms=0)
    node.tick(2 * TIMEOUTS.election_ms)
    assert (node.role, node.epoch, node.leader) == (Role.LEADER, 1, 1)
    first = node.propose([b"a", b"b"], 2 * TIMEOUTS.election_ms)
    ready = node.ready()
    assert ready.election == ElectionState(1, 1, 1)
    assert [entry.payload for entry in ready.entries] == [b"", b"a", b"b"]
    assert ready.high_watermark is None, "committed before its entries were on disk"
    node.advance(2 * TIMEOUTS.election_ms)
    assert node.ready().high_watermark == first + 2


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
    sim._carry_out(old)
    sim.run(8_000)
    new = max((n for n in sim.live() if n.role is Role.LEADER), key=lambda n: n.epoch)
    assert new is not old
    assert new.epoch > old.epoch
    sim.heal()
    sim.run(5_000, propose_every_ms=None)
    assert (old.role, old.leader) == (Role.FOLLOWER, new.id)
    assert old.log.read(0, old.log.end_offset) == new.log.read(0, new.log.end_offset)
    committed = [entry.payload for entry in sim.history]
    assert not [p for p in committed if p.startswith(b"stranded-")], stranded
