"""The replica manager as a partition's leader and as its follower, on real logs: the high
watermark moves with the ISR's slowest log end, acks=all waits for it, a follower's fetch
that parted from the leader's log is told where, and only the leader takes produce and
consumer reads. (Replica fetches over the network: tests/integration/test_replication.py.)"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.aio import wait_for
from broker.metadata import MetadataImage, PartitionChanged, PartitionState
from broker.metadata.image import TopicState
from broker.protocol import ErrorCode
from broker.replica import ReplicaManager
from broker.replica.fetcher import _whole_batches
from broker.storage import LogConfig, LogManager
from tests.unit.storage.logs import batch

CONFIG = LogConfig(segment_bytes=64 << 20, max_message_bytes=8 << 20)
TOPIC = TopicState("t", uuid.UUID(int=7))


def _manager(
    directory: Path, node_id: int, *, steady_ms: Callable[[], int] | None = None
) -> tuple[ReplicaManager, LogManager]:
    """A replica manager on real logs in `directory`, its steady clock `steady_ms` if given."""
    directory.mkdir()
    logs = LogManager([directory], CONFIG)
    logs.startup(now_ms=0)
    manager = ReplicaManager(
        node_id,
        logs,
        MetadataImage(),
        lambda _: CONFIG,
        lambda: 1_000,
        steady_ms=steady_ms or (lambda: time.monotonic_ns() // 1_000_000),
    )
    return manager, logs


def _state(leader: int, epoch: int, isr: tuple[int, ...] = (1, 2, 3)) -> PartitionState:
    return PartitionState((1, 2, 3), isr, leader, epoch, epoch)


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[ReplicaManager]:
    manager, logs = _manager(tmp_path / "leader", 1)
    manager.apply(PartitionChanged(TOPIC, 0, _state(1, 0)))
    yield manager
    logs.shutdown(now_ms=2_000)


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[ReplicaManager]:
    manager, logs = _manager(tmp_path / "follower", 2)
    manager.apply(PartitionChanged(TOPIC, 0, _state(1, 0)))
    yield manager
    logs.shutdown(now_ms=2_000)


def _copy(leader: ReplicaManager, follower: ReplicaManager, replica_id: int = 2) -> None:
    """One replica fetch, answered and taken in, as the fetcher does it."""
    mine = follower.partitions[("t", 0)]
    answer = leader.read_for_follower(
        "t",
        0,
        replica_id,
        mine.log.log_end_offset,
        1 << 20,
        min_one_batch=True,
        current_leader_epoch=mine.leader_epoch,
        last_fetched_epoch=mine.log.epochs.latest_epoch,
        log_start_offset=mine.log.log_start_offset,
    )
    assert answer.error == ErrorCode.none
    assert answer.diverging_epoch is None
    records = b"" if answer.records is None else answer.records.read()
    assert follower.append_from_leader(mine, records, answer.high_watermark).error == (
        ErrorCode.none
    )


def test_the_high_watermark_is_the_slowest_in_sync_log_end(
    leader: ReplicaManager, follower: ReplicaManager
) -> None:
    assert leader.append("t", 0, batch(3), acks=-1).error == ErrorCode.none
    partition = leader.partitions[("t", 0)]
    assert partition.log.log_end_offset == 3
    assert partition.high_watermark == 0  # nobody else has it yet
    # A consumer reads nothing past the high watermark.
    assert leader.read("t", 0, 0, 1 << 20, min_one_batch=True).records is None

    _copy(leader, follower)  # replica 2 fetched from 0: got the batch
    _copy(leader, follower)  # ... and now says it has up to 3
    assert partition.high_watermark == 0  # replica 3 has not fetched
    leader.follower_fetched(partition, 3, 3)
    assert partition.high_watermark == 3
    # The follower learns it from the leader's next answer, never past its own log end.
    _copy(leader, follower)
    assert follower.partitions[("t", 0)].high_watermark == 3


def test_acks_all_is_answered_when_the_isr_has_the_batch(leader: ReplicaManager) -> None:
    partition = leader.partitions[("t", 0)]

    async def scenario() -> tuple[ErrorCode, ErrorCode]:
        info = leader.append("t", 0, batch(2), acks=-1).info
        assert info is not None
        waiting = asyncio.create_task(leader.wait_for_replication("t", 0, info.last_offset + 1, 5))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        leader.follower_fetched(partition, 2, 2)
        await asyncio.sleep(0.01)
        assert not waiting.done()  # replica 3 is in the ISR too
        leader.follower_fetched(partition, 3, 2)
        done = await wait_for(waiting, 1)
        timed_out = await leader.wait_for_replication("t", 0, 10, 0.05)
        return done, timed_out

    assert asyncio.run(scenario()) == (ErrorCode.none, ErrorCode.request_timed_out)


def test_acks_all_waiters_learn_the_leader_moved(leader: ReplicaManager) -> None:
    async def scenario() -> ErrorCode:
        waiting = asyncio.create_task(leader.wait_for_replication("t", 0, 1, 5))
        leader.append("t", 0, batch(1), acks=-1)
        await asyncio.sleep(0.01)
        leader.apply(PartitionChanged(TOPIC, 0, _state(2, 1)))
        return await wait_for(waiting, 1)

    assert asyncio.run(scenario()) == ErrorCode.not_leader_or_follower


def test_a_leader_alone_in_its_isr_commits_at_once(tmp_path: Path) -> None:
    manager, logs = _manager(tmp_path / "alone", 1)
    manager.apply(PartitionChanged(TOPIC, 0, _state(1, 0, isr=(1,))))
    manager.append("t", 0, batch(4), acks=-1)
    assert manager.partitions[("t", 0)].high_watermark == 4
    logs.shutdown(now_ms=2_000)


def test_only_the_leader_takes_produce_and_consumer_reads(follower: ReplicaManager) -> None:
    assert follower.append("t", 0, batch(1), acks=1).error == ErrorCode.not_leader_or_follower
    assert follower.read("t", 0, 0, 100, min_one_batch=True).error == (
        ErrorCode.not_leader_or_follower
    )
    assert follower.list_offset("t", 0, -1).error == ErrorCode.not_leader_or_follower


def test_a_replica_fetch_from_a_broker_that_is_no_replica_is_refused(
    leader: ReplicaManager,
) -> None:
    answer = leader.read_for_follower(
        "t", 0, 9, 0, 100, min_one_batch=True, current_leader_epoch=0, last_fetched_epoch=-1
    )
    assert answer.error == ErrorCode.not_leader_or_follower


def test_a_follower_whose_log_parted_is_told_where(
    leader: ReplicaManager, follower: ReplicaManager
) -> None:
    """The follower wrote offsets 2-4 in epoch 0 as a leader nobody copied from; the new
    leader (epoch 1) kept only 0-1 of epoch 0 and wrote its own from 2."""
    leader.append("t", 0, batch(2), acks=1)
    _copy(leader, follower)
    mine = follower.partitions[("t", 0)]
    mine.log.append_as_leader(batch(3), leader_epoch=0, now_ms=1_000)  # the divergent tail
    leader.apply(PartitionChanged(TOPIC, 0, _state(1, 1)))
    follower.apply(PartitionChanged(TOPIC, 0, _state(1, 1)))
    leader.append("t", 0, batch(5), acks=1)  # epoch 1 starts at offset 2

    answer = leader.read_for_follower(
        "t",
        0,
        2,
        mine.log.log_end_offset,
        1 << 20,
        min_one_batch=True,
        current_leader_epoch=1,
        last_fetched_epoch=mine.log.epochs.latest_epoch,
    )
    assert answer.diverging_epoch == (0, 2)
    assert answer.records is None


def test_a_follower_that_stops_fetching_leaves_the_isr_and_rejoins_once_caught_up(
    tmp_path: Path,
) -> None:
    now = [0]
    manager, logs = _manager(tmp_path / "isr", 1, steady_ms=lambda: now[0])
    manager.replica_lag_time_max_ms = 30_000
    asked: list[tuple[int, ...]] = []
    manager.on_isr_change = lambda _partition, isr: asked.append(isr)
    manager.apply(PartitionChanged(TOPIC, 0, _state(1, 0)))
    partition = manager.partitions[("t", 0)]
    manager.append("t", 0, batch(3), acks=1)

    now[0] = 10_000
    manager.follower_fetched(partition, 2, 3)
    manager.follower_fetched(partition, 3, 3)
    now[0] = 35_000
    manager.follower_fetched(partition, 2, 3)  # 2 keeps up; 3 went quiet at 10 s
    manager.check_isr()
    assert asked == []  # 3 has been behind for 25 s only
    now[0] = 40_001
    manager.check_isr()
    assert asked == [(1, 2)]
    manager.check_isr()
    assert asked == [(1, 2)]  # asked once, until the controller answers

    manager.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2, 3), (1, 2), 1, 0, 1)))
    assert partition.pending_isr is None
    manager.append("t", 0, batch(2), acks=1)
    manager.follower_fetched(partition, 2, 5)
    assert partition.high_watermark == 5
    manager.follower_fetched(partition, 3, 3)  # behind the high watermark: not yet
    assert asked == [(1, 2)]
    manager.follower_fetched(partition, 3, 5)
    assert asked == [(1, 2), (1, 2, 3)]
    logs.shutdown(now_ms=2_000)


def test_a_follower_appends_the_whole_batches_of_an_answer_cut_inside_one(
    leader: ReplicaManager, follower: ReplicaManager
) -> None:
    for _ in range(5):
        leader.append("t", 0, batch(3), acks=1)
    mine = follower.partitions[("t", 0)]
    while mine.log.log_end_offset < 15:
        answer = leader.read_for_follower(
            "t", 0, 2, mine.log.log_end_offset, 300, min_one_batch=True,
            current_leader_epoch=0, last_fetched_epoch=mine.log.epochs.latest_epoch,
        )  # fmt: skip
        assert answer.records is not None
        records = _whole_batches(answer.records.read())
        assert records  # at least the first batch, whole
        assert follower.append_from_leader(mine, records, 0).error == ErrorCode.none
    assert mine.log.log_end_offset == 15


def test_a_leader_alone_keeps_its_high_watermark_while_a_follower_joins(
    leader: ReplicaManager,
) -> None:
    """A leader alone in its ISR asks to add a follower that caught up, then takes acks=1
    appends: the high watermark must not run ahead of the joiner, nor move back."""
    asked: list[tuple[int, ...]] = []
    leader.on_isr_change = lambda _partition, isr: asked.append(isr)
    leader.apply(PartitionChanged(TOPIC, 0, _state(1, 0, isr=(1,))))
    partition = leader.partitions[("t", 0)]
    leader.append("t", 0, batch(3), acks=1)
    assert partition.high_watermark == 3
    leader.follower_fetched(partition, 2, 3)
    assert asked == [(1, 2)]
    leader.append("t", 0, batch(5), acks=1)
    assert partition.high_watermark == 3  # broker 2 counts already
    leader.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2, 3), (1, 2), 1, 0, 1)))
    assert partition.high_watermark == 3
    leader.follower_fetched(partition, 2, 8)
    assert partition.high_watermark == 8


def test_a_new_leader_that_wrote_nothing_yet_tells_a_diverged_follower_where(
    tmp_path: Path,
) -> None:
    old, old_logs = _manager(tmp_path / "old", 1)
    new, new_logs = _manager(tmp_path / "new", 2)
    old.apply(PartitionChanged(TOPIC, 0, _state(1, 0)))
    new.apply(PartitionChanged(TOPIC, 0, _state(1, 0)))
    old.append("t", 0, batch(3), acks=1)
    _copy(old, new)
    old.append("t", 0, batch(3), acks=1)  # never copied: broker 1 is fenced after this
    new.apply(PartitionChanged(TOPIC, 0, _state(2, 1)))
    old.apply(PartitionChanged(TOPIC, 0, _state(2, 1)))
    mine = old.partitions[("t", 0)]
    answer = new.read_for_follower(
        "t", 0, 1, mine.log.log_end_offset, 1 << 20, min_one_batch=True,
        current_leader_epoch=1, last_fetched_epoch=mine.log.epochs.latest_epoch,
    )  # fmt: skip
    assert answer.diverging_epoch == (0, 3)
    old_logs.shutdown(now_ms=2_000)
    new_logs.shutdown(now_ms=2_000)


def test_a_follower_restarted_inside_a_batch_starts_where_the_batch_does(
    leader: ReplicaManager, follower: ReplicaManager
) -> None:
    leader.append("t", 0, batch(5), acks=1)
    mine = follower.partitions[("t", 0)]
    mine.log.truncate_fully_and_start_at(3, 1_000)  # the leader's log start, after DeleteRecords
    answer = leader.read_for_follower(
        "t", 0, 2, 3, 1 << 20, min_one_batch=True, current_leader_epoch=0, last_fetched_epoch=-1
    )
    assert answer.records is not None
    assert follower.append_from_leader(mine, answer.records.read(), 0).error == ErrorCode.none
    assert mine.log.log_end_offset == 5


def test_a_follower_one_append_behind_under_steady_load_stays_in_sync(
    tmp_path: Path,
) -> None:
    now = [0]
    manager, logs = _manager(tmp_path / "load", 1, steady_ms=lambda: now[0])
    asked: list[tuple[int, ...]] = []
    manager.on_isr_change = lambda _partition, isr: asked.append(isr)
    manager.apply(PartitionChanged(TOPIC, 0, _state(1, 0, isr=(1, 2))))
    partition = manager.partitions[("t", 0)]
    for second in range(60):
        now[0] = second * 1000
        end = partition.log.log_end_offset
        manager.append("t", 0, batch(1), acks=1)  # a record lands before each fetch
        manager.follower_fetched(partition, 2, end)
    manager.check_isr()
    assert asked == []
    logs.shutdown(now_ms=2_000)


def test_a_restarted_replica_serves_what_was_committed_before_it_stopped(
    tmp_path: Path,
) -> None:
    """The high watermark is checkpointed (replication-offset-checkpoint): a leader that
    restarts serves consumers what was committed at once, and what was not stays unserved
    until the followers have it again."""
    directory = tmp_path / "restarts"
    manager, logs = _manager(directory, 1)
    manager.apply(PartitionChanged(TOPIC, 0, _state(1, 0)))
    partition = manager.partitions[("t", 0)]
    manager.append("t", 0, batch(3), acks=-1)
    manager.follower_fetched(partition, 2, 3)
    manager.follower_fetched(partition, 3, 3)
    manager.append("t", 0, batch(2), acks=-1)  # not on the followers: not committed
    assert (partition.high_watermark, partition.log.log_end_offset) == (3, 5)
    logs.shutdown(now_ms=2_000)

    logs = LogManager([directory], CONFIG)
    logs.startup(now_ms=3_000)
    manager = ReplicaManager(1, logs, MetadataImage(), lambda _: CONFIG, lambda: 3_000)
    manager.apply(PartitionChanged(TOPIC, 0, _state(1, 1)))
    restarted = manager.partitions[("t", 0)]
    assert restarted.high_watermark == 3
    read = manager.read("t", 0, 0, 1 << 20, min_one_batch=True).records
    assert read is not None
    assert read.size > 0
    logs.shutdown(now_ms=4_000)


def test_acks_all_is_known_at_once_when_the_high_watermark_has_passed(
    leader: ReplicaManager, tmp_path: Path
) -> None:
    """The produce handler answers without a task when nothing is to be waited for."""
    partition = leader.partitions[("t", 0)]
    leader.append("t", 0, batch(2), acks=-1)
    assert leader.replicated_now("t", 0, 2) is None  # followers 2 and 3 have not fetched
    leader.follower_fetched(partition, 2, 2)
    leader.follower_fetched(partition, 3, 2)
    assert leader.replicated_now("t", 0, 2) == ErrorCode.none
    leader.min_insync_replicas = lambda _topic: 4
    assert leader.replicated_now("t", 0, 2) == ErrorCode.not_enough_replicas_after_append
    assert leader.replicated_now("t", 1, 2) == ErrorCode.unknown_topic_or_partition

    alone, logs = _manager(tmp_path / "alone-now", 1)
    alone.apply(PartitionChanged(TOPIC, 0, _state(1, 0, isr=(1,))))
    alone.append("t", 0, batch(3), acks=-1)
    assert alone.replicated_now("t", 0, 3) == ErrorCode.none
    logs.shutdown(now_ms=2_000)
