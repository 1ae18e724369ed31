"""Produce requests of a megabyte and more, whose CRC check and write leave the event loop for
threads: what a user sees must be exactly what a small produce gives. Appends to one partition
keep their order (a real idempotent producer's large and small batches interleaved), pipelined
large produces from several connections get distinct, gapless offsets, a corrupt large batch
is refused with nothing stored, and a topic deleted while its large batches are being written
takes nothing else down with it."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from broker.protocol import ApiKey, ErrorCode
from broker.protocol.records import Record, build_batch
from tests.integration.clients import QUIET, admin_client, create_topic, read_all
from tests.support.hostile import collect_frames, connections, push
from tests.support.nodes import RunningNode, run_node
from tests.support.wire import now_ms, produce, produce_values, produced, request_frame

MiB = 1 << 20
LARGE = {"max.message.bytes": str(8 * MiB), "segment.bytes": str(16 * MiB)}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    with run_node(
        tmp_path_factory.mktemp("large-produce"), {"message.max.bytes": str(8 * MiB)}
    ) as n:
        yield n


def _batch(value: bytes) -> bytes:
    return build_batch([Record(0, now_ms(), None, value)])


def _frame(topic: str, value: bytes, correlation_id: int) -> bytes:
    return request_frame(ApiKey.PRODUCE, 9, produce_values(topic, _batch(value)), correlation_id)


def test_an_idempotent_producers_large_and_small_batches_keep_their_order(
    node: RunningNode,
) -> None:
    create_topic(node.bootstrap, "mixed", 1, **LARGE)
    producer = Producer(
        {
            "bootstrap.servers": node.bootstrap,
            "enable.idempotence": True,
            "message.max.bytes": 8 * MiB,
            "linger.ms": 0,
            **QUIET,
        }
    )
    sent = []
    for number in range(40):
        size = 3 * MiB if number % 4 == 0 else 100
        value = struct.pack(">i", number) * (size // 4)
        sent.append(value)
        producer.produce("mixed", value=value, partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0
    got = read_all(node.bootstrap, "mixed", 1, len(sent))
    assert [m.offset() for m in got] == list(range(len(sent)))
    assert [m.value() for m in got] == sent


def test_pipelined_large_produces_get_distinct_gapless_offsets(node: RunningNode) -> None:
    create_topic(node.bootstrap, "pipelined", 1, **LARGE)
    per_connection, sizes = 6, [2 * MiB, 100, 1 * MiB + 1, 5000, 4 * MiB, 1 * MiB]
    with connections(node.port, 4) as socks:
        chunks: dict[socket.socket, list[bytes | memoryview]] = {
            sock: [
                _frame("pipelined", bytes([c]) * sizes[n], c * per_connection + n)
                for n in range(per_connection)
            ]
            for c, sock in enumerate(socks)
        }
        total = sum(len(frame) for frames in chunks.values() for frame in frames)
        assert push(chunks, timeout=60) == total
        frames = collect_frames(socks, per_connection, timeout=60)
    answers = [produced(f) for got in frames.values() for f in got]
    assert {a.error_code for a in answers} == {ErrorCode.none}
    assert sorted(a.base_offset for a in answers) == list(range(4 * per_connection))
    # Each connection's requests were appended in the order it sent them.
    for got in frames.values():
        offsets = [produced(f).base_offset for f in got]
        assert offsets == sorted(offsets)
    stored = read_all(node.bootstrap, "pipelined", 1, 4 * per_connection)
    assert sorted((len(m.value() or b""), (m.value() or b"?")[0]) for m in stored) == sorted(
        (sizes[n], c) for c in range(4) for n in range(per_connection)
    )


def test_a_corrupt_large_batch_is_refused_and_nothing_is_stored(node: RunningNode) -> None:
    create_topic(node.bootstrap, "corrupt", 1, **LARGE)
    address = ("localhost", node.port)
    assert produce(address, "corrupt", _batch(b"a" * 100)).error_code == ErrorCode.none
    for flipped_at in (100, 2 * MiB, -1):
        batch = bytearray(_batch(b"b" * (3 * MiB)))
        batch[flipped_at] ^= 0x20
        answer = produce(address, "corrupt", bytes(batch))
        assert answer.error_code == ErrorCode.corrupt_message, answer
        assert "CRC mismatch" in (answer.error_message or ""), answer
    after = produce(address, "corrupt", _batch(b"c" * (2 * MiB)))
    assert (after.error_code, after.base_offset) == (ErrorCode.none, 1)
    assert [len(m.value() or b"") for m in read_all(node.bootstrap, "corrupt", 1, 2)] == [
        100,
        2 * MiB,
    ]


def test_deleting_a_topic_while_its_large_batches_are_written_harms_nothing_else(
    node: RunningNode,
) -> None:
    """The writes in flight land in the deleted files (or are refused): the log dir stays
    online, other topics on it keep taking produces, and no answer is a storage error."""
    create_topic(node.bootstrap, "doomed", 1, **LARGE)
    create_topic(node.bootstrap, "bystander", 1)
    with connections(node.port, 4) as socks:
        chunks: dict[socket.socket, list[bytes | memoryview]] = {
            sock: [_frame("doomed", b"d" * (4 * MiB), 100 * c + n) for n in range(8)]
            for c, sock in enumerate(socks)
        }
        push({socks[0]: chunks[socks[0]][:2]}, timeout=30)
        admin = admin_client(node.bootstrap)
        admin.delete_topics(["doomed"])["doomed"].result(30)
        chunks[socks[0]] = chunks[socks[0]][2:]
        push(chunks, timeout=60)
        frames = collect_frames(socks, 8, timeout=60)
    # Every request answered, so every write has ended (and logged any failure) before the
    # answers and the log are checked: missing answers would leave nothing to check.
    assert [len(got) for got in frames.values()] == [8] * 4
    errors = {produced(f).error_code for got in frames.values() for f in got}
    assert errors <= {
        ErrorCode.none,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_leader_or_follower,
    }, errors
    answer = produce(("localhost", node.port), "bystander", _batch(b"still here"))
    assert answer.error_code == ErrorCode.none, answer
    assert "KAFKA_STORAGE_ERROR" not in node.log_tail(20000)
    assert "offline" not in node.log_tail(20000)


def test_a_topic_that_flushes_every_message_acknowledges_each_after_its_fsync(
    node: RunningNode,
) -> None:
    """`flush.messages=1`: every produce waits for its fsync on the flush thread before it is
    answered; a real idempotent producer's records, small and large, all come back in order."""
    create_topic(node.bootstrap, "durable", 1, **LARGE, **{"flush.messages": "1"})
    producer = Producer(
        {
            "bootstrap.servers": node.bootstrap,
            "enable.idempotence": True,
            "message.max.bytes": 8 * MiB,
            "linger.ms": 0,
            **QUIET,
        }
    )
    sent = [bytes([n]) * (2 * MiB if n % 5 == 0 else 50) for n in range(20)]
    for value in sent:
        producer.produce("durable", value=value, partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert [m.value() for m in read_all(node.bootstrap, "durable", 1, len(sent))] == sent
    assert "KAFKA_STORAGE_ERROR" not in node.log_tail(20000)
