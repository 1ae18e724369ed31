"""An idempotent producer's batch refused as its leader moves, then the next batch at the new
leader, on the wire, against three combined Gregor nodes and three Apache Kafka 4.3 nodes (the
Kafka run proves the answers are Kafka's).

This is the sequence behind the fault-injection run's one record written under two producer
epochs (docs/fault-injection.md): librdkafka takes the refusal for "not persisted", sends the
next batch, is answered OUT_OF_ORDER_SEQUENCE_NUMBER by the new leader, bumps its epoch and
renumbers from 0 a batch the new leader already had (librdkafka issue #4953). Here, by hand:

1. batch seq 0-2 (acks=all) is written on all three replicas of `[L, F, C]`, led by L (C is
   the active controller, L and F the other two);
2. follower F is paused (SIGSTOP), and once its parked fetch has been answered, batch seq 3
   (acks=all) waits at leader L for it;
3. a reassignment to `[F, C]` takes L out: its waiting batch is answered
   NOT_LEADER_OR_FOLLOWER (Kafka's DelayedProduce), and paused F becomes the leader;
4. F resumes, without seq 3: batch seq 4 is refused OUT_OF_ORDER_SEQUENCE_NUMBER;
5. seq 3 sent again is written, then seq 4: each record once, in one producer epoch, which is
   what a client that retries in order gets.

The paused follower is never the active controller: Kafka's brokers then forward the
reassignment to the paused node until their request times out (30 s), by which time the new
controller has fenced it (`broker.session.timeout.ms`) and taken it out of the ISR, and the
waiting batch is acknowledged without it.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from broker.protocol import ApiKey, ErrorCode, request_type
from broker.protocol.records import Record, build_batch
from tests.support.clusters import ThreeNodes, active_controller, shared_three_nodes
from tests.support.requests import fill
from tests.support.wire import call, init_producer_id, now_ms, produce_values, topic_metadata

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SETTINGS = {
    "auto.leader.rebalance.enable": "false",
    "broker.session.timeout.ms": "30000",
}
"""Leaders stay where the test puts them; a paused broker stays registered and in the ISR
(`replica.lag.time.max.ms`, 30 s) while the scenario runs."""
TOPIC = "moved-under-a-producer"


cluster = shared_three_nodes(SETTINGS)


def _addresses(cluster: ThreeNodes) -> dict[int, tuple[str, int]]:
    """Node id → address, as Metadata names them."""
    host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)
    metadata = topic_metadata((host, int(port)), TOPIC)
    return {b.node_id: (b.host, b.port) for b in metadata.brokers}


def _leads(address: tuple[str, int], node: int, isr: set[int]) -> bool:
    """The node at `address` sees itself (`node`) leading with `isr` in sync."""
    try:
        partitions = topic_metadata(address, TOPIC).topics[0].partitions
    except OSError:
        return False
    return any(p.leader_id == node and set(p.isr_nodes) == isr for p in partitions)


def _wait(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.2)


def _send(address: tuple[str, int], producer: tuple[int, int], sequence: int, count: int) -> Any:
    """A batch of `count` records from `sequence` (acks=all, 60 s to be acknowledged)."""
    producer_id, epoch = producer
    records = [Record(i, now_ms(), None, b"seq-%d" % (sequence + i)) for i in range(count)]
    batch = build_batch(
        records, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence
    )
    values = produce_values(TOPIC, batch) | {"timeout": timedelta(seconds=60)}
    body = fill(request_type(ApiKey.PRODUCE, 9), values)
    answer = call(address, ApiKey.PRODUCE, 9, body, timeout=90)
    return answer.responses[0].partition_responses[0]


def _init_producer_id(address: tuple[str, int]) -> tuple[int, int]:
    """InitProducerId, again while the node answers COORDINATOR_LOAD_IN_PROGRESS (a new
    node waits for its first block of producer ids, as Kafka's does)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return init_producer_id(address)
        except AssertionError as refused:
            if "coordinator_load_in_progress" not in str(refused):
                raise
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _reassign(address: tuple[str, int], replicas: list[int]) -> Any:
    body = fill(
        request_type(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0),
        {
            "timeout": timedelta(seconds=30),
            "topics": [
                {"name": TOPIC, "partitions": [{"partition_index": 0, "replicas": replicas}]}
            ],
        },
    )
    answer = call(address, ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, body, timeout=60)
    return answer.responses[0].partitions[0]


def test_a_batch_refused_as_its_leader_moves_puts_the_next_out_of_order(
    cluster: ThreeNodes,
) -> None:
    nodes = _addresses(cluster)
    controller = active_controller(nodes[1])
    leader, follower = (n for n in (1, 2, 3) if n != controller)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    assignment = [[leader, follower, controller]]
    created = admin.create_topics(
        [NewTopic(TOPIC, num_partitions=1, replica_assignment=assignment)]
    )
    created[TOPIC].result(30)
    _wait("the leader leads with all in sync", lambda: _leads(nodes[leader], leader, {1, 2, 3}))
    producer = _init_producer_id(nodes[leader])

    written = _send(nodes[leader], producer, 0, 3)
    assert (written.error_code, written.base_offset) == (ErrorCode.none, 0)

    cluster.pause(follower)
    waiting: list[Any] = []
    try:
        # The fetch the follower had parked at the leader is answered, empty, after
        # `replica.fetch.wait.max.ms` (500 ms); paused, it sends no other, so the leader sends
        # it nothing of what comes next.
        time.sleep(1.5)
        sender = threading.Thread(
            target=lambda: waiting.append(_send(nodes[leader], producer, 3, 1))
        )
        sender.start()
        time.sleep(1)  # it waits for the paused follower, in the ISR
        assert not waiting, waiting
        moved = _reassign(nodes[controller], [follower, controller])
        assert moved.error_code == ErrorCode.none, moved
        sender.join(60)
        assert waiting, "the waiting batch was not answered once its leader went"
        # (were it acknowledged, the partition as the controller sees it says who left the ISR)
        seen = topic_metadata(nodes[controller], TOPIC).topics[0].partitions
        assert waiting[0].error_code == ErrorCode.not_leader_or_follower, (waiting[0], seen)
    finally:
        cluster.resume(follower)
    _wait("the follower leads", lambda: _leads(nodes[follower], follower, {follower, controller}))

    # It was paused before seq 3 was written: the next batch, seq 4, is out of order there.
    deadline = time.monotonic() + 30
    while (
        refused := _send(nodes[follower], producer, 4, 1)
    ).error_code == ErrorCode.not_leader_or_follower and time.monotonic() < deadline:
        time.sleep(0.2)  # its replica manager takes the lead a moment after its metadata
    assert refused.error_code == ErrorCode.out_of_order_sequence_number, refused

    # Sent again in order, each record is written once, in the same producer epoch.
    again = _send(nodes[follower], producer, 3, 1)
    assert (again.error_code, again.base_offset) == (ErrorCode.none, 3), again
    last = _send(nodes[follower], producer, 4, 1)
    assert (last.error_code, last.base_offset) == (ErrorCode.none, 4), last
