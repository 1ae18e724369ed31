"""The log start offset replicates: followers raise theirs from each fetch answer (never past
their high watermark, checkpointed at once), tell it in their next fetch, and DeleteRecords
answers once every live replica's has passed the offset (Kafka's low watermark and
DelayedDeleteRecords). A fenced follower does not hold it up; a leader that stops leading
tells the waiting request so. On real logs, two replica managers, no network."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.aio import wait_for
from broker.metadata import MetadataImage, PartitionChanged, PartitionState
from broker.metadata.image import TopicState
from broker.metadata.records import (
    BrokerEndpoint,
    FenceBrokerRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
)
from broker.protocol import ErrorCode
from broker.replica import ReplicaManager
from broker.storage import LogConfig, LogManager
from broker.storage.checkpoints import read_offset_checkpoint
from tests.unit.storage.logs import batch

CONFIG = LogConfig(segment_bytes=64 << 20)
TOPIC = TopicState("t", uuid.UUID(int=9))
STATE = PartitionState((1, 2, 3), (1, 2, 3), 1, 0, 0)


def _image() -> MetadataImage:
    """Brokers 1-3, registered and unfenced."""
    image = MetadataImage()
    offsets = itertools.count()
    for broker_id in (1, 2, 3):
        endpoint = BrokerEndpoint("PLAINTEXT", "localhost", 9090 + broker_id, 0)
        image.apply(
            RegisterBrokerRecord(broker_id, uuid.uuid4(), broker_id, (endpoint,)), next(offsets)
        )
        image.apply(UnfenceBrokerRecord(broker_id, broker_id), next(offsets))
    return image


class Replicas:
    """Replica managers of nodes 1 (the leader) and 2 on their own log dirs, one image."""

    def __init__(self, tmp: Path) -> None:
        self.image = _image()
        self.offset = itertools.count(100)
        self.managers: dict[int, tuple[ReplicaManager, LogManager]] = {}
        for node_id in (1, 2):
            logs = LogManager([tmp / f"node-{node_id}"], CONFIG)
            logs.startup(now_ms=0)
            manager = ReplicaManager(node_id, logs, self.image, lambda _: CONFIG, lambda: 1_000)
            manager.apply(PartitionChanged(TOPIC, 0, STATE))
            self.managers[node_id] = (manager, logs)

    @property
    def leader(self) -> ReplicaManager:
        return self.managers[1][0]

    @property
    def follower(self) -> ReplicaManager:
        return self.managers[2][0]

    def fetch(self) -> None:
        """One replica fetch of node 2, answered by node 1 and taken in, as the fetcher does."""
        mine = self.follower.partitions[("t", 0)]
        answer = self.leader.read_for_follower(
            "t",
            0,
            2,
            mine.log.log_end_offset,
            1 << 20,
            min_one_batch=True,
            current_leader_epoch=0,
            last_fetched_epoch=mine.log.epochs.latest_epoch,
            log_start_offset=mine.log.log_start_offset,
        )
        assert answer.error == ErrorCode.none
        records = b"" if answer.records is None else answer.records.read()
        taken = self.follower.append_from_leader(
            mine, records, answer.high_watermark, answer.log_start_offset
        )
        assert taken.error == ErrorCode.none

    def replica_3_at(self, offset: int, log_start: int) -> None:
        """Node 3's fetch, told by hand: it has everything before `offset`."""
        partition = self.leader.partitions[("t", 0)]
        self.leader.follower_fetched(partition, 3, offset, log_start)

    def fence(self, broker_id: int) -> None:
        self.image.apply(FenceBrokerRecord(broker_id, broker_id), next(self.offset))

    def close(self) -> None:
        for _, logs in self.managers.values():
            logs.shutdown(now_ms=2_000)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    made = Replicas(tmp_path)
    yield made
    made.close()


def _replicated(replicas: Replicas, records: int) -> None:
    assert replicas.leader.append("t", 0, batch(records), acks=-1).error == ErrorCode.none
    replicas.fetch()
    replicas.fetch()  # the follower's fetch offset moves the high watermark
    replicas.replica_3_at(records, 0)
    replicas.fetch()  # ... which the follower then learns
    assert replicas.follower.partitions[("t", 0)].high_watermark == records


