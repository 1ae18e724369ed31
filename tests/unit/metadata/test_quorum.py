"""The metadata log: each start is a new leader epoch, committed records replay in order after a
restart, and a torn tail from a crash is dropped rather than replayed."""

from __future__ import annotations

import uuid
from pathlib import Path

from broker.metadata import MetadataImage, MetadataLog
from broker.metadata.records import ConfigRecord, TopicRecord
from tests.unit.storage.logs import abandon


def test_records_replay_after_reopen_with_a_new_epoch(tmp_path: Path) -> None:
    log = MetadataLog(tmp_path, node_id=1, now_ms=1)
    assert log.epoch == 1
    topic_id = uuid.uuid4()
    assert log.append([TopicRecord("a", topic_id)], now_ms=2) == 0
    assert log.append([ConfigRecord(2, "a", "retention.ms", "5")], now_ms=3) == 1
    log.close(now_ms=4)

    reopened = MetadataLog(tmp_path, node_id=1, now_ms=5)
    assert reopened.epoch == 2
    replayed = list(reopened.replay())
    assert replayed == [
        (0, TopicRecord("a", topic_id)),
        (1, ConfigRecord(2, "a", "retention.ms", "5")),
    ]
    image = MetadataImage()
    for offset, record in replayed:
        image.apply(record, offset)
    assert image.topic_config("a") == {"retention.ms": "5"}
    assert reopened.append([TopicRecord("b", uuid.uuid4())], now_ms=6) == 2
    reopened.close(now_ms=7)


def test_a_torn_tail_is_dropped(tmp_path: Path) -> None:
    log = MetadataLog(tmp_path, node_id=1, now_ms=1)
    log.append([TopicRecord("kept", uuid.uuid4())], now_ms=2)
    log.append([TopicRecord("torn", uuid.uuid4())], now_ms=3)
    segment = tmp_path / "__cluster_metadata-0" / f"{0:020d}.log"
    size = segment.stat().st_size
    # a crash mid-write: let go of the files without a clean close, and cut the last batch short
    abandon(log._log)
    with open(segment, "r+b") as handle:
        handle.truncate(size - 5)
    reopened = MetadataLog(tmp_path, node_id=1, now_ms=4)
    names = [r.name for _, r in reopened.replay() if isinstance(r, TopicRecord)]
    assert names == ["kept"]
    assert reopened.end_offset == 1
    reopened.close(now_ms=5)
