"""kafka-python's and aiokafka's admin clients and timestamp lookups against a real
`gregor broker`: the same operations the confluent-kafka tests cover, through the other two
Python clients' own code paths (their own protocol versions and error mapping)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.integration.clients import QUIET
from tests.support.kafka_python import close_kafka_python
from tests.support.nodes import RunningNode

pytestmark = [
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]


def _produce_with_timestamps(bootstrap: str, topic: str, base: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **QUIET})
    for i in range(count):
        producer.produce(topic, value=f"t{i}".encode(), partition=0, timestamp=base + i * 1000)
    assert producer.flush(10) == 0


def test_kafka_python_admin_and_timestamps(node: RunningNode) -> None:
    from kafka import KafkaConsumer, TopicPartition  # noqa: PLC0415 - warns on import
    from kafka.admin import (  # noqa: PLC0415
        ConfigResource,
        ConfigResourceType,
        KafkaAdminClient,
        NewPartitions,
        NewTopic,
    )
    from kafka.errors import InvalidPartitionsError, TopicAlreadyExistsError  # noqa: PLC0415

    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic("kp-admin", 2, 1, topic_configs={"retention.ms": "3600000"})])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("kp-admin", 2, 1)])
        assert "kp-admin" in admin.list_topics()

        resource = ConfigResource(ConfigResourceType.TOPIC, "kp-admin")
        described: Any = admin.describe_configs([resource], config_filter="all")
        entries = described["topic"]["kp-admin"]
        assert entries["retention.ms"]["value"] == "3600000"
        assert entries["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert entries["cleanup.policy"]["value"] == "delete"
        assert entries["cleanup.policy"]["config_source"] == "DEFAULT_CONFIG"

        admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, "kp-admin", configs={"retention.ms": "5"})]
        )
        described = admin.describe_configs([resource])
        assert described["topic"]["kp-admin"]["retention.ms"]["value"] == "5"

        admin.create_partitions({"kp-admin": NewPartitions(4)})
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"kp-admin": NewPartitions(3)})

        base = 1_700_000_000_000
        _produce_with_timestamps(node.bootstrap, "kp-admin", base, 10)
        consumer = KafkaConsumer(bootstrap_servers=node.bootstrap)
        try:
            partition = TopicPartition("kp-admin", 0)
            found = consumer.offsets_for_times({partition: base + 3500})
            assert found[partition].offset == 4
            assert found[partition].timestamp == base + 4000
            assert consumer.beginning_offsets([partition]) == {partition: 0}
            assert consumer.end_offsets([partition]) == {partition: 10}
        finally:
            close_kafka_python(consumer)

        admin.delete_topics(["kp-admin"])
        assert "kp-admin" not in admin.list_topics()
    finally:
        close_kafka_python(admin)


def test_aiokafka_admin_and_timestamps(node: RunningNode) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: PLC0415
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic  # noqa: PLC0415

    async def scenario() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=node.bootstrap)
        try:
            await admin.start()
            await admin.create_topics([NewTopic("aio-admin", 1, 1)])
            assert "aio-admin" in await admin.list_topics()
            await admin.create_partitions({"aio-admin": NewPartitions(3)})
            described = await admin.describe_topics(["aio-admin"])
            assert len(described[0]["partitions"]) == 3

            base = 1_700_000_000_000
            _produce_with_timestamps(node.bootstrap, "aio-admin", base, 10)
            consumer = AIOKafkaConsumer(bootstrap_servers=node.bootstrap)
            try:
                await consumer.start()
                partition = TopicPartition("aio-admin", 0)
                found = await consumer.offsets_for_times({partition: base + 6000})
                assert found[partition] is not None
                assert found[partition].offset == 6
                assert await consumer.end_offsets([partition]) == {partition: 10}
            finally:
                await consumer.stop()

            await admin.delete_topics(["aio-admin"])
            deadline = time.monotonic() + 10
            while "aio-admin" in await admin.list_topics() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert "aio-admin" not in await admin.list_topics()
        finally:
            await admin.close()

    asyncio.run(scenario())
