"""Real Kafka clients against a real `gregor broker`: produce and consume with every codec,
idempotent producers, seek by timestamp, admin operations, and a crash that loses nothing
acknowledged."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import NewPartitions, NewTopic

from broker.aio import wait_for
from broker.protocol import ApiKey, Codec
from broker.protocol.records import validate_batch
from tests.integration.clients import QUIET, admin_client, create_topic, read_all
from tests.support.kafka_python import close_kafka_python
from tests.support.nodes import RunningNode, free_port, run_node, start_node
from tests.support.proxy import lossy_proxy

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]

Headers = list[tuple[str, str | bytes | None]]
Sent = list[tuple[bytes, bytes, Headers]]


def _records(count: int, tag: str) -> Sent:
    return [
        (f"key-{i % 7}".encode(), f"{tag}-value-{i}".encode() * 20, [("n", f"{i}".encode())])
        for i in range(count)
    ]


def _check_same(sent: Sent, got: list[Any]) -> None:
    assert sorted((k, v, h) for k, v, h in sent) == sorted(
        (m.key(), m.value(), [(hk, hv) for hk, hv in m.headers() or []]) for m in got
    )
    partition_of: dict[bytes, int] = {}
    for message in got:
        # Same key, same partition: keyed ordering holds.
        assert partition_of.setdefault(message.key(), message.partition()) == message.partition()


# -- produce and consume with every client and codec -------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_produce_and_consume(node: RunningNode, codec: str) -> None:
    topic = f"ck-{codec}"
    create_topic(node.bootstrap, topic)
    sent = _records(50, codec)
    producer = Producer(
        {"bootstrap.servers": node.bootstrap, "compression.type": codec, "acks": "all", **QUIET}
    )
    for key, value, headers in sent:
        producer.produce(topic, value=value, key=key, headers=headers)
    assert producer.flush(15) == 0
    _check_same(sent, read_all(node.bootstrap, topic, 3, len(sent)))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning")
def test_kafka_python_produce_and_consume(node: RunningNode, codec: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer  # noqa: PLC0415 - warns on import
    from kafka import TopicPartition as KpTopicPartition  # noqa: PLC0415

    topic = f"kp-{codec}"
    create_topic(node.bootstrap, topic)
    sent = _records(50, codec)
    producer = KafkaProducer(
        bootstrap_servers=node.bootstrap,
        compression_type=None if codec == "none" else codec,
        acks="all",
    )
    try:
        futures = [producer.send(topic, value=v, key=k, headers=list(h)) for k, v, h in sent]
        producer.flush(15)
        offsets = [f.get(timeout=10) for f in futures]
    finally:
        close_kafka_python(producer)
    assert all(o.offset >= 0 for o in offsets)

    consumer = KafkaConsumer(bootstrap_servers=node.bootstrap, consumer_timeout_ms=5000)
    try:
        consumer.assign([KpTopicPartition(topic, p) for p in range(3)])
        consumer.seek_to_beginning()
        got = [message for _, message in zip(range(len(sent)), consumer, strict=False)]
    finally:
        close_kafka_python(consumer)
    assert sorted((k, v, h) for k, v, h in sent) == sorted(
        (m.key, m.value, list(m.headers)) for m in got
    )


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_produce_and_consume(node: RunningNode, codec: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: PLC0415
    from aiokafka import TopicPartition as AioTopicPartition  # noqa: PLC0415

    topic = f"aio-{codec}"
    create_topic(node.bootstrap, topic)
    sent = _records(50, codec)

    async def scenario() -> list[Any]:
        producer = AIOKafkaProducer(
            bootstrap_servers=node.bootstrap,
            compression_type=None if codec == "none" else codec,
            acks="all",
        )
        try:
            await producer.start()
            for key, value, headers in sent:
                await producer.send_and_wait(topic, value=value, key=key, headers=headers)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=node.bootstrap)
        try:
            await consumer.start()
            consumer.assign([AioTopicPartition(topic, p) for p in range(3)])
            await consumer.seek_to_beginning()
            got: list[Any] = []
            deadline = time.monotonic() + 20
            while len(got) < len(sent) and time.monotonic() < deadline:
                batches = await wait_for(consumer.getmany(timeout_ms=1000), 20)
                for messages in batches.values():
                    got.extend(messages)
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(scenario())
    assert sorted((k, v, h) for k, v, h in sent) == sorted(
        (m.key, m.value, list(m.headers)) for m in got
    )


# -- idempotent producers ----------------------------------------------------------------------


def test_idempotent_producer_writes_each_record_once(node: RunningNode) -> None:
    topic = "idempotent"
    create_topic(node.bootstrap, topic, partitions=2)
    producer = Producer(
        {
            "bootstrap.servers": node.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            **QUIET,
        }
    )
    sent = _records(200, "idem")
    for key, value, headers in sent:
        producer.produce(topic, value=value, key=key, headers=headers)
    assert producer.flush(15) == 0
    got = read_all(node.bootstrap, topic, 2, len(sent))
    _check_same(sent, got)
    by_partition: dict[int, list[int]] = {}
    for message in got:
        partition, offset = message.partition(), message.offset()
        assert partition is not None
        assert offset is not None
        by_partition.setdefault(partition, []).append(offset)
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))


def test_an_idempotent_producer_whose_answers_are_lost_writes_each_record_once(
    tmp_path: Path,
) -> None:
    """The broker writes a batch but the client never hears so (its connection drops before
    the answer arrives: `tests.support.proxy`), so librdkafka sends the same batch again with
    the same sequence numbers: each record must still be in the log once, at contiguous
    offsets. Without the broker's deduplication the retried batches would be stored twice."""
    proxy_port = free_port()
    advertised = {"advertised.listeners": f"PLAINTEXT://localhost:{proxy_port}"}
    with (
        run_node(tmp_path, advertised) as node,
        lossy_proxy(proxy_port, ("localhost", node.port), ApiKey.PRODUCE, drops=3) as proxy,
    ):
        bootstrap = f"localhost:{proxy_port}"
        create_topic(bootstrap, "retried", partitions=1)
        producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **QUIET}
        )
        sent = _records(300, "retry")
        for start in range(0, len(sent), 50):
            for key, value, headers in sent[start : start + 50]:
                producer.produce("retried", value=value, key=key, headers=headers)
            assert producer.flush(30) == 0
        assert proxy.dropped == 3  # three answers were really lost...
        # ...and their batches were really sent again.
        assert proxy.forwarded[ApiKey.PRODUCE] >= 3 + len(range(0, len(sent), 50))
        got = read_all(bootstrap, "retried", 1, len(sent))
        _check_same(sent, got)
        assert [m.offset() for m in got] == list(range(len(sent)))
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "retried", **QUIET})
        try:
            watermarks = consumer.get_watermark_offsets(TopicPartition("retried", 0), timeout=10)
        finally:
            consumer.close()
        assert watermarks == (0, len(sent))  # nothing stored twice after them either


