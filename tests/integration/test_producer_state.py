"""Idempotent-producer state across a broker crash, on a real `gregor broker`.

No client library lets a test retry the very same batch after the broker died (a real producer
re-initialises instead), so this test speaks the protocol itself: it is the one place a
hand-built client stands in for a failure that cannot otherwise be caused. Everything else is
real: the process, its SIGKILL, the restart on the same data dir.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from broker.protocol import ErrorCode
from broker.protocol.records import Record, build_batch
from tests.integration.clients import create_topic
from tests.support.nodes import run_node, start_node
from tests.support.wire import init_producer_id, produce

PRODUCE_VERSION = 9


def _init_producer_id(port: int, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
    return init_producer_id(("localhost", port), producer_id, epoch)


def _produce(port: int, batch: bytes) -> Any:
    return produce(("localhost", port), "idempotent", batch)


def _batch(producer_id: int, epoch: int, sequence: int, count: int) -> bytes:
    # Current timestamps: a producer whose last record is older than producer.id.expiration.ms
    # (one day) is forgotten on load, as in Kafka.
    now_ms = time.time_ns() // 1_000_000
    records = [
        Record(offset=i, timestamp=now_ms + i, key=None, value=b"v%d" % (sequence + i))
        for i in range(count)
    ]
    return build_batch(
        records, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence
    )


def test_a_retried_batch_after_a_crash_is_not_written_twice(tmp_path: Path) -> None:
    node = start_node(tmp_path)
    try:
        create_topic(node.bootstrap, "idempotent", 1)
        producer_id, epoch = _init_producer_id(node.port)
        first = _produce(node.port, _batch(producer_id, epoch, 0, 5))
        second = _produce(node.port, _batch(producer_id, epoch, 5, 5))
        assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
        assert (second.error_code, second.base_offset) == (ErrorCode.none, 5)
    finally:
        node.kill()

    with run_node(tmp_path) as restarted:
        # The producer never saw the answer to its second batch and sends it again.
        retried = _produce(restarted.port, _batch(producer_id, epoch, 5, 5))
        assert (retried.error_code, retried.base_offset) == (ErrorCode.none, 5)
        # A gap in the sequence is refused; the next batch in sequence follows on.
        gap = _produce(restarted.port, _batch(producer_id, epoch, 20, 1))
        assert gap.error_code == ErrorCode.out_of_order_sequence_number
        following = _produce(restarted.port, _batch(producer_id, epoch, 10, 2))
        assert (following.error_code, following.base_offset) == (ErrorCode.none, 10)
        # A zombie with an older epoch is fenced once a newer epoch has written.
        bumped = _produce(restarted.port, _batch(producer_id, epoch + 1, 0, 1))
        assert bumped.error_code == ErrorCode.none
        zombie = _produce(restarted.port, _batch(producer_id, epoch, 12, 1))
        assert zombie.error_code == ErrorCode.invalid_producer_epoch
        # Producer ids handed out before the crash are never handed out again.
        new_id, _ = _init_producer_id(restarted.port)
        assert new_id != producer_id


def test_no_client_can_fence_another_idempotent_producer(tmp_path: Path) -> None:
    """InitProducerId without a transactional id gets a fresh id at epoch 0 whatever id and
    epoch it names, as from Kafka's coordinator: handing back the named id with its epoch
    bumped would let any client fence any producer whose id it has seen."""
    with run_node(tmp_path) as node:
        create_topic(node.bootstrap, "idempotent", 1)
        victim, epoch = _init_producer_id(node.port)
        assert epoch == 0
        first = _produce(node.port, _batch(victim, epoch, 0, 3))
        assert first.error_code == ErrorCode.none
        for named_epoch in (0, 5):
            other, other_epoch = _init_producer_id(node.port, victim, named_epoch)
            assert (other_epoch, other != victim) == (0, True)
        following = _produce(node.port, _batch(victim, epoch, 3, 2))
        assert (following.error_code, following.base_offset) == (ErrorCode.none, 3)
