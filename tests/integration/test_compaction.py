"""Compaction on a real `gregor broker`, off its serving loop: while a cleaning round is frozen
in the middle, every client is still served; a worker killed mid-round is replaced and the
round done again; a partition whose records cannot be decoded is named uncleanable once while
the others are cleaned; a node stopped mid-round leaves nothing half-done behind.

On main before this change a round ran on the event loop (a 45 MB segment stopped every client
for 10 s): there was no worker to freeze, and freezing the round froze the broker."""

from __future__ import annotations

import os
import signal
import struct
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import google_crc32c
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.clients import QUIET, admin_client, create_topic, read_all
from tests.support.nodes import RunningNode, run_node
from tests.support.processes import descendants

CLEANER = {"log.cleaner.backoff.ms": "100"}
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": str(1024 * 1024),
    "min.cleanable.dirty.ratio": "0.01",
}
KEYS = 20


def _produce(bootstrap: str, topic: str, count: int, tag: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **QUIET})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % (i % KEYS), value=f"{tag}-{i}".encode() + b"x" * 200)
    assert producer.flush(30) == 0


def _log_bytes(node: RunningNode, topic: str) -> int:
    """Bytes in the partition's live segments (`.log`, not the retired `.log.deleted`)."""
    directory = node.config.parent / "logs" / f"{topic}-0"
    return sum(p.stat().st_size for p in directory.glob("*.log"))


