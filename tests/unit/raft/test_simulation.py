"""Raft under seeded faulty schedules (`sim.py`): safety all along, liveness once healed.

`GREGOR_RAFT_SEEDS=5000` runs more schedules than CI's 200; a failing one names its command.
"""

from __future__ import annotations

import os

import pytest

from broker.raft import ElectionState

from .sim import QUIET, SafetyViolation, Simulation, reproduce

SEEDS = int(os.environ.get("GREGOR_RAFT_SEEDS", "200"))
FAULTY_MS = 15_000
HEALED_MS = 8_000
"""Election timeouts of 1-2 s, a fetch timeout of 2 s and backoffs of up to 1 s: a healed
quorum elects a leader and catches every node up well within this."""

SETTLE_MS = 2_000
"""Then no more proposals: followers learn the last high watermark within a fetch wait."""


def _reproduce(seed: int) -> str:
    test = "tests/unit/raft/test_simulation.py::test_a_faulty_schedule"
    return reproduce("GREGOR_RAFT_SEEDS", test, seed, SEEDS)


@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda seed: f"seed={seed}")
def test_a_faulty_schedule(seed: int) -> None:
    """Drops, duplicates, delays, cut links and crashes for 15 s with entries proposed every
    50 ms, then a healed network: no safety property breaks, a leader is elected, and every
    node commits the same history, including an entry proposed after the healing."""
    sim = Simulation(seed, voters=5 if seed % 4 == 0 else 3, observers=seed % 3)
    try:
        sim.run(FAULTY_MS)
        sim.heal()
        sim.faults = QUIET
        sim.run(HEALED_MS)
        sim.run(SETTLE_MS, propose_every_ms=None)
    except SafetyViolation as exc:
        raise AssertionError(f"{exc}\n{_reproduce(seed)}") from None
    leader = sim.leader()
    assert leader is not None, f"no leader {HEALED_MS} ms after healing\n{_reproduce(seed)}"
    last = sim.proposed
    marker = f"{seed}:{last}.0".encode()
    nodes = sim.live()
    behind = {
        node.id: node.high_watermark
        for node in nodes
        if node.high_watermark < leader.high_watermark
    }
    assert not behind, (
        f"nodes behind the leader's high watermark {leader.high_watermark}: {behind}\n"
        f"{_reproduce(seed)}"
    )
    histories = {tuple(sim.applied[node.id][: node.high_watermark]) for node in nodes}
    assert len(histories) == 1, f"nodes committed different histories\n{_reproduce(seed)}"
    (history,) = histories
    assert marker in [entry.payload for entry in history[-20:]], (
        f"the entry proposed last ({marker!r}) is not committed everywhere\n{_reproduce(seed)}"
    )


def test_a_voter_that_went_to_a_higher_epoch_alone_rejoins_the_quorum() -> None:
    """A voter campaigned and nobody heard it (its requests dropped, a cut link): it sits at
    a higher epoch than the leader's, refuses the leader's requests as stale and is refused
    pre-votes while the leader lives. The leader's repeated BeginQuorumEpoch draws its epoch
    out, an election follows, and it applies the whole log again (found by the controller
    simulation at seed 337 under harsher faults)."""
    sim = Simulation(1, voters=3, faults=QUIET, snapshot_every=None)
    sim.run(5_000)
    leader = sim.leader()
    assert leader is not None
    follower = next(n for n in sim.voter_ids if n != leader.id)
    sim.crash(follower)
    sim.disks[follower].election = ElectionState(leader.epoch + 1, follower, None)
    sim.start(follower)
    sim.run(15_000)
    sim.run(SETTLE_MS, propose_every_ms=None)
    leader = sim.leader()
    assert leader is not None
    rejoined = sim.nodes[follower]
    assert rejoined is not None
    assert rejoined.high_watermark == leader.high_watermark
    assert len(sim.applied[follower]) == leader.high_watermark


@pytest.mark.parametrize("seed", range(20), ids=lambda seed: f"seed={seed}")
def test_an_observer_finds_a_new_leader_soon_after_it_is_elected(seed: int) -> None:
    """A broker (an observer) whose leader died asks the voters, picking at random; a dead
    voter refuses the connection, and the driver says so (`unreachable`), so the next try
    goes out after the retry backoff, not after a request timeout per dead voter picked."""
    sim = Simulation(seed, voters=3, observers=1, faults=QUIET, snapshot_every=None)
    sim.run(3_000)
    old = sim.leader()
    assert old is not None
    observer = sim.nodes[sim.ids[-1]]
    assert observer is not None
    assert observer.leader == old.id
    sim.crash(old.id)
    elected_at = None
    while sim.now < 20_000:
        sim.run(10)
        new = sim.leader()
        if new is None or new.epoch == old.epoch:
            continue
        elected_at = elected_at or sim.now
        if (observer.leader, observer.epoch) == (new.id, new.epoch):
            break
    assert elected_at is not None, "no new leader"
    assert sim.now - elected_at <= 600, f"the observer followed {sim.now - elected_at} ms late"
