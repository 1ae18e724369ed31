"""Replication down to the bytes (`replica_sim.py`): three brokers, each a real replica manager
on real logs, the controller's pure functions deciding the metadata, and a schedule drawn from
the seed: acks=all produces, replica fetch rounds (some answers lost or held up), ISR changes
through AlterPartition, DeleteRecords, controlled shutdowns, crashes (losing the disk too with
`LOST_DISKS`) and restarts, slow brokers fenced by the controller, topics deleted and created
again while a broker is down, preferred elections, and unclean ones: asked by an operator,
allowed by a topic's `unclean.leader.election.enable`, or the balanced recovery of a last
known leader (noted, so that what they lose is excused). Topics have one to three replicas
and `min.insync.replicas` 1 or 2, which the controller's eligible leader replicas (KIP-966)
and the leaders' high watermarks both follow.

Checked after every step, on every partition whose leader (as the controller has it) runs and
knows it leads:
1. no acknowledged record is lost: each is in the leader's log at its offset, and served by
   `ReplicaManager.read` once the leader's high watermark has reached the start of its epoch —
   unless DeleteRecords was accepted past it, or an unclean election has since started a
   later leader epoch than the one that acknowledged it;
2. no deleted record reappears: nothing below an acknowledged DeleteRecords offset is served;
3. ListOffsets(LATEST) never goes back from one answer to the next, whichever leader answers
   (OFFSET_NOT_AVAILABLE is no answer; see `EXCUSE_LATEST_BEFORE_CAUGHT_UP` for the known bug);
4. no stray log is served: every record in the leader's log was produced to this incarnation
   of the topic (by topic id);
5. a follower the leader knows to have its whole log holds the same bytes below the high
   watermark, batch boundaries included.

`GREGOR_REPLICA_SEEDS=1000` runs more schedules than CI's 200; a failing one names its command.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.raft.sim import reproduce

from .replica_sim import ReplicaSimulation, SafetyViolation

pytestmark = pytest.mark.unit

SEEDS = int(os.environ.get("GREGOR_REPLICA_SEEDS", "200"))
STEPS = 120
"""About 0.3 s of CPU a schedule, most of it the logs' own I/O."""
PINNED_STEPS = 150
PINNED = {
    74: "a restarted leader's DeleteRecords is acknowledged before its live followers fetch",
    151: "a new leader's DeleteRecords is acknowledged before its live followers fetch",
    147: "a follower fenced during DeleteRecords rejoins the ISR and leads with the old start",
    69: "DeleteRecords acknowledged while a fenced eligible leader replica had not taken it",
    3965: "DeleteRecords acknowledged while a fenced replica the leader still had in its ISR "
    "had not taken it",
}
"""Schedules that found a bug (issue 25), run whatever `GREGOR_REPLICA_SEEDS` says."""
PINNED_LOST_DISKS = {
    532: "a follower truncated below its high watermark kept it, and leading later "
    "acknowledged records no follower had",
}
"""The same, for schedules that lose disks."""


def _reproduce(seed: int) -> str:
    test = "tests/unit/replica/test_replica_simulation.py::test_a_schedule"
    return reproduce("GREGOR_REPLICA_SEEDS", test, seed, SEEDS)


def _no_fsync(_fd: int) -> None:
    """A crash here is the process's, never the machine's: what was written stays in the page
    cache, so an fsync changes nothing the simulation can see, and only costs time."""


def _run(seed: int, tmp_path: Path, reproduce: str, steps: int = STEPS) -> None:
    sim = ReplicaSimulation(seed, tmp_path)
    try:
        sim.run(steps)
    except SafetyViolation as exc:
        raise AssertionError(f"{exc}\n{reproduce}") from None
    # A driver that never gets a batch into a log checks nothing (some schedules are unlucky
    # enough to have no acks=all produce acknowledged: a shrunk ISR below min.insync.replicas).
    assert sim.produced, f"the schedule appended nothing\n{reproduce}"


@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda seed: f"seed={seed}")
def test_a_schedule(seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", _no_fsync)
    _run(seed, tmp_path, _reproduce(seed))


@pytest.mark.parametrize("seed", sorted(PINNED), ids=lambda seed: f"seed={seed}")
def test_a_pinned_schedule(seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule that once failed, named for what it found."""
    monkeypatch.setattr(os, "fsync", _no_fsync)
    test = "tests/unit/replica/test_replica_simulation.py::test_a_pinned_schedule"
    reproduce = f"{PINNED[seed]}\nreproduce: pytest '{test}[seed={seed}]'"
    _run(seed, tmp_path, reproduce, PINNED_STEPS)


@pytest.mark.parametrize("seed", sorted(PINNED_LOST_DISKS), ids=lambda seed: f"seed={seed}")
def test_a_pinned_schedule_with_lost_disks(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "fsync", _no_fsync)
    test = "tests/unit/replica/test_replica_simulation.py::test_a_pinned_schedule_with_lost_disks"
    reproduce = f"{PINNED_LOST_DISKS[seed]}\nreproduce: pytest '{test}[seed={seed}]'"
    sim = ReplicaSimulation(seed, tmp_path, lost_disks=True)
    try:
        sim.run(STEPS)
    except SafetyViolation as exc:
        raise AssertionError(f"{exc}\n{reproduce}") from None