def _wait(condition: Callable[[], bool], what: str, node: RunningNode, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s:\n{node.log_tail()}")
        time.sleep(0.1)


def _cleaner_pid(node: RunningNode) -> int | None:
    """The broker's cleaner worker: the process below it started by multiprocessing's spawn."""
    for pid in descendants(node.process.pid)[1:]:
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def _latest(bootstrap: str, topic: str) -> tuple[int, dict[bytes | None, bytes | None]]:
    """How many records a consumer reads from the start of partition 0, and the last value it
    sees for each key."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}", **QUIET}
    )
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, 0)])
    count, last_offset = 0, -1
    latest: dict[bytes | None, bytes | None] = {}
    deadline = time.monotonic() + 30
    try:
        while last_offset < end - 1 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            offset = message.offset()
            assert offset is not None
            assert offset > last_offset
            last_offset = offset
            count += 1
            latest[message.key()] = message.value()
    finally:
        consumer.close()
    assert last_offset == end - 1, f"read up to {last_offset} of {end}"
    return count, latest


def test_clients_are_served_while_a_round_is_frozen_and_a_killed_worker_is_replaced(
    tmp_path: Path,
) -> None:
    with run_node(tmp_path, CLEANER) as node:
        create_topic(node.bootstrap, "compacted", 1, **COMPACTED)
        create_topic(node.bootstrap, "events", 1)
        _produce(node.bootstrap, "compacted", 20_000, "first")  # about 4 segments
        _wait(lambda: "cleaned compacted-0" in node.log_tail(100_000), "a first round", node)
        worker = _cleaner_pid(node)
        assert worker is not None, "no cleaner worker process beside the broker"

        os.kill(worker, signal.SIGSTOP)  # the next round hangs in the middle
        _produce(node.bootstrap, "compacted", 20_000, "second")
        _wait(
            lambda: node.log_tail(100_000).count("cleaning compacted-0") >= 2,
            "a second round",
            node,
        )
        frozen = _log_bytes(node, "compacted")
        # Every client is served meanwhile: produce, fetch, metadata, a full read of the log
        # being cleaned.
        _produce(node.bootstrap, "events", 100, "event")
        assert len(read_all(node.bootstrap, "events", 1, 100)) == 100
        assert "events" in admin_client(node.bootstrap).list_topics(timeout=10).topics
        count, latest = _latest(node.bootstrap, "compacted")
        # The second round has not removed anything: it is frozen (SIGSTOP, so no wait is
        # involved). The same two observations show the round's work once the worker is killed.
        assert count > 20_000
        assert _log_bytes(node, "compacted") == frozen

        os.kill(worker, signal.SIGKILL)
        _wait(
            lambda: (_cleaner_pid(node) or worker) != worker,
            "a new cleaner worker",
            node,
        )
        _wait(
            lambda: _log_bytes(node, "compacted") < frozen / 4,
            "the round done again by the new worker",
            node,
        )
        assert "the log cleaner worker ended (exit code -9)" in node.log_tail(100_000)
        count, after = _latest(node.bootstrap, "compacted")
        assert count < 5_000
        assert after == latest  # the last value of every key, as before cleaning


def _break_first_record(segment: Path) -> None:
    """Make the first record of the segment's first batch undecodable (its length now runs past
    the batch) and give the batch a matching CRC, as a bug in an older writer could have: the
    batch loads, and only decoding its records fails."""
    data = bytearray(segment.read_bytes())
    data[61:63] = b"\xfe\x7f"
    (length,) = struct.unpack_from(">i", data, 8)
    crc = google_crc32c.value(bytes(data[21 : 12 + length]))
    struct.pack_into(">I", data, 17, crc)
    segment.write_bytes(bytes(data))


def test_an_undecodable_partition_is_named_uncleanable_once_and_the_others_are_cleaned(
    tmp_path: Path,
) -> None:
    with run_node(tmp_path, {"log.cleaner.enable": "false"}) as node:
        create_topic(node.bootstrap, "broken", 1, **COMPACTED)
        create_topic(node.bootstrap, "good", 1, **COMPACTED)
        _produce(node.bootstrap, "broken", 30_000, "b")
        _produce(node.bootstrap, "good", 20_000, "g")
    _break_first_record(tmp_path / "logs" / "broken-0" / f"{0:020d}.log")
    good = _log_bytes_at(tmp_path, "good")

    with run_node(tmp_path, CLEANER) as node:
        _wait(lambda: _log_bytes(node, "good") < good / 4, "the good partition cleaned", node)
        # A retry is shown by a round, not by a wait: broken-0, never cleaned, is all dirty
        # (ratio 1), so once good-0 has a clean part every round that picks good-0 again is
        # one that would have picked broken-0 had it been retried.
        rounds = node.log_tail(1_000_000).count("cleaning good-0")
        _produce(node.bootstrap, "good", 6_000, "again")  # a closed dirty segment
        _wait(
            lambda: node.log_tail(1_000_000).count("cleaning good-0") > rounds,
            "a later round on good-0",
            node,
        )
        text = node.log_tail(1_000_000)
        assert text.count("broken-0 is uncleanable") == 1
        assert "cannot be compacted" in text
        _produce(node.bootstrap, "good", 10, "after")  # and the node serves on


def _log_bytes_at(tmp_path: Path, topic: str) -> int:
    return sum(p.stat().st_size for p in (tmp_path / "logs" / f"{topic}-0").glob("*.log"))


def test_a_node_stopped_mid_round_stops_cleanly_and_loses_nothing(tmp_path: Path) -> None:
    with run_node(tmp_path, CLEANER) as node:
        create_topic(node.bootstrap, "compacted", 1, **COMPACTED)
        _produce(node.bootstrap, "compacted", 6_000, "seed")  # one closed segment: a round
        _wait(lambda: "cleaned compacted-0" in node.log_tail(100_000), "a first round", node)
        worker = _cleaner_pid(node)
        assert worker is not None
        os.kill(worker, signal.SIGSTOP)
        _produce(node.bootstrap, "compacted", 20_000, "dirty")
        _wait(
            lambda: node.log_tail(100_000).count("cleaning compacted-0") >= 2,
            "a second round",
            node,
        )
        before = _latest(node.bootstrap, "compacted")
    # run_node checked the exit code (0) on SIGTERM; the frozen worker went with the node. Not
    # a race: a stopped process never leaves by itself, so one left behind is still there.
    assert not Path(f"/proc/{worker}").exists()
    with run_node(tmp_path, {"log.cleaner.enable": "false"}) as node:
        assert not list((tmp_path / "logs" / "compacted-0").glob("*.cleaned"))
        assert _latest(node.bootstrap, "compacted") == before