def test_a_transactional_producer_fails_at_once_with_a_fatal_error(node: RunningNode) -> None:
    """Transactions are not served yet. A transactional producer must learn that at once and
    for good, not retry a "coordinator not available" for its whole timeout: the error is
    fatal (a retriable one would surface as a timeout after the 30 s given here)."""
    producer = Producer(
        {"bootstrap.servers": node.bootstrap, "transactional.id": "payments-tx", **QUIET}
    )
    with pytest.raises(KafkaException) as failed:
        producer.init_transactions(30)
    error = failed.value.args[0]
    assert error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error
    assert error.fatal() or not error.retriable(), error


def test_authorized_operations_are_all_reported_as_kafka_does_without_an_authorizer(
    node: RunningNode,
) -> None:
    """Admin UIs ask which operations they may offer; Kafka without an authorizer answers
    every one. They used to come back as "not asked for" (INT32_MIN), i.e. none."""
    create_topic(node.bootstrap, "operated", 1)
    admin = admin_client(node.bootstrap)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert {op.name for op in cluster.authorized_operations} == {
        "CREATE",
        "ALTER",
        "DESCRIBE",
        "CLUSTER_ACTION",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
        "IDEMPOTENT_WRITE",
    }
    described = admin.describe_topics(
        TopicCollection(["operated"]), include_authorized_operations=True
    )["operated"].result(10)
    assert {op.name for op in described.authorized_operations} == {
        "READ",
        "WRITE",
        "CREATE",
        "DELETE",
        "ALTER",
        "DESCRIBE",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
    }


# -- timestamps -------------------------------------------------------------------------------


