"""The group service on a real commit log: writes before answers, restarts (clean and not),
tombstones, failed writes, a leadership that moves away, real timers, and a clean stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from broker.aio import wait_for
from broker.groups import (
    CommitOffset,
    GroupService,
    HeartbeatRequest,
    JoinRequest,
    OffsetCommitRequest,
    SyncRequest,
)
from broker.groups.persistence import GroupLog, GroupLogUnavailable
from broker.protocol import ErrorCode as E
from broker.storage.manager import CLEAN_SHUTDOWN_FILE

from .brokers import TOPIC, Broker, now_ms, run


def commit(
    group: str, *offsets: tuple[str, int, int], member: str = "", generation: int = -1
) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id=group,
        member_id=member,
        generation_id=generation,
        offsets=tuple(CommitOffset(t, p, o, metadata="m") for t, p, o in offsets),
    )


def join(member_id: str = "", *, session: int = 10_000, version: int = 3) -> JoinRequest:
    return JoinRequest(
        group_id="g",
        member_id=member_id,
        client_id="app",
        client_host="/127.0.0.1",
        session_timeout_ms=session,
        rebalance_timeout_ms=30_000,
        protocol_type="consumer",
        protocols=(("range", b"meta"),),
        requires_known_member_id=version >= 4,
    )


async def stable_member(service: GroupService, session: int = 10_000) -> str:
    joined = await service.join_group(join(session=session))
    assert joined.error == E.none, joined
    synced = await service.sync_group(
        SyncRequest(
            group_id="g",
            member_id=joined.member_id,
            generation_id=joined.generation_id,
            assignments=((joined.member_id, b"assigned"),),
        )
    )
    assert synced.error == E.none
    return joined.member_id


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def test_offsets_and_groups_survive_a_restart(data_dir: Path) -> None:
    async def scenario() -> None:
        broker = Broker(data_dir)
        await broker.service.start()
        result = await broker.service.commit_offsets(commit("simple", ("t", 0, 42), ("t", 1, 7)))
        assert [e for _, e in result.errors] == [E.none, E.none]
        member = await stable_member(broker.service)
        await broker.stop()

        again = Broker(data_dir)
        await again.service.start()
        fetched = await again.service.fetch_offsets("simple", None)
        assert [(o.topic, o.partition, o.offset, o.metadata) for o in fetched.offsets] == [
            ("t", 0, 42, "m"),
            ("t", 1, 7, "m"),
        ]
        (described,) = await again.service.describe_groups(["g"])
        assert (described.state, described.protocol) == ("Stable", "range")
        assert [(m.member_id, m.assignment) for m in described.members] == [(member, b"assigned")]
        # The member carries on where it was.
        beat = HeartbeatRequest(group_id="g", member_id=member, generation_id=1)
        assert await again.service.heartbeat(beat) == E.none
        await again.stop()

    run(scenario)


def test_deleted_groups_leave_tombstones_and_stay_deleted(data_dir: Path) -> None:
    async def scenario() -> None:
        broker = Broker(data_dir)
        await broker.service.start()
        await broker.service.commit_offsets(commit("gone", ("t", 0, 1)))
        result = await broker.service.delete_groups(["gone"])
        assert result.results == (("gone", E.none),)
        records = broker.records("gone")
        assert records[-2:] == [(("gone", "t", 0), None), (("gone",), None)]
        await broker.stop()

        again = Broker(data_dir)
        await again.service.start()
        assert (await again.service.fetch_offsets("gone", None)).offsets == ()
        assert (await again.service.list_groups()).groups == ()
        await again.stop()

    run(scenario)


def test_after_an_unclean_stop_the_log_is_the_truth(data_dir: Path) -> None:
    async def scenario() -> None:
        broker = Broker(data_dir)
        await broker.service.start()
        await broker.service.commit_offsets(commit("g", ("t", 0, 1)))
        await broker.service.commit_offsets(commit("g", ("t", 0, 2)))
        partition = broker.service.partition_for("g")
        segment = broker.log_for(partition).active_segment.log_path  # type: ignore[union-attr]
        await broker.stop()
        # A crash mid-write: no clean-shutdown marker, and half a batch at the end of the log.
        (data_dir / CLEAN_SHUTDOWN_FILE).unlink()
        with open(segment, "ab") as torn:
            torn.write(b"\x00" * 8 + b"\x00\x00\x01\x00" + b"\x07" * 20)

        again = Broker(data_dir)
        await again.service.start()
        (offset,) = (await again.service.fetch_offsets("g", [("t", 0)])).offsets
        assert offset.offset == 2
        await again.stop()

    run(scenario)


class Gate:
    """A GroupLog in front of the real one whose appends wait until opened, or fail."""

    def __init__(self, inner: GroupLog) -> None:
        self.inner = inner
        self.open = asyncio.Event()
        self.open.set()
        self.waiting = asyncio.Event()
        """Set once an append waits at the closed gate."""
        self.failures = 0

    async def append(
        self, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> int | None:
        if not self.open.is_set():
            self.waiting.set()
        await self.open.wait()
        if self.failures:
            self.failures -= 1
            raise OSError("disk full")
        return await self.inner.append(partition, records)

    async def replicated(self, partition: int, end_offset: int) -> bool:
        return await self.inner.replicated(partition, end_offset)

    def replay(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]:
        return self.inner.replay(partition)


def test_a_commit_is_acknowledged_only_once_its_record_is_in_the_log(data_dir: Path) -> None:
    async def scenario() -> None:
        broker = Broker(data_dir, group_log=Gate)
        gate = broker.service_log
        assert isinstance(gate, Gate)
        await broker.service.start()
        gate.open.clear()
        pending = asyncio.create_task(broker.service.commit_offsets(commit("g", ("t", 0, 5))))
        # Observed once the record is at the log and held there (an event, so a slow machine
        # cannot make the check early), then for 50 ms more of loop turns in which an answer
        # not tied to the write would go out.
        await wait_for(gate.waiting.wait(), 5)
        await asyncio.sleep(0.05)
        assert not pending.done()
        assert broker.records("g") == []
        gate.open.set()
        assert (await pending).errors == ((("t", 0), E.none),)
        assert [k for k, _ in broker.records("g")] == [("g", "t", 0)]
        await broker.stop()

    run(scenario)


def test_a_failed_write_is_answered_not_coordinator_and_the_log_stays_the_truth(
    data_dir: Path,
) -> None:
    async def scenario() -> None:
        broker = Broker(data_dir, group_log=Gate)
        gate = broker.service_log
        assert isinstance(gate, Gate)
        await broker.service.start()
        await broker.service.commit_offsets(commit("g", ("t", 0, 1)))
        gate.failures = 1
        failed = await broker.service.commit_offsets(commit("g", ("t", 0, 2)))
        assert failed.errors == ((("t", 0), E.not_coordinator),)
        for _ in range(100):  # the partition is reloaded from its log in the background
            fetched = await broker.service.fetch_offsets("g", [("t", 0)])
            if fetched.error == E.none:
                break
            await asyncio.sleep(0.01)
        assert fetched.offsets[0].offset == 1
        await broker.stop()

    run(scenario)


def test_a_partition_without_a_log_cannot_take_commits(data_dir: Path) -> None:
    async def scenario() -> None:
        broker = Broker(data_dir)
        partition = broker.service.partition_for("g")
        broker.manager.delete_log(TOPIC, partition, now_ms())
        await broker.service.start()
        result = await broker.service.commit_offsets(commit("g", ("t", 0, 1)))
        assert result.errors == ((("t", 0), E.not_coordinator),)
        await broker.stop()

    run(scenario)


def test_a_silent_member_is_removed_by_the_timers(data_dir: Path) -> None:
    async def scenario() -> None:
        broker = Broker(data_dir, min_session_timeout_ms=10)
        await broker.service.start()
        await stable_member(broker.service, session=200)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            (described,) = await broker.service.describe_groups(["g"])
            if described.state == "Empty":
                break
            await asyncio.sleep(0.02)
        assert described.state == "Empty"
        await broker.stop()

    run(scenario)


def test_stop_answers_parked_requests_and_leaves_no_task_behind(data_dir: Path) -> None:
    async def scenario() -> None:
        broker = Broker(data_dir, initial_rebalance_delay_ms=60_000)
        await broker.service.start()
        parked = asyncio.create_task(broker.service.join_group(join()))
        # Parked for certain: the group's state says it waits out its 60 s delay, where a
        # wait alone would only say the join was not answered yet.
        deadline = time.monotonic() + 5
        while (await broker.service.describe_groups(["g"]))[0].state != "PreparingRebalance":
            assert time.monotonic() < deadline, "the join never parked"
            await asyncio.sleep(0.01)
        assert not parked.done()
        await broker.stop()
        assert (await parked).error == E.not_coordinator

    run(scenario)


class Moved:
    """A GroupLog in front of the real one for a node whose leadership of the partitions
    moves away once `moved` is set: writes and loads are then refused as the node refuses
    them (`GroupLogUnavailable`), and counted."""

    def __init__(self, inner: GroupLog) -> None:
        self.inner = inner
        self.moved = False
        self.replays_after = 0

    async def append(
        self, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> int | None:
        if self.moved:
            raise GroupLogUnavailable("this node no longer leads it (NOT_LEADER_OR_FOLLOWER)")
        return await self.inner.append(partition, records)

    async def replicated(self, partition: int, end_offset: int) -> bool:
        return await self.inner.replicated(partition, end_offset)

    def replay(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]:
        if self.moved:
            self.replays_after += 1
            raise GroupLogUnavailable("this node does not lead it")
        return self.inner.replay(partition)


def test_a_write_after_the_leadership_moved_unloads_the_group_in_one_line(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A controlled shutdown moves `__consumer_offsets` away while a member commits: as in
    Kafka, the group is unloaded and its members told NOT_COORDINATOR (they find the new
    coordinator), one line says so, with no traceback, and nothing is reloaded here."""

    async def scenario() -> None:
        broker = Broker(data_dir, group_log=Moved)
        moved = broker.service_log
        assert isinstance(moved, Moved)
        await broker.service.start()
        member = await stable_member(broker.service)
        moved.moved = True
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="broker.groups"):
            failed = await broker.service.commit_offsets(
                commit("g", ("t", 0, 2), member=member, generation=1)
            )
            assert failed.errors == ((("t", 0), E.not_coordinator),)
            beat = await broker.service.heartbeat(
                HeartbeatRequest(group_id="g", member_id=member, generation_id=1)
            )
            assert beat == E.not_coordinator
            await asyncio.sleep(0.05)  # a reload, were one started, would have run
            assert not broker.service.serves(broker.service.partition_for("g"))
            assert moved.replays_after == 0
        said = [r for r in caplog.records if r.name.startswith("broker.groups")]
        assert [r.exc_info for r in said] == [None], [r.getMessage() for r in said]
        partition = broker.service.partition_for("g")
        assert said[0].levelno == logging.INFO
        assert f"__consumer_offsets-{partition}" in said[0].getMessage()
        assert "NOT_COORDINATOR" in said[0].getMessage()
        await broker.stop()

    run(scenario)


def test_a_load_after_the_leadership_moved_on_serves_nothing_in_one_line(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The leadership came here and went again before the load ran (brokers stopping
    together): the partition is not served, and one line says why, with no traceback."""

    async def scenario() -> None:
        broker = Broker(data_dir, group_log=Moved)
        moved = broker.service_log
        assert isinstance(moved, Moved)
        await broker.service.start(())
        moved.moved = True
        with caplog.at_level(logging.INFO, logger="broker.groups"):
            await broker.service.load(1)
        assert not broker.service.serves(1)
        said = [r for r in caplog.records if r.name.startswith("broker.groups")]
        assert [(r.levelno, r.exc_info) for r in said] == [(logging.INFO, None)]
        assert said[0].getMessage() == (
            "not loading the groups of __consumer_offsets-1: this node does not lead it"
        )
        await broker.stop()

    run(scenario)
