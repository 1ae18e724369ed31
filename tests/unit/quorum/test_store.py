"""The metadata log's files: what a restart finds is what was persisted, in Kafka's layout; a
torn tail is dropped; a snapshot bounds the log; an install cut short by a crash is finished on
restart, never half-read."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from broker.metadata import MetadataImage
from broker.metadata.records import (
    BrokerEndpoint,
    ConfigRecord,
    FeatureLevelRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    decode_record,
    encode_record,
)
from broker.protocol.errors import MalformedInput
from broker.protocol.records import Record, build_batch, iter_batches
from broker.quorum.batches import read_snapshot, write_snapshot
from broker.quorum.store import QuorumStore, checkpoint_name
from broker.raft import ElectionState, Entry, RaftLog, Snapshot, SnapshotId
from broker.storage import StorageError
from tests.unit.storage.logs import abandon

SEGMENT_BYTES = 8 * 1024 * 1024


def _store(path: Path, voters: tuple[int, ...] = (1, 2, 3)) -> QuorumStore:
    return QuorumStore(path, voters, segment_bytes=SEGMENT_BYTES, now_ms=1)


def _entries(epoch: int, *payloads: bytes, control: bool = True) -> list[Entry]:
    head = [Entry(epoch, b"", control=True)] if control else []
    return head + [Entry(epoch, payload) for payload in payloads]


def _snapshot(end: int, epoch: int, *payloads: bytes) -> Snapshot:
    data = write_snapshot(payloads, end_offset=end, epoch=epoch, last_timestamp=5, now_ms=5)
    return Snapshot(SnapshotId(end, epoch), data)


def test_election_and_entries_survive_a_restart(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.load(1) == type(store.load(1))(ElectionState(), None, [])
    store.save_election(ElectionState(3, voted_for=2, leader=2))
    first = _entries(2, b"a", b"b")
    second = _entries(3, b"c")
    store.append(0, tuple(first), 10, leader=2)
    store.append(3, tuple(second), 11, leader=2)
    store.close(12)

    persisted = _store(tmp_path).load(13)
    assert persisted.election == ElectionState(3, voted_for=2, leader=2)
    assert persisted.entries == first + second
    state = json.loads((tmp_path / "__cluster_metadata-0" / "quorum-state").read_text())
    # Kafka's quorum-state JSON: -1 for "none", the voters listed.
    assert (state["leaderEpoch"], state["votedId"], state["leaderId"]) == (3, 2, 2)
    assert state["currentVoters"] == [{"voterId": 1}, {"voterId": 2}, {"voterId": 3}]


def test_a_log_of_another_voter_set_is_refused_naming_both(tmp_path: Path) -> None:
    """A node restarted with other voters (a combined cluster's data dir reused under
    dedicated controllers, a voter list edited) would join a second quorum with a log of the
    first: refused, as Kafka's QuorumState refuses it."""
    store = _store(tmp_path)
    store.save_election(ElectionState(2, voted_for=1, leader=1))
    store.close(1)
    with pytest.raises(StorageError, match=r"voters \[4, 5, 6\].*quorum of voters \[1, 2, 3\]"):
        _store(tmp_path, voters=(4, 5, 6)).load(2)
    # The same voters in another order are the same quorum.
    assert _store(tmp_path, voters=(3, 1, 2)).load(3).election.epoch == 2


def test_entries_are_kafka_batches_with_the_epoch_and_a_leader_change_control_batch(
    tmp_path: Path,
) -> None:
    """A batch per proposal: one of two entries (x, y) and one of a single entry (z)."""
    store = _store(tmp_path)
    proposal = [Entry(4, b"x", continued=True), Entry(4, b"y"), Entry(4, b"z")]
    store.append(0, (Entry(4, b"", control=True), *proposal), 10, leader=1)
    store.close(11)
    segment = tmp_path / "__cluster_metadata-0" / f"{0:020d}.log"
    headers = [header for _, header in iter_batches(segment.read_bytes())]
    assert [(h.base_offset, h.records_count, h.is_control) for h in headers] == [
        (0, 1, True),
        (1, 2, False),
        (3, 1, False),
    ]
    assert {h.partition_leader_epoch for h in headers} == {4}
    # Read back, the proposals are as they were proposed.
    assert _store(tmp_path).load(12).entries[1:] == proposal


