"""Partition directories carry their topic id (`partition.metadata`, KIP-516): a log of an
earlier topic of the same name is a stray, set aside and never served; a log from before
topic ids takes the id it is asked for."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from broker.protocol.records import Record, build_batch
from broker.storage import LogConfig, LogManager, LogOffline, StorageError
from broker.storage.manager import stray_dir_name
from broker.storage.partition_metadata import (
    PARTITION_METADATA,
    encode_uuid,
    read_topic_id,
    write_topic_id,
)

CONFIG = LogConfig(segment_bytes=1024 * 1024, file_delete_delay_ms=1_000)
OLD, NEW = uuid.uuid4(), uuid.uuid4()


def _batch(value: bytes) -> bytes:
    return build_batch([Record(0, 1_000, None, value)])


def _manager(log_dir: Path) -> LogManager:
    manager = LogManager([log_dir], CONFIG)
    manager.startup(now_ms=0)
    return manager


def test_the_file_is_kafkas_format_and_reads_back(tmp_path: Path) -> None:
    write_topic_id(tmp_path, OLD)
    text = (tmp_path / PARTITION_METADATA).read_text()
    assert text == f"version: 0\ntopic_id: {encode_uuid(OLD)}\n"
    assert len(encode_uuid(OLD)) == 22  # Kafka's Uuid.toString: unpadded base64
    assert read_topic_id(tmp_path) == OLD
    assert read_topic_id(tmp_path / "nowhere") is None


@pytest.mark.parametrize(
    "text", ["", "version: 0\n", "version: 7\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n", "garbage"]
)
def test_an_unreadable_file_names_itself(tmp_path: Path, text: str) -> None:
    (tmp_path / PARTITION_METADATA).write_text(text)
    with pytest.raises(StorageError, match=PARTITION_METADATA):
        read_topic_id(tmp_path)


def test_a_log_of_an_earlier_topic_is_set_aside_and_a_new_one_served(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    old = manager.create_log("t", 0, now_ms=0, topic_id=OLD)
    old.append_as_leader(_batch(b"OLD-topic-record"), leader_epoch=0, now_ms=0)
    manager.shutdown(now_ms=1)

    again = _manager(tmp_path)
    assert again.get_log("t", 0).topic_id == OLD  # loaded with the id it was written with
    new = again.create_log("t", 0, now_ms=10, topic_id=NEW)
    assert new.topic_id == NEW
    assert new.log_end_offset == 0, "the new topic must not serve the old topic's records"
    assert read_topic_id(tmp_path / "t-0") == NEW
    assert again.strays == 1
    [stray] = [p for p in tmp_path.iterdir() if p.name.endswith("-stray")]
    assert stray.name.startswith("t-0.")
    assert read_topic_id(stray) == OLD
    again.tick(now_ms=10 + CONFIG.file_delete_delay_ms)
    assert not stray.exists()
    again.shutdown(now_ms=2_000)


def test_a_stray_left_by_a_crash_is_removed_after_the_delay_not_loaded(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.create_log("t", 0, now_ms=0, topic_id=OLD)
    manager.shutdown(now_ms=1)
    # What a node that died right after setting the log aside leaves behind.
    stray = tmp_path / stray_dir_name("t", 0)
    (tmp_path / "t-0").rename(stray)

    again = _manager(tmp_path)
    assert ("t", 0) not in again.logs
    assert stray.exists()
    again.tick(now_ms=CONFIG.file_delete_delay_ms)
    assert not stray.exists()
    again.shutdown(now_ms=2_000)


def test_the_same_topic_id_keeps_its_log(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.create_log("t", 0, now_ms=0, topic_id=OLD).append_as_leader(
        _batch(b"kept"), leader_epoch=0, now_ms=0
    )
    manager.shutdown(now_ms=1)
    again = _manager(tmp_path)
    assert again.create_log("t", 0, now_ms=2, topic_id=OLD).log_end_offset == 1
    assert again.strays == 0
    again.shutdown(now_ms=3)


def test_a_log_from_before_topic_ids_takes_the_id(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.create_log("t", 0, now_ms=0).append_as_leader(_batch(b"v"), leader_epoch=0, now_ms=0)
    manager.shutdown(now_ms=1)
    assert not (tmp_path / "t-0" / PARTITION_METADATA).exists()
    again = _manager(tmp_path)
    assert again.create_log("t", 0, now_ms=2, topic_id=OLD).log_end_offset == 1
    assert read_topic_id(tmp_path / "t-0") == OLD
    again.shutdown(now_ms=3)


def test_a_partition_whose_identity_cannot_be_read_is_offline(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.create_log("t", 0, now_ms=0, topic_id=OLD)
    manager.create_log("u", 0, now_ms=0, topic_id=NEW)
    manager.shutdown(now_ms=1)
    (tmp_path / "t-0" / PARTITION_METADATA).write_text("version: 0\ntopic_id: ???\n")
    again = _manager(tmp_path)
    with pytest.raises(LogOffline, match=PARTITION_METADATA):
        again.get_log("t", 0)
    assert again.get_log("u", 0).topic_id == NEW
    again.shutdown(now_ms=2)
