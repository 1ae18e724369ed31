"""The quorum driver on a real clock and disk, as one voter or cut off from its peers: what it
commits is applied and survives a restart; a restart does not claim to have caught up before a
leader said how far the log goes; a failed metadata disk or a caller that gives up never leaves
a proposal waiting forever or the quorum stopped."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from broker.aio import wait_for
from broker.quorum.batches import write_snapshot
from broker.quorum.driver import NotController, QuorumDriver
from broker.quorum.store import QuorumStore
from broker.raft import ElectionState, Snapshot, SnapshotId
from tests.support.nodes import free_port

ALONE = {1: ("localhost", 0)}


class Machine:
    """The state machine: what was applied, in order."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, bytes]] = []
        self.loaded: list[tuple[list[bytes], int]] = []

    def apply(self, offset: int, payload: bytes) -> None:
        self.applied.append((offset, payload))

    def prepare(self, offset: int, payload: bytes) -> None:
        pass

    def load(self, payloads: Sequence[bytes], end_offset: int) -> None:
        self.loaded.append((list(payloads), end_offset))

    def snapshot(self) -> Iterable[bytes]:
        return [payload for _, payload in self.applied]


def _monotonic() -> int:
    return time.monotonic_ns() // 1_000_000


def _wall() -> int:
    return time.time_ns() // 1_000_000


def _driver(
    path: Path, voters: dict[int, tuple[str, int]], machine: Machine | None = None
) -> QuorumDriver:
    store = QuorumStore(path, tuple(sorted(voters)), segment_bytes=8 << 20, now_ms=_wall())
    return QuorumDriver(
        1, voters, store, machine or Machine(), cluster_id="c", clock=_monotonic, wall_clock=_wall
    )


def test_a_single_voter_commits_applies_and_replays_after_a_restart(tmp_path: Path) -> None:
    async def run(machine: Machine, proposals: list[list[bytes]]) -> int:
        driver = _driver(tmp_path, ALONE, machine)
        await driver.start()
        await wait_for(driver.wait_caught_up(), 5)
        end = driver.applied
        for payloads in proposals:
            end = await driver.propose(payloads)
        await driver.stop()
        return end

    first = Machine()
    end = asyncio.run(run(first, [[b"a", b"b"], [b"c"]]))
    assert [payload for _, payload in first.applied] == [b"a", b"b", b"c"]
    assert end == first.applied[-1][0] + 1
    again = Machine()
    asyncio.run(run(again, []))
    assert again.applied == first.applied


def test_a_restarted_follower_has_not_caught_up_before_a_leader_answers(tmp_path: Path) -> None:
    """A follower restarts with a snapshot and nothing after it, its quorum-state naming a
    leader that is gone: its log looks complete, but it cannot know that, and must not serve
    the image it had as if it were the committed one."""
    voters = {node: ("localhost", free_port()) for node in (1, 2, 3)}
    store = QuorumStore(tmp_path, (1, 2, 3), segment_bytes=8 << 20, now_ms=_wall())
    data = write_snapshot([b"r1", b"r2"], end_offset=4, epoch=1, last_timestamp=1, now_ms=1)
    store.save_election(ElectionState(1, None, 2))
    store.install(Snapshot(SnapshotId(4, 1), data), 1)
    store.close(2)

    async def main() -> bool:
        driver = _driver(tmp_path, voters)
        await driver.start()
        try:
            await wait_for(driver.wait_caught_up(), 1.0)
        except TimeoutError:
            return False
        finally:
            await driver.stop()
        return True

    assert not asyncio.run(main()), "caught up with no leader reachable"


def test_a_failed_metadata_disk_refuses_proposals_instead_of_hanging(tmp_path: Path) -> None:
    async def main() -> None:
        driver = _driver(tmp_path, ALONE)
        await driver.start()
        await wait_for(driver.wait_caught_up(), 5)
        await driver.propose([b"a"])

        def failing_disk(*args: object, **kwargs: object) -> None:
            raise OSError(5, "Input/output error")

        # Fault injection: an EIO from the disk under the metadata log.
        driver._store.append = failing_disk  # type: ignore[method-assign]
        with pytest.raises(NotController):
            await driver.propose([b"b"])
        assert isinstance(driver.failed, OSError)
        assert not driver.is_active
        with pytest.raises(NotController):
            await wait_for(driver.propose([b"c"]), 2)

    asyncio.run(main())