def test_a_follower_takes_the_leaders_log_start_and_checkpoints_it(
    replicas: Replicas, tmp_path: Path
) -> None:
    _replicated(replicas, 20)
    assert replicas.leader.delete_records("t", 0, 10) == (ErrorCode.none, 10)
    replicas.fetch()
    follower_log = replicas.follower.partitions[("t", 0)].log
    assert follower_log.log_start_offset == 10
    checkpoint = read_offset_checkpoint(tmp_path / "node-2" / "log-start-offset-checkpoint")
    assert checkpoint[("t", 0)] == 10, "on disk before the next fetch tells the leader"


def test_a_follower_never_moves_its_log_start_past_its_high_watermark(
    replicas: Replicas,
) -> None:
    _replicated(replicas, 5)
    partition = replicas.follower.partitions[("t", 0)]
    assert replicas.follower.follow_log_start(partition, 50).error == ErrorCode.none
    assert partition.log.log_start_offset == 5


def test_delete_records_answers_once_every_live_replica_has_followed(
    replicas: Replicas,
) -> None:
    _replicated(replicas, 20)

    async def scenario() -> tuple[ErrorCode, int]:
        assert replicas.leader.delete_records("t", 0, 10) == (ErrorCode.none, 10)
        waiting = asyncio.create_task(replicas.leader.wait_for_low_watermark("t", 0, 10, 5))
        await asyncio.sleep(0.01)
        assert not waiting.done(), "no follower has moved its log start yet"
        replicas.fetch()  # node 2 takes the new log start ...
        replicas.fetch()  # ... and tells it
        await asyncio.sleep(0.01)
        assert not waiting.done(), "node 3 has not"
        replicas.replica_3_at(20, 10)
        return await wait_for(waiting, 1)

    assert asyncio.run(scenario()) == (ErrorCode.none, 10)


def test_delete_records_times_out_with_kafkas_error_while_a_follower_lags(
    replicas: Replicas,
) -> None:
    _replicated(replicas, 20)
    replicas.leader.delete_records("t", 0, 10)
    answer = asyncio.run(replicas.leader.wait_for_low_watermark("t", 0, 10, 0.05))
    assert answer == (ErrorCode.request_timed_out, 0)


def test_a_fenced_follower_does_not_hold_delete_records_up(replicas: Replicas) -> None:
    """Once out of the ISR (and not an eligible leader): it rejoins only with the log start."""
    _replicated(replicas, 20)
    replicas.fence(3)
    shrunk = PartitionState((1, 2, 3), (1, 2), 1, 0, 1)
    for manager in (replicas.leader, replicas.follower):
        manager.apply(PartitionChanged(TOPIC, 0, shrunk))
    replicas.leader.delete_records("t", 0, 10)
    replicas.fetch()
    replicas.fetch()
    assert asyncio.run(replicas.leader.wait_for_low_watermark("t", 0, 10, 1)) == (
        ErrorCode.none,
        10,
    )


def test_a_leader_that_stops_leading_tells_the_waiting_delete_records(
    replicas: Replicas,
) -> None:
    _replicated(replicas, 20)

    async def scenario() -> tuple[ErrorCode, int]:
        replicas.leader.delete_records("t", 0, 10)
        waiting = asyncio.create_task(replicas.leader.wait_for_low_watermark("t", 0, 10, 5))
        await asyncio.sleep(0.01)
        replicas.leader.apply(
            PartitionChanged(TOPIC, 0, PartitionState((1, 2, 3), (2, 3), 2, 1, 1))
        )
        return await wait_for(waiting, 1)

    assert asyncio.run(scenario()) == (ErrorCode.not_leader_or_follower, -1)


def test_a_fenced_follower_still_in_the_isr_holds_delete_records_up(replicas: Replicas) -> None:
    """The controller may have fenced it and made it an eligible leader already: it may lead
    without rejoining the ISR, so DeleteRecords waits for it (the simulation's seed 3965)."""
    _replicated(replicas, 20)
    replicas.fence(3)
    replicas.leader.delete_records("t", 0, 10)
    replicas.fetch()
    replicas.fetch()
    answer = asyncio.run(replicas.leader.wait_for_low_watermark("t", 0, 10, 0.05))
    assert answer == (ErrorCode.request_timed_out, 0)