def test_a_torn_write_keeps_whole_proposals_only(tmp_path: Path) -> None:
    """A crash in the middle of writing a proposal (its batch cut short) loses all of it on
    restart, never a part: the proposal before it stays whole."""
    store = _store(tmp_path)
    first = [Entry(1, b"a", continued=True), Entry(1, b"b")]
    torn = [Entry(1, b"c", continued=True), Entry(1, b"d", continued=True), Entry(1, b"e")]
    store.append(0, (Entry(1, b"", control=True), *first, *torn), 10, leader=1)
    store.close(11)
    segment = tmp_path / "__cluster_metadata-0" / f"{0:020d}.log"
    data = segment.read_bytes()
    (last, _), *_ = reversed(list(iter_batches(data)))
    segment.write_bytes(data[: last + (len(data) - last) // 2])
    assert _store(tmp_path).load(12).entries[1:] == first


def test_truncation_drops_the_tail_for_good(tmp_path: Path) -> None:
    store = _store(tmp_path)
    written = _entries(1, b"a", b"b", b"c")
    store.append(0, tuple(written), 10, leader=1)
    # Offset 2 is inside the batch of 1..3: what it keeps of that batch is written again.
    store.truncate(2, RaftLog(written), 11, leader=1)
    store.append(2, tuple(_entries(2, b"z")), 11, leader=2)
    store.close(12)
    assert _store(tmp_path).load(13).entries == [
        Entry(1, b"", control=True),
        Entry(1, b"a"),
        Entry(2, b"", control=True),
        Entry(2, b"z"),
    ]


def test_a_torn_tail_is_dropped(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.append(0, tuple(_entries(1, b"kept")), 10, leader=1)
    store.append(2, tuple(_entries(1, b"torn", control=False)), 11, leader=1)
    segment = tmp_path / "__cluster_metadata-0" / f"{0:020d}.log"
    size = segment.stat().st_size
    abandon(store._log)  # a crash: files let go without a clean close
    with open(segment, "r+b") as handle:
        handle.truncate(size - 5)
    assert _store(tmp_path).load(12).entries == _entries(1, b"kept")


def test_a_snapshot_bounds_the_log_and_older_ones_go(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.append(0, tuple(_entries(1, b"a", b"b", b"c", b"d")), 10, leader=1)
    store.save_snapshot(_snapshot(2, 1, b"state-2"))
    store.delete_before(2, 11)
    store.save_snapshot(_snapshot(4, 1, b"state-4"))
    store.delete_before(4, 12)
    store.close(13)
    directory = tmp_path / "__cluster_metadata-0"
    assert sorted(p.name for p in directory.glob("*.checkpoint")) == [
        checkpoint_name(SnapshotId(4, 1))
    ]
    assert checkpoint_name(SnapshotId(4, 1)) == "00000000000000000004-0000000001.checkpoint"
    persisted = _store(tmp_path).load(14)
    assert persisted.snapshot is not None
    assert persisted.snapshot.id == SnapshotId(4, 1)
    assert read_snapshot(persisted.snapshot.data) == [b"state-4"]
    assert persisted.entries == [Entry(1, b"d")]


def test_an_installed_snapshot_replaces_the_log(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.append(0, tuple(_entries(1, b"a", b"stale")), 10, leader=1)
    store.install(_snapshot(7, 3, b"fetched"), 11)
    store.append(7, tuple(_entries(3, b"after", control=False)), 12, leader=2)
    store.close(13)
    persisted = _store(tmp_path).load(14)
    assert persisted.snapshot is not None
    assert persisted.snapshot.id == SnapshotId(7, 3)
    assert persisted.entries == [Entry(3, b"after")]


@pytest.mark.parametrize(
    ("epoch", "kept"),
    [
        (1, True),  # the log holds the snapshot's last entry, in its epoch: it continues it
        (5, False),  # the same offset in another epoch: the log diverged, it goes whole
    ],
)
def test_an_install_cut_short_is_finished_on_restart(
    tmp_path: Path, epoch: int, kept: bool
) -> None:
    """The crash the core's `Ready.install` warns of: the snapshot is on disk, the log it
    replaces was not dropped yet."""
    store = _store(tmp_path)
    store.append(0, tuple(_entries(1, b"a", b"b", b"c")), 10, leader=1)
    store.save_snapshot(_snapshot(3, epoch, b"fetched"))
    abandon(store._log)
    persisted = _store(tmp_path).load(11)
    assert persisted.snapshot is not None
    assert persisted.entries == ([Entry(1, b"c")] if kept else [])


def test_an_install_past_the_log_end_drops_the_log(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.append(0, tuple(_entries(1, b"a")), 10, leader=1)
    store.save_snapshot(_snapshot(9, 2, b"fetched"))
    abandon(store._log)
    reopened = _store(tmp_path)
    assert reopened.load(11).entries == []
    reopened.append(9, tuple(_entries(2, b"next", control=False)), 12, leader=2)
    reopened.close(13)
    assert _store(tmp_path).load(14).entries == [Entry(2, b"next")]


def test_a_snapshot_cut_short_is_never_read(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.append(0, tuple(_entries(1, b"a")), 10, leader=1)
    store.close(11)
    directory = tmp_path / "__cluster_metadata-0"
    # A snapshot being written when the node died: removed on restart.
    (directory / (checkpoint_name(SnapshotId(1, 1)) + ".part")).write_bytes(b"half")
    assert _store(tmp_path).load(12).snapshot is None
    assert not list(directory.glob("*.part"))
    # A damaged complete one stops the node with its name rather than loading part of it.
    data = _snapshot(1, 1, b"state").data
    (directory / checkpoint_name(SnapshotId(1, 1))).write_bytes(data[:-3])
    with pytest.raises(StorageError, match="not a readable snapshot"):
        _store(tmp_path).load(13)


def test_a_log_that_starts_late_without_a_snapshot_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.install(_snapshot(5, 1, b"s"), 10)
    store.append(5, tuple(_entries(1, b"x", control=False)), 11, leader=1)
    store.close(12)
    for path in (tmp_path / "__cluster_metadata-0").glob("*.checkpoint"):
        path.unlink()
    with pytest.raises(StorageError, match="no snapshot holds the entries before it"):
        _store(tmp_path).load(13)


def test_a_log_written_before_the_quorum_reads_as_its_entries(tmp_path: Path) -> None:
    """A single node's metadata log from before Raft (one batch per commit, the epoch bumped
    at every start, the node recorded as leader and voter) carries on as this node's log."""
    directory = tmp_path / "__cluster_metadata-0"
    directory.mkdir()
    topic = encode_record(TopicRecord("t", uuid.uuid4()))
    config = encode_record(ConfigRecord(2, "t", "retention.ms", "5"))
    (directory / f"{0:020d}.log").write_bytes(
        build_batch([Record(0, 1, None, topic)], partition_leader_epoch=1)
        + build_batch([Record(1, 2, None, config)], partition_leader_epoch=2)
    )
    (directory / "quorum-state").write_text(
        json.dumps({"clusterId": "", "leaderId": 1, "leaderEpoch": 2, "votedId": 1})
    )
    persisted = _store(tmp_path, voters=(1,)).load(3)
    assert persisted.election == ElectionState(2, voted_for=1, leader=1)
    assert persisted.entries == [Entry(1, topic), Entry(2, config)]


def test_a_snapshot_without_header_or_footer_is_malformed() -> None:
    data = build_batch([Record(0, 1, None, b"x")])
    with pytest.raises(MalformedInput, match="no header or no footer"):
        read_snapshot(data)


def test_an_image_rebuilt_from_its_snapshot_records_is_the_same_image() -> None:
    topic_id = uuid.uuid4()
    records = [
        FeatureLevelRecord("metadata.version", 21),
        RegisterBrokerRecord(
            broker_id=1,
            incarnation_id=uuid.uuid4(),
            broker_epoch=1,
            end_points=(BrokerEndpoint("PLAINTEXT", "h", 9092, 0),),
            rack="r1",
        ),
        UnfenceBrokerRecord(1, 1),
        TopicRecord("t", topic_id),
        PartitionRecord(partition_id=0, topic_id=topic_id, replicas=(1,), isr=(1,), leader=1),
        PartitionChangeRecord(partition_id=0, topic_id=topic_id, isr=(1,), leader=1),
        ConfigRecord(2, "t", "retention.ms", "5"),
        ConfigRecord(4, "", "max.connections", "9"),
        ProducerIdsRecord(broker_id=1, broker_epoch=1, next_producer_id=2000),
    ]
    image = MetadataImage()
    for offset, record in enumerate(records):
        image.apply(record, offset)
    payloads = [encode_record(r) for r in image.snapshot_records()]
    data = write_snapshot(payloads, end_offset=9, epoch=2, last_timestamp=1, now_ms=1)
    rebuilt = MetadataImage()
    changes = rebuilt.load([decode_record(p) for p in read_snapshot(data)], 8)
    assert rebuilt.snapshot_records() == image.snapshot_records()
    assert rebuilt.topics["t"].partitions[0] == image.topics["t"].partitions[0]
    assert rebuilt.brokers == image.brokers
    assert rebuilt.next_producer_id == 2000
    assert rebuilt.offset == 8
    assert len(changes) == 3  # the partition and the two configs, for the broker side


def test_loading_a_snapshot_reports_topics_that_are_gone() -> None:
    image = MetadataImage()
    old_id = uuid.uuid4()
    image.apply(TopicRecord("old", old_id), 0)
    image.apply(
        PartitionRecord(partition_id=0, topic_id=old_id, replicas=(1,), isr=(1,), leader=1), 1
    )
    changes = image.load([], 5)
    assert [type(c).__name__ for c in changes] == ["TopicRemoved"]
    assert (image.topics, image.topics_by_id) == ({}, {})