def test_a_caller_that_gives_up_does_not_stop_the_quorum(tmp_path: Path) -> None:
    async def main() -> None:
        driver = _driver(tmp_path, ALONE)
        await driver.start()
        await wait_for(driver.wait_caught_up(), 5)
        # Refused once dequeued (its entries would not go where it said), after its caller
        # was cancelled, as MetadataService.close cancels a registration under way.
        waiting = asyncio.ensure_future(driver.propose([b"x"], first_offset=10_000))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.sleep(0.2)
        assert driver.failed is None
        assert await driver.propose([b"y"]) > 0
        await driver.stop()

    asyncio.run(main())


def test_a_big_proposal_is_prepared_in_slices_and_applied_whole(tmp_path: Path) -> None:
    """Ten thousand entries proposed at once (one admin request of ten thousand partitions):
    the event loop serves others while they are prepared (decoded), a slice at a time, and
    nothing ever sees part of the proposal applied."""

    class Slow(Machine):
        def __init__(self) -> None:
            super().__init__()
            self.prepared = 0

        def prepare(self, offset: int, payload: bytes) -> None:
            self.prepared += 1
            time.sleep(0.0002)  # what decoding a partition's record costs, roughly

    async def main() -> tuple[set[tuple[int, int]], int]:
        machine = Slow()
        driver = _driver(tmp_path, ALONE, machine)
        await driver.start()
        await wait_for(driver.wait_caught_up(), 5)
        before = (machine.prepared, len(machine.applied))
        seen: set[tuple[int, int]] = set()

        async def turns() -> None:
            while True:
                seen.add((machine.prepared - before[0], len(machine.applied) - before[1]))
                await asyncio.sleep(0)

        watcher = asyncio.get_running_loop().create_task(turns())
        await driver.propose([b"%d" % i for i in range(10_000)])
        watcher.cancel()
        applied = len(machine.applied) - before[1]
        await driver.stop()
        return seen, applied

    seen, applied = asyncio.run(main())
    assert applied == 10_000
    preparing = {prepared for prepared, _ in seen if 0 < prepared < 10_000}
    assert len(preparing) >= 10, f"the loop had a turn only at {sorted(seen)[:20]}"
    assert not [done for _, done in seen if 0 < done < 10_000], "part of a proposal applied"


def test_a_non_atomic_decision_is_applied_a_batch_at_a_time(tmp_path: Path) -> None:
    """Ten thousand leader moves (a controlled shutdown of a broker that leads them): proposed
    with `atomic=False`, they are committed in batches of about 8 KiB and applied a batch at a
    time, the event loop serving others in between; the caller is answered once all are
    applied, and every entry is applied once, in order."""

    class Slow(Machine):
        def apply(self, offset: int, payload: bytes) -> None:
            super().apply(offset, payload)
            time.sleep(0.00005)  # what a replica manager taking a new leader costs, roughly

    async def main() -> tuple[set[int], list[tuple[int, bytes]], int]:
        machine = Slow()
        driver = _driver(tmp_path, ALONE, machine)
        await driver.start()
        await wait_for(driver.wait_caught_up(), 5)
        before = len(machine.applied)
        seen: set[int] = set()

        async def turns() -> None:
            while True:
                seen.add(len(machine.applied) - before)
                await asyncio.sleep(0)

        watcher = asyncio.get_running_loop().create_task(turns())
        payloads = [b"leader-moved-%05d" % i + b"." * 40 for i in range(10_000)]
        end = await driver.propose(payloads, atomic=False)
        watcher.cancel()
        applied = machine.applied[before:]
        await driver.stop()
        return seen, applied, end

    seen, applied, end = asyncio.run(main())
    assert [payload for _, payload in applied] == [
        b"leader-moved-%05d" % i + b"." * 40 for i in range(10_000)
    ]
    assert applied[-1][0] == end - 1
    parts = sorted(done for done in seen if 0 < done < 10_000)
    assert len(parts) >= 10, f"applied in {len(parts) + 1} parts"
    # No turn of the loop applied more than a batch of at most 8 KiB (143 of these 57-byte
    # entries) past its 5 ms slice.
    assert max(b - a for a, b in itertools.pairwise([0, *parts, 10_000])) <= 2 * (8192 // 57)


def test_each_change_of_role_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As Kafka logs each transition of its quorum state: what an operator reads to tell why
    a quorum had no leader for a while (who campaigned, in which epoch, who won)."""

    async def run() -> None:
        driver = _driver(tmp_path, ALONE)
        await driver.start()
        await wait_for(driver.wait_caught_up(), 5)
        await driver.resign()
        await driver.stop()

    with caplog.at_level(logging.INFO, logger="broker.quorum.driver"):
        asyncio.run(run())
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("metadata quorum")]
    assert "metadata quorum: node 1 is leader in epoch 1 (leader: 1)" in said, said
    assert "metadata quorum: node 1 is resigned in epoch 1 (leader: 1)" in said, said