def test_records_with_an_old_create_time_are_readable_after_they_are_acknowledged(
    node: RunningNode,
) -> None:
    """Records whose CreateTime is past retention.ms (a backfill, librdkafka's test 0052) stay
    readable until retention next runs, every log.retention.check.interval.ms (5 minutes), as
    in Kafka; they used to roll a segment per batch and be deleted within the second, by the
    broker's next one-second housekeeping round. They are read after such a round is seen to
    have run, not after a wait that a slow machine could outlast."""
    topic = "backfill"
    create_topic(node.bootstrap, topic, partitions=1)
    month_ago = int(time.time() * 1000) - 30 * 86_400_000
    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 0, **QUIET})
    for i in range(20):
        producer.produce(topic, value=b"old%d" % i, timestamp=month_ago + i)
        assert producer.flush(5) == 0
    _housekeeping_round(node, "backfill-round")
    got = read_all(node.bootstrap, topic, 1, 20)
    assert [m.value() for m in got] == [b"old%d" % i for i in range(20)]
    segments = list((Path(node.config.parent) / "logs" / f"{topic}-0").glob("*.log"))
    assert len(segments) == 1


def _housekeeping_round(node: RunningNode, marker: str) -> None:
    """Return once a housekeeping round that began after this call has run: a topic deleted
    with file.delete.delay.ms=0 keeps its directory until a round removes it, and a round
    applies retention to every log before it removes deleted ones."""
    create_topic(node.bootstrap, marker, 1, **{"file.delete.delay.ms": "0"})
    logs = Path(node.config.parent) / "logs"
    deadline = time.monotonic() + 20
    while not (logs / f"{marker}-0").is_dir():
        assert time.monotonic() < deadline, f"{marker}-0 was never created"
        time.sleep(0.05)
    admin = admin_client(node.bootstrap)
    admin.delete_topics([marker], operation_timeout=30)[marker].result(30)
    while list(logs.glob(f"{marker}-0*")):
        assert time.monotonic() < deadline, f"no housekeeping round removed {marker}-0"
        time.sleep(0.05)


def test_list_offsets_max_timestamp_names_the_record_that_carries_it(node: RunningNode) -> None:
    """Kafka's AdminClient.listOffsets(OffsetSpec.maxTimestamp()): the record with the largest
    timestamp, not the last offset of its batch (KAFKA-16310)."""
    topic = "max-timestamp"
    create_topic(node.bootstrap, topic, partitions=1)
    base = 1_700_000_000_000
    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 100, **QUIET})
    for delta in (0, 9_000, 3_000, 1_000):  # one batch: the largest is its second record
        producer.produce(topic, value=b"x", partition=0, timestamp=base + delta)
    assert producer.flush(10) == 0
    admin = admin_client(node.bootstrap)
    partition = TopicPartition(topic, 0)
    spec = OffsetSpec.max_timestamp()  # type: ignore[no-untyped-call]
    found = admin.list_offsets({partition: spec})[partition].result(10)
    assert (found.offset, found.timestamp) == (1, base + 9_000)


def test_seek_by_timestamp(node: RunningNode) -> None:
    topic = "timestamps"
    create_topic(node.bootstrap, topic, partitions=1)
    base = 1_700_000_000_000
    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 0, **QUIET})
    for i in range(10):
        producer.produce(topic, value=f"t{i}".encode(), timestamp=base + i * 1000)
        assert producer.flush(5) == 0  # one batch per record: the lookup crosses batches
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "ts-reader", **QUIET})
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, 0, base + 4500)], timeout=10)
        assert found[0].offset == 5
        beyond = consumer.offsets_for_times([TopicPartition(topic, 0, base + 60_000)], timeout=10)
        assert beyond[0].offset == -1  # nothing at or after: Kafka answers "end" as -1
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (0, 10)
        consumer.assign([TopicPartition(topic, 0, found[0].offset)])
        message = consumer.poll(10)
        assert message is not None
        assert message.value() == b"t5"
        assert message.timestamp()[1] == base + 5000
    finally:
        consumer.close()


