"""ListOffsets on a new leader whose high watermark has not caught up (Kafka's
Partition.fetchOffsetForTimestamp): the leader keeps the high watermark it had as a follower,
which may be below one the old leader already answered, so until it reaches its epoch's start
offset (its log end when it became leader) LATEST, and the lookups that find nothing below it,
are OFFSET_NOT_AVAILABLE; EARLIEST and the tiered lookups are answered as ever. On real logs,
three replica managers (one per node), no network."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.metadata import MetadataImage, PartitionChanged, PartitionState
from broker.metadata.image import TopicState
from broker.protocol import ErrorCode
from broker.replica import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    OffsetResult,
    ReplicaManager,
)
from broker.storage import LogConfig, LogManager
from tests.unit.storage.logs import batch

CONFIG = LogConfig(segment_bytes=64 << 20)
TOPIC = TopicState("t", uuid.UUID(int=11))
NOT_AVAILABLE = ErrorCode.offset_not_available


class Nodes:
    """Replica managers of nodes 1-3 for partition t-0 (replicas 1, 2, 3), node 1 leading."""

    def __init__(self, tmp: Path) -> None:
        self.logs: list[LogManager] = []
        self.managers: dict[int, ReplicaManager] = {}
        for node_id in (1, 2, 3):
            logs = LogManager([tmp / f"node-{node_id}"], CONFIG)
            logs.startup(now_ms=0)
            manager = ReplicaManager(node_id, logs, MetadataImage(), lambda _: CONFIG, lambda: 1)
            manager.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2, 3), (1, 2, 3), 1, 0, 0)))
            self.logs.append(logs)
            self.managers[node_id] = manager

    def fetch(self, leader: int, follower: int) -> None:
        """One replica fetch of `follower` from `leader`, answered and taken in."""
        mine = self.managers[follower].partitions[("t", 0)]
        answer = self.managers[leader].read_for_follower(
            "t",
            0,
            follower,
            mine.log.log_end_offset,
            1 << 20,
            min_one_batch=True,
            current_leader_epoch=mine.leader_epoch,
            last_fetched_epoch=mine.log.epochs.latest_epoch,
        )
        assert answer.error == ErrorCode.none
        records = b"" if answer.records is None else answer.records.read()
        taken = self.managers[follower].append_from_leader(mine, records, answer.high_watermark)
        assert taken.error == ErrorCode.none

    def elect(self, leader: int, epoch: int, isr: tuple[int, ...]) -> None:
        """The controller's election, as every node replays it."""
        state = PartitionState((1, 2, 3), isr, leader, epoch, epoch)
        for manager in self.managers.values():
            manager.apply(PartitionChanged(TOPIC, 0, state))


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    made = Nodes(tmp_path)
    yield made
    for logs in made.logs:
        logs.shutdown(now_ms=2_000)


def _old_leader_answered_five(nodes: Nodes) -> None:
    """Node 1 leads and answers LATEST 5; node 2 has the records but not that high watermark
    (it learns it from its next fetch, which never comes)."""
    old = nodes.managers[1]
    stamps = [1_000, 2_000, 3_000, 4_000, 5_000]
    assert old.append("t", 0, batch(5, timestamps=stamps), acks=-1).error == ErrorCode.none
    nodes.fetch(1, 2)  # node 2 copies the batch
    nodes.fetch(1, 3)
    nodes.fetch(1, 2)  # ... and says it has it; so does node 3:
    nodes.fetch(1, 3)
    assert old.list_offset("t", 0, LATEST_TIMESTAMP).offset == 5
    assert nodes.managers[2].partitions[("t", 0)].high_watermark < 5


def test_a_new_leader_behind_on_its_high_watermark_does_not_answer_latest(
    nodes: Nodes,
) -> None:
    _old_leader_answered_five(nodes)
    nodes.elect(2, 1, (2, 3))  # node 1 is gone
    new = nodes.managers[2]
    partition = new.partitions[("t", 0)]
    assert partition.is_leader
    assert partition.leader_start_offset == 5
    assert partition.high_watermark < 5
    # Not the lower offset it has: a consumer would see the end of the partition go back.
    assert new.list_offset("t", 0, LATEST_TIMESTAMP).error == NOT_AVAILABLE
    # Once node 3 fetched from 5 the high watermark is there, and LATEST is answered.
    nodes.fetch(2, 3)
    assert partition.high_watermark == 5
    answer = new.list_offset("t", 0, LATEST_TIMESTAMP)
    assert (answer.error, answer.offset, answer.leader_epoch) == (ErrorCode.none, 5, 1)


def test_lookups_bounded_by_the_high_watermark_wait_and_the_others_are_answered(
    nodes: Nodes,
) -> None:
    _old_leader_answered_five(nodes)
    nodes.elect(2, 1, (2, 3))
    new = nodes.managers[2]
    assert new.partitions[("t", 0)].high_watermark == 0
    # A timestamp whose record is at or past the high watermark (or is not there at all), and
    # the record with the largest timestamp, past it too: Kafka's ReplicaManager.fetchOffset.
    for timestamp in (5_000, 9_000, MAX_TIMESTAMP):
        assert new.list_offset("t", 0, timestamp).error == NOT_AVAILABLE, timestamp
    # What does not depend on the high watermark: the log start, nothing tiered.
    for timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
        answer = new.list_offset("t", 0, timestamp)
        assert (answer.error, answer.offset) == (ErrorCode.none, 0)
    answer = new.list_offset("t", 0, LATEST_TIERED_TIMESTAMP)
    assert (answer.error, answer.offset) == (ErrorCode.none, -1)
    nodes.fetch(2, 3)
    for timestamp, offset in ((5_000, 4), (MAX_TIMESTAMP, 4)):
        answer = new.list_offset("t", 0, timestamp)
        assert (answer.error, answer.offset) == (ErrorCode.none, offset), timestamp
    # Nothing at or after it: "none" (-1), no error, once caught up.
    assert new.list_offset("t", 0, 9_000) == OffsetResult(ErrorCode.none)


def test_a_new_leader_whose_high_watermark_is_at_its_start_answers_at_once(
    nodes: Nodes,
) -> None:
    _old_leader_answered_five(nodes)
    nodes.fetch(1, 2)  # node 2 learns the high watermark 5 before node 1 goes
    assert nodes.managers[2].partitions[("t", 0)].high_watermark == 5
    nodes.elect(2, 1, (2, 3))
    answer = nodes.managers[2].list_offset("t", 0, LATEST_TIMESTAMP)
    assert (answer.error, answer.offset) == (ErrorCode.none, 5)


def test_a_leader_alone_in_its_isr_is_never_behind(nodes: Nodes) -> None:
    _old_leader_answered_five(nodes)
    nodes.elect(2, 1, (2,))  # the only one left: its log end is its high watermark
    answer = nodes.managers[2].list_offset("t", 0, LATEST_TIMESTAMP)
    assert (answer.error, answer.offset) == (ErrorCode.none, 5)
