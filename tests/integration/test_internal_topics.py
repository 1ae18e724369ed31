"""The topics the broker keeps for itself, against a real `gregor broker`: a client can neither
create, produce to, fetch, see nor delete `__cluster_metadata` (one Produce into it used to
stop the node from ever starting again, one DeleteTopics to wipe every partition on the next
start), may not write into `__consumer_offsets` or create it, and an admin request too large
for one controller operation is refused whole. Produce and Fetch of the metadata topic are
sent by hand (`tests.support.wire`): no client library targets a topic it cannot see."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.cimpl import NewPartitions, NewTopic

from broker.protocol import ApiKey, ErrorCode, build
from broker.protocol.messages import request_module
from broker.protocol.records import Record, build_batch
from tests.integration.clients import QUIET, admin_client, create_topic, read_all
from tests.support.kafka_python import close_kafka_python
from tests.support.nodes import run_node
from tests.support.wire import call, now_ms, produce

METADATA_TOPIC = "__cluster_metadata"


def _produce(port: int, topic: str) -> Any:
    batch = build_batch([Record(offset=0, timestamp=now_ms(), key=b"k", value=b"intruder")])
    return produce(("localhost", port), topic, batch)


def _fetch(port: int, topic: str) -> Any:
    schema = request_module(ApiKey.FETCH, 12)
    body = build(
        schema.FetchRequest,
        replica_id=-1,
        max_wait=timedelta(milliseconds=0),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            build(
                schema.FetchTopic,
                topic=topic,
                partitions=(
                    build(
                        schema.FetchPartition,
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=0,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    response = call(("localhost", port), ApiKey.FETCH, 12, body)
    return response.responses[0].partitions[0]


def _refusal(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as refused:
        future.result(timeout=30)
    error: KafkaError = refused.value.args[0]
    return error


def _send(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **QUIET})
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=0)
    assert producer.flush(20) == 0


def test_the_metadata_topic_is_out_of_every_clients_reach(tmp_path: Path) -> None:
    with run_node(tmp_path) as node:
        create_topic(node.bootstrap, "kept", 1)
        _send(node.bootstrap, "kept", 3)
        admin = admin_client(node.bootstrap)

        created = admin.create_topics([NewTopic(METADATA_TOPIC, 1, 1)], operation_timeout=30)
        error = _refusal(created[METADATA_TOPIC])
        assert error.code() == KafkaError.INVALID_REQUEST
        assert f"Creation of internal topic {METADATA_TOPIC} is prohibited" in error.str()

        produced = _produce(node.port, METADATA_TOPIC)
        assert produced.error_code == ErrorCode.unknown_topic_or_partition
        fetched = _fetch(node.port, METADATA_TOPIC)
        assert fetched.error_code == ErrorCode.unknown_topic_or_partition
        assert fetched.records is None or len(fetched.records) == 0

        deleted = admin.delete_topics([METADATA_TOPIC], operation_timeout=30)
        assert _refusal(deleted[METADATA_TOPIC]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        assert METADATA_TOPIC not in admin.list_topics(timeout=10).topics

    # The metadata log was never touched: the node starts again and still has the topic.
    with run_node(tmp_path) as node:
        assert [m.value() for m in read_all(node.bootstrap, "kept", 1, 3)] == [
            b"v0",
            b"v1",
            b"v2",
        ]


def test_consumer_offsets_is_written_by_the_broker_alone(tmp_path: Path) -> None:
    with run_node(tmp_path) as node:
        create_topic(node.bootstrap, "orders", 1)
        _send(node.bootstrap, "orders", 5)
        consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "billing", **QUIET})
        try:
            consumer.commit(offsets=[TopicPartition("orders", 0, 4)], asynchronous=False)
        finally:
            consumer.close()
        admin = admin_client(node.bootstrap)

        produced = _produce(node.port, "__consumer_offsets")
        assert produced.error_code == ErrorCode.invalid_topic_exception
        assert produced.error_message == "Cannot append to internal topic __consumer_offsets"

        created = admin.create_topics([NewTopic("__consumer_offsets", 3, 1)])
        error = _refusal(created["__consumer_offsets"])
        assert error.code() == KafkaError.INVALID_REQUEST
        grown = admin.create_partitions([NewPartitions("__consumer_offsets", 60)])
        error = _refusal(grown["__consumer_offsets"])
        assert error.code() == KafkaError.INVALID_REQUEST
        assert "internal topic __consumer_offsets" in error.str()

        listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("billing")])
        committed = listed["billing"].result(timeout=30)
        assert [(p.topic, p.offset) for p in committed.topic_partitions] == [("orders", 4)]


def test_a_client_cannot_create_consumer_offsets_before_the_broker_does(tmp_path: Path) -> None:
    with run_node(tmp_path) as node:
        admin = admin_client(node.bootstrap)
        created = admin.create_topics([NewTopic("__consumer_offsets", 3, 1)])
        error = _refusal(created["__consumer_offsets"])
        assert error.code() == KafkaError.INVALID_REQUEST
        assert "Creation of internal topic __consumer_offsets is prohibited" in error.str()


def _commit(bootstrap: str, group: str, offset: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **QUIET})
    try:
        consumer.commit(offsets=[TopicPartition("orders", 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def _committed(bootstrap: str, group: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **QUIET})
    try:
        (committed,) = consumer.committed([TopicPartition("orders", 0)], timeout=30)
    finally:
        consumer.close()
    return int(committed.offset)


def test_groups_keep_their_offsets_when_offsets_topic_num_partitions_changes(
    tmp_path: Path,
) -> None:
    """A group's partition is its id's hash modulo the topic's partition count: once the topic
    exists, that count (not a setting changed since) decides where the coordinator writes, or
    a group hashed past the topic's last partition could not commit at all."""
    # Each of these maps to a partition of 7 that a 3-partition topic does not have.
    groups = ["billing", "search", "mail", "new-b", "new-c"]
    with run_node(tmp_path, {"offsets.topic.num.partitions": "3"}) as node:
        create_topic(node.bootstrap, "orders", 1)
        _send(node.bootstrap, "orders", 5)
        for group in groups[:3]:
            _commit(node.bootstrap, group, 2)
    with run_node(tmp_path, {"offsets.topic.num.partitions": "7"}) as node:
        for group in groups[:3]:
            assert _committed(node.bootstrap, group) == 2, group
        for group in groups:
            _commit(node.bootstrap, group, 4)
        assert "offsets.topic.num.partitions is 7" in node.log_tail(100_000)
    with run_node(tmp_path, {"offsets.topic.num.partitions": "7"}) as node:
        for group in groups:
            assert _committed(node.bootstrap, group) == 4, group


@pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning")
def test_an_admin_request_too_large_for_one_operation_is_refused_whole(
    tmp_path: Path,
) -> None:
    from kafka.admin import KafkaAdminClient  # noqa: PLC0415 - warns on import
    from kafka.admin import NewTopic as PythonNewTopic  # noqa: PLC0415
    from kafka.errors import PolicyViolationError  # noqa: PLC0415

    with run_node(tmp_path) as node:
        # librdkafka refuses more than 100 000 partitions itself; kafka-python sends them.
        python_admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
        try:
            with pytest.raises(PolicyViolationError, match="excessively large batch operation"):
                python_admin.create_topics([PythonNewTopic("huge", 1_000_000, 1)])
        finally:
            close_kafka_python(python_admin)

        admin = admin_client(node.bootstrap)
        # Two topics that fit alone but not together: neither is created.
        created = admin.create_topics(
            [NewTopic("half-a", 6_000, 1), NewTopic("half-b", 6_000, 1)], operation_timeout=60
        )
        for name in ("half-a", "half-b"):
            assert _refusal(created[name]).code() == KafkaError.POLICY_VIOLATION
        topics = admin.list_topics(timeout=10).topics
        assert not {"huge", "half-a", "half-b"} & set(topics)

        create_topic(node.bootstrap, "small", 1)
        grown = admin.create_partitions([NewPartitions("small", 20_001)])
        assert _refusal(grown["small"]).code() == KafkaError.POLICY_VIOLATION
        assert len(admin.list_topics("small", timeout=10).topics["small"].partitions) == 1
        _send(node.bootstrap, "small", 2)


def test_a_users_double_underscore_topic_is_an_ordinary_topic(tmp_path: Path) -> None:
    """Kafka's internal topics are `__consumer_offsets` and `__transaction_state`, not every
    name starting with `__`: a producer's Metadata request auto-creates a user's `__audit`
    like any other topic, and it is not reported internal; `__consumer_offsets` still is, and
    is never auto-created by a client."""
    with run_node(tmp_path) as node:
        _send(node.bootstrap, "__audit", 3)
        assert [m.value() for m in read_all(node.bootstrap, "__audit", 1, 3)] == [
            b"v0",
            b"v1",
            b"v2",
        ]
        metadata = request_module(ApiKey.METADATA, 12)
        body = build(
            metadata.MetadataRequest,
            topics=tuple(
                build(metadata.MetadataRequestTopic, name=name, topic_id=None)
                for name in ("__audit", "__consumer_offsets")
            ),
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        )
        response = call(("localhost", node.port), ApiKey.METADATA, 12, body)
        described = {t.name: (t.error_code, t.is_internal) for t in response.topics}
        assert described["__audit"] == (ErrorCode.none, False)
        # Whether or not the broker has made it yet, a client's request did not.
        assert described["__consumer_offsets"] in {
            (ErrorCode.none, True),
            (ErrorCode.unknown_topic_or_partition, False),
        }
