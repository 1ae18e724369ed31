"""A controller whose image cannot take a committed metadata record stops, as Kafka's does: the
`gregor broker` process exits with status 1 and says which record, instead of deciding from an
image that no longer follows the log."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from broker.metadata.records import PartitionChangeRecord, encode_record
from broker.quorum import QuorumStore
from broker.raft import Entry
from tests.support.nodes import start_node

pytestmark = [pytest.mark.integration]


def test_a_controller_exits_naming_a_committed_record_it_cannot_apply(tmp_path: Path) -> None:
    node = start_node(tmp_path)
    assert node.stop() == 0
    # The metadata log gains a change to a topic no record created: the image cannot take it.
    store = QuorumStore(tmp_path / "logs", (1,), segment_bytes=8 << 20, now_ms=0)
    persisted = store.load(now_ms=0)
    start = 0 if persisted.snapshot is None else persisted.snapshot.id.end_offset
    offset = start + len(persisted.entries)
    poison = encode_record(PartitionChangeRecord(partition_id=0, topic_id=uuid.uuid4(), leader=1))
    store.append(offset, (Entry(persisted.election.epoch, poison),), 0, leader=1)
    store.flush(0)
    store.close(0)

    node.restart()
    deadline = time.monotonic() + 30
    while node.process.poll() is None:
        assert time.monotonic() < deadline, f"still running:\n{node.log_tail()}"
        time.sleep(0.1)
    assert node.process.returncode == 1, node.log_tail()
    said = node.log_tail()
    assert f"gregor: controller 1: the committed PartitionChangeRecord at offset {offset}" in said
