"""Follower fetching (KIP-392): with `replica.selector.class` set to Kafka's rack-aware selector
and each node's `broker.rack`, a consumer that names its rack (`client.rack`) is pointed by
the leader at the replica in its rack and fetches from it, reading every record exactly once;
a consumer of another rack, or of none, stays on the leader. Run against Gregor and Apache
Kafka alike; where the consumer fetches from is what librdkafka's own statistics say (each
partition's `broker`, beside its `leader`). Kafka's Java consumer, which keeps a fetch session,
reads the whole topic from the follower's rack too."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from broker.config import RACK_AWARE_SELECTOR
from tests.integration.clients import QUIET
from tests.support.clusters import KINDS, three_nodes
from tests.support.kafka_dist import KafkaTools

RACKS = {1: "zone-a", 2: "zone-b", 3: "zone-c"}
TOPIC = "near"
RECORDS = 200
WATCH_S = 3.0
"""How long a consumer reads at least: its statistics (every 200 ms) see where it fetches."""


def _produce(bootstrap: str, count: int, first: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **QUIET})
    failed: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    for i in range(first, first + count):
        producer.produce(TOPIC, str(i).encode(), on_delivery=delivered)
    assert producer.flush(30) == 0
    assert not failed, failed


def _leader(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    deadline = time.monotonic() + 30
    while True:
        topic = admin.list_topics(TOPIC, timeout=10).topics[TOPIC]
        partition = topic.partitions.get(0) if topic.error is None else None
        if partition is not None and partition.leader >= 0 and len(partition.isrs) == 3:
            return int(partition.leader)
        assert time.monotonic() < deadline, "the topic has no leader with every replica in sync"
        time.sleep(0.2)


def _read_watching(bootstrap: str, rack: str | None, want: int) -> tuple[list[int], set[int]]:
    """Read `want` records of the partition from its start with `client.rack` = `rack`;
    return their values and the brokers the consumer was seen fetching from."""
    fetched_from: set[int] = set()

    def statistics(text: str) -> None:
        partition = json.loads(text)["topics"].get(TOPIC, {}).get("partitions", {}).get("0")
        if partition is not None and partition.get("broker", -1) >= 0:
            fetched_from.add(int(partition["broker"]))

    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"reader-{rack}",
        "enable.auto.commit": False,
        "statistics.interval.ms": 200,
        "stats_cb": statistics,
        **QUIET,
    }
    if rack is not None:
        settings["client.rack"] = rack
    consumer = Consumer(settings)
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values: list[int] = []
    started = time.monotonic()
    try:
        while len(values) < want or time.monotonic() - started < WATCH_S:
            assert time.monotonic() - started < 60, f"read {len(values)} of {want}"
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(int(message.value() or b"-1"))
    finally:
        consumer.close()
    return values, fetched_from


@pytest.mark.parametrize("kind", KINDS)
def test_a_consumer_fetches_from_the_replica_in_its_own_rack(kind: str, tmp_path: Path) -> None:
    settings = {"replica.selector.class": RACK_AWARE_SELECTOR}
    each = {node: {"broker.rack": rack} for node, rack in RACKS.items()}
    with three_nodes(kind, tmp_path, settings, each=each) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
        admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(timeout=30)
        _produce(cluster.bootstrap, RECORDS, 0)
        leader = _leader(cluster.bootstrap)
        follower = min(node for node in RACKS if node != leader)

        values, fetched_from = _read_watching(cluster.bootstrap, RACKS[follower], RECORDS)
        assert values == list(range(RECORDS))  # every record, once, in order
        assert follower in fetched_from, (leader, follower, fetched_from)

        elsewhere, from_leader = _read_watching(cluster.bootstrap, None, RECORDS)
        assert elsewhere == list(range(RECORDS))
        assert from_leader == {leader}

        # Kafka's Java consumer (fetch sessions, unlike librdkafka) in the follower's rack,
        # on a topic that is no longer written to: every record, at once.
        read = KafkaTools(cluster.bootstrap).console_consumer(
            "--topic", TOPIC, "--from-beginning", "--max-messages", str(RECORDS),
            "--timeout-ms", "20000", "--command-property", f"client.rack={RACKS[follower]}",
        )  # fmt: skip
        assert [int(v) for v in read.stdout.split()] == list(range(RECORDS)), read.describe()