def test_topic_timestamp_and_compression_settings(node: RunningNode) -> None:
    """LogAppendTime topics hand consumers the broker's time; CreateTime topics refuse records
    from more than `message.timestamp.after.max.ms` in the future; a `compression.type` topic
    stores batches in its codec whatever the producer used."""
    create_topic(node.bootstrap, "appended", 1, **{"message.timestamp.type": "LogAppendTime"})
    create_topic(node.bootstrap, "stored-zstd", 1, **{"compression.type": "zstd"})
    create_topic(node.bootstrap, "bounded", 1, **{"message.timestamp.after.max.ms": "60000"})
    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 0, **QUIET})
    long_ago = 1_000_000_000_000
    before = int(time.time() * 1000)
    producer.produce("appended", value=b"a", timestamp=long_ago)
    producer.produce("stored-zstd", value=b"z" * 1000, key=b"k", headers=[("h", b"v")])
    assert producer.flush(10) == 0
    after = int(time.time() * 1000)

    (appended,) = read_all(node.bootstrap, "appended", 1, 1)
    kind, stamp = appended.timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME
    assert before - 1000 <= stamp <= after + 1000
    (stored,) = read_all(node.bootstrap, "stored-zstd", 1, 1)
    assert (stored.key(), stored.value(), stored.headers()) == (b"k", b"z" * 1000, [("h", b"v")])
    segment = next((node.config.parent / "logs" / "stored-zstd-0").glob("*.log"))
    assert validate_batch(segment.read_bytes()).codec is Codec.ZSTD

    failures: list[KafkaError | None] = []
    producer.produce(
        "bounded",
        value=b"from the future",
        timestamp=int(time.time() * 1000) + 3_600_000,
        on_delivery=lambda error, _: failures.append(error),
    )
    producer.flush(10)
    assert [f.code() if f else None for f in failures] == [KafkaError.INVALID_TIMESTAMP]


# -- admin ------------------------------------------------------------------------------------


def test_admin_topics_partitions_configs_and_records(node: RunningNode) -> None:
    admin = admin_client(node.bootstrap)
    topic = "admin-topic"
    create_topic(node.bootstrap, topic, partitions=2, **{"retention.ms": "3600000"})
    with pytest.raises(KafkaException) as exists:
        create_topic(node.bootstrap, topic)
    assert exists.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    # validate-only creates nothing
    admin.create_topics([NewTopic("never", 1, 1)], validate_only=True)["never"].result(10)
    assert "never" not in admin.list_topics(timeout=10).topics

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(10)
    assert described["retention.ms"].value == "3600000"
    assert described["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert described["cleanup.policy"].value == "delete"
    assert described["cleanup.policy"].is_default
    assert described["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value

    alter = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    admin.incremental_alter_configs([alter])[alter].result(10)
    described = admin.describe_configs([resource])[resource].result(10)
    assert described["retention.ms"].value == "7200000"
    assert described["cleanup.policy"].value == "compact"

    invalid = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException) as refused:
        admin.incremental_alter_configs([invalid])[invalid].result(10)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "retention.ms" in refused.value.args[0].str()

    # partitions: up is fine, down is refused with Kafka's error
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(10)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 4
    with pytest.raises(KafkaException) as decrease:
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(10)
    assert decrease.value.args[0].code() == KafkaError.INVALID_PARTITIONS

    # delete records moves the low watermark (keyed: the topic is compacted by now)
    producer = Producer({"bootstrap.servers": node.bootstrap, **QUIET})
    delivered: list[KafkaError | None] = []
    for i in range(10):
        producer.produce(
            topic,
            key=b"k%d" % i,
            value=str(i).encode(),
            partition=0,
            on_delivery=lambda error, _m: delivered.append(error),
        )
    assert producer.flush(10) == 0
    assert [e for e in delivered if e is not None] == []
    deleted = admin.delete_records([TopicPartition(topic, 0, 6)])
    result = next(iter(deleted.values())).result(10)
    assert result.low_watermark == 6
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "wm", **QUIET})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (6, 10)
    finally:
        consumer.close()

    # delete
    admin.delete_topics([topic], operation_timeout=10)[topic].result(10)
    assert topic not in admin.list_topics(timeout=10).topics
    with pytest.raises(KafkaException) as unknown:
        admin.delete_topics([topic], operation_timeout=10)[topic].result(10)
    assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_invalid_topics_are_refused_with_kafka_errors(node: RunningNode) -> None:
    admin = admin_client(node.bootstrap)
    futures = admin.create_topics(
        [
            NewTopic("bad/name", 1, 1),
            NewTopic("too-many-replicas", 1, 3),
            NewTopic("zero-partitions", 0, 1),
            NewTopic("bad-config", 1, 1, config={"cleanup.policy": "sometimes"}),
            NewTopic("unknown-config", 1, 1, config={"no.such.thing": "1"}),
        ],
        operation_timeout=10,
    )
    codes = {}
    for name, future in futures.items():
        with pytest.raises(KafkaException) as refused:
            future.result(10)
        codes[name] = refused.value.args[0].code()
    assert codes == {
        "bad/name": KafkaError.TOPIC_EXCEPTION,
        "too-many-replicas": KafkaError.INVALID_REPLICATION_FACTOR,
        "zero-partitions": KafkaError.INVALID_PARTITIONS,
        "bad-config": KafkaError.INVALID_CONFIG,
        "unknown-config": KafkaError.INVALID_CONFIG,
    }


