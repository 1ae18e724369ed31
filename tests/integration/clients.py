"""confluent-kafka helpers the integration scenarios share: quiet clients, an admin client,
creating a topic, reading a topic back from its start."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

__all__ = ["QUIET", "admin_client", "create_topic", "read_all"]

QUIET = {"log_level": 0}
"""librdkafka logs connection attempts to stderr; the tests assert on results instead."""


def admin_client(bootstrap: str) -> AdminClient:
    """A quiet AdminClient; keep it referenced until its futures are resolved."""
    return AdminClient({"bootstrap.servers": bootstrap, **QUIET})


def create_topic(bootstrap: str, name: str, partitions: int = 3, **configs: str) -> None:
    """CreateTopics with replication factor 1; raises the broker's error if refused. Waits up
    to 30 s: an Apache Kafka just started on a busy machine can be slow to answer."""
    admin = admin_client(bootstrap)  # must outlive the future
    futures = admin.create_topics(
        [NewTopic(name, partitions, 1, config=configs)], operation_timeout=30
    )
    futures[name].result(timeout=30)


def read_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Message]:
    """Up to `expected` records of `topic` from the start of every partition, by assignment
    (no group), within 20 s; a record with an error fails the test."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}", **QUIET}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[Message] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
    finally:
        consumer.close()
    return got