def test_metadata_auto_creates_topics(node: RunningNode) -> None:
    producer = Producer({"bootstrap.servers": node.bootstrap, **QUIET})
    producer.produce("auto-created", value=b"hello")
    assert producer.flush(15) == 0
    admin = admin_client(node.bootstrap)
    metadata = admin.list_topics("auto-created", timeout=10)
    assert len(metadata.topics["auto-created"].partitions) == 1  # num.partitions


@pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning")
def test_describe_cluster_and_log_dirs(node: RunningNode) -> None:
    from kafka.admin import KafkaAdminClient  # noqa: PLC0415 - warns on import

    admin = admin_client(node.bootstrap)
    cluster = admin.describe_cluster().result(10)
    assert [n.id for n in cluster.nodes] == [1]
    assert cluster.controller.id == 1
    assert len(cluster.cluster_id) == 22

    # DescribeLogDirs (kafka-log-dirs; confluent-kafka has no call for it): the node's one log
    # dir, each partition's size as the bytes of its segments on disk.
    create_topic(node.bootstrap, "sized", partitions=2)
    producer = Producer({"bootstrap.servers": node.bootstrap, **QUIET})
    for i in range(5):
        producer.produce("sized", value=f"record-{i}".encode() * 10, partition=0)
    assert producer.flush(10) == 0
    log_dirs = node.config.parent / "logs"
    kp_admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=10_000)
    try:
        [described] = kp_admin.describe_log_dirs(["sized"])
    finally:
        close_kafka_python(kp_admin)
    assert described["broker"] == 1
    [log_dir] = described["log_dirs"]
    assert (log_dir["error_code"], log_dir["log_dir"]) == (0, str(log_dirs))
    assert log_dir["total_bytes"] >= log_dir["usable_bytes"] > 0
    sizes = {
        p["partition_index"]: p["partition_size"]
        for t in log_dir["topics"]
        if t["name"] == "sized"
        for p in t["partitions"]
    }
    on_disk = {
        index: sum(f.stat().st_size for f in (log_dirs / f"sized-{index}").glob("*.log"))
        for index in (0, 1)
    }
    assert sizes == on_disk
    assert on_disk[0] > 0
    assert on_disk[1] == 0


# -- crash safety -----------------------------------------------------------------------------


def test_sigkill_keeps_every_acknowledged_record_and_topic_config(tmp_path: Path) -> None:
    node = start_node(tmp_path)
    try:
        create_topic(node.bootstrap, "durable", partitions=2, **{"retention.ms": "123456789"})
        producer = Producer(
            {"bootstrap.servers": node.bootstrap, "acks": "all", "linger.ms": 2, **QUIET}
        )
        sent = _records(300, "durable")
        for key, value, headers in sent:
            producer.produce("durable", value=value, key=key, headers=headers)
        assert producer.flush(15) == 0
    finally:
        node.kill()
    with run_node(tmp_path) as restarted:
        _check_same(sent, read_all(restarted.bootstrap, "durable", 2, len(sent)))
        admin = admin_client(restarted.bootstrap)
        resource = ConfigResource(ConfigResource.Type.TOPIC, "durable")
        described = admin.describe_configs([resource])[resource].result(10)
        assert described["retention.ms"].value == "123456789"
        # New writes continue after the recovered ones.
        producer = Producer({"bootstrap.servers": restarted.bootstrap, **QUIET})
        producer.produce("durable", value=b"after", partition=0)
        assert producer.flush(10) == 0
        consumer = Consumer({"bootstrap.servers": restarted.bootstrap, "group.id": "x", **QUIET})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition("durable", 0), timeout=10)
        finally:
            consumer.close()
        on_zero = [m for m in read_all(restarted.bootstrap, "durable", 2, 301) if not m.partition()]
        assert (low, high) == (0, len(on_zero))
        assert [m.offset() for m in on_zero] == list(range(high))
        assert on_zero[-1].value() == b"after"
