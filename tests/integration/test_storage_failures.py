"""What a real `gregor broker` does when its disk lets it down: a full disk takes its log dir
offline (KAFKA_STORAGE_ERROR) while the node serves the other dir, and after a restart with
space freed nothing acknowledged is lost and no torn batch is served; a partition that cannot
load is offline and named while the node serves the rest; a corrupt log-dir checkpoint means
recovery, not a node that cannot start; a topic with a legal 249-character name can be deleted (its
`-delete` directory name used to exceed the filesystem's 255 bytes, and every later start died
on it)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.cimpl import NewTopic

from broker.protocol import ApiKey, request_type
from tests.integration.clients import QUIET, admin_client, create_topic, read_all
from tests.support.nodes import RunningNode, run_node, start_cluster
from tests.support.requests import fill
from tests.support.wire import call


def _send(bootstrap: str, topic: str, partition: int, count: int) -> list[int | None]:
    """Produce `count` records one by one without retries: each one's error code, or None."""
    errors: list[int | None] = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, "message.timeout.ms": 5_000, "retries": 0, **QUIET}
    )
    for i in range(count):
        producer.produce(
            topic,
            value=b"v%d" % i,
            partition=partition,
            on_delivery=lambda error, _message: errors.append(
                None if error is None else error.code()
            ),
        )
    producer.flush(20)
    return errors


def test_a_partition_that_cannot_load_is_offline_and_the_rest_is_served(tmp_path: Path) -> None:
    with run_node(tmp_path) as node:
        create_topic(node.bootstrap, "orders", 2)
        assert _send(node.bootstrap, "orders", 0, 3) == [None] * 3
        assert _send(node.bootstrap, "orders", 1, 3) == [None] * 3
    (tmp_path / "logs" / "orders-0" / "leader-epoch-checkpoint").write_text("garbage\n")

    with run_node(tmp_path) as node:
        assert "orders-0" in node.log_tail(100_000)
        assert _send(node.bootstrap, "orders", 0, 1) == [KafkaError.KAFKA_STORAGE_ERROR]
        assert _send(node.bootstrap, "orders", 1, 2) == [None] * 2
        assert len(read_all(node.bootstrap, "orders", 2, 5)) == 5  # partition 1's five


def test_a_corrupt_recovery_checkpoint_means_recovery_not_a_dead_node(tmp_path: Path) -> None:
    with run_node(tmp_path) as node:
        create_topic(node.bootstrap, "orders", 1)
        assert _send(node.bootstrap, "orders", 0, 4) == [None] * 4
    (tmp_path / "logs" / "recovery-point-offset-checkpoint").write_text("0\nnot a number\n")

    with run_node(tmp_path) as node:
        assert "recovering every log" in node.log_tail(100_000)
        assert [m.value() for m in read_all(node.bootstrap, "orders", 1, 4)] == [
            b"v0",
            b"v1",
            b"v2",
            b"v3",
        ]


def test_a_topic_with_the_longest_legal_name_can_be_deleted(tmp_path: Path) -> None:
    name = "t" * 249
    with run_node(tmp_path) as node:
        create_topic(node.bootstrap, name, 1)
        create_topic(node.bootstrap, "kept", 1)
        assert _send(node.bootstrap, name, 0, 2) == [None] * 2
        admin = admin_client(node.bootstrap)
        admin.delete_topics([name], operation_timeout=30)[name].result(timeout=30)
        assert name not in admin.list_topics(timeout=10).topics
        assert "File name too long" not in node.log_tail(100_000)

    with run_node(tmp_path) as node:  # the next start is not stopped by the deletion
        topics = admin_client(node.bootstrap).list_topics(timeout=10).topics
        assert "kept" in topics
        assert name not in topics
    assert not list((tmp_path / "logs").glob(f"{name}-0*"))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real filesystem of 2 MiB (tmpfs with a size limit), mounted for the test: writes past
    it fail with ENOSPC or come back short, as on a full disk. Mounting needs root, which CI
    and the e2e tier have."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "gregor-test-small", str(mount)], check=True
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


def test_a_full_disk_takes_its_log_dir_offline_and_loses_nothing(
    tmp_path: Path, small_disk: Path
) -> None:
    good = tmp_path / "good"
    dirs = {"log.dirs": f"{good},{small_disk}"}
    acked: list[bytes] = []
    with run_node(tmp_path, dirs) as node:
        create_topic(node.bootstrap, "spread", 2)
        # The node creates the logs once it applies the topic's records (as Kafka's brokers
        # do, after CreateTopics is answered): one in each dir.
        deadline = time.monotonic() + 10
        while not all((d / f"spread-{p}").is_dir() for d, p in ((good, 0), (small_disk, 1))):
            if all((d / f"spread-{p}").is_dir() for d, p in ((good, 1), (small_disk, 0))):
                break
            assert time.monotonic() < deadline, "the node did not create the topic's logs"
            time.sleep(0.05)
        (on_small,) = [p for p in (0, 1) if (small_disk / f"spread-{p}").is_dir()]
        on_good = 1 - on_small
        producer = Producer(
            {"bootstrap.servers": node.bootstrap, "retries": 0, "linger.ms": 0, **QUIET}
        )
        failure: KafkaError | None = None
        for i in range(200):  # 200 x 64 KiB: far more than 2 MiB
            value = b"%05d" % i + b"x" * 65_536
            outcome: list[KafkaError | None] = []

            def delivered(error: KafkaError | None, _message: object) -> None:
                outcome.append(error)  # noqa: B023 - flushed before the next iteration

            producer.produce("spread", value=value, partition=on_small, on_delivery=delivered)
            producer.flush(20)
            if outcome[0] is None:
                acked.append(value)
                continue
            failure = outcome[0]
            break
        assert failure is not None, "the small disk never filled up"
        assert failure.code() == KafkaError.KAFKA_STORAGE_ERROR, failure
        assert acked, "nothing fitted before the disk was full"
        # The full dir's partition stays offline; the other dir keeps serving.
        assert _send(node.bootstrap, "spread", on_small, 1) == [KafkaError.KAFKA_STORAGE_ERROR]
        assert _send(node.bootstrap, "spread", on_good, 3) == [None] * 3
        assert "is offline" in node.log_tail(100_000)

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    with run_node(tmp_path, dirs) as node:
        consumer_values = [
            m.value()
            for m in read_all(node.bootstrap, "spread", 2, len(acked) + 3)
            if m.partition() == on_small
        ]
        assert consumer_values == acked  # every acknowledged record, nothing torn or extra
        # read_all stops at the count it expects, so a record stored after the acknowledged
        # ones would not be read: the partition's end says there is none.
        assert _end_offset(node.bootstrap, "spread", on_small) == len(acked)
        assert _send(node.bootstrap, "spread", on_small, 1) == [None]


def _end_offset(bootstrap: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offsets", **QUIET})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        consumer.close()
    return int(high)


def test_running_out_of_file_descriptors_is_survived(tmp_path: Path) -> None:
    """A node allowed 400 descriptors is asked for a topic of 1 000 partitions (each log costs
    one): the topic is created, the partitions whose logs could not be opened are offline and
    say why, the node keeps serving and starts again; given descriptors, every partition
    serves. It used to leave the served metadata different from the committed log and never
    start again."""
    with run_node(tmp_path, open_files=400) as node:
        create_topic(node.bootstrap, "kept", 1)
        assert _send(node.bootstrap, "kept", 0, 2) == [None, None]
        rounds = node.log_tail(200_000).count("created the logs of")
        create_topic(node.bootstrap, "wide", 1_000)
        # The node creates most of the logs in the background once it applies the topic's
        # records, and says when it is done.
        deadline = time.monotonic() + 30
        while node.log_tail(200_000).count("created the logs of") == rounds:
            assert time.monotonic() < deadline, "the node did not try to create the logs"
            time.sleep(0.1)
        assert "out of file descriptors" in node.log_tail(200_000)
        assert _send(node.bootstrap, "wide", 999, 1) == [KafkaError.KAFKA_STORAGE_ERROR]
        assert _send(node.bootstrap, "kept", 0, 1) == [None]
    with run_node(tmp_path, open_files=400) as node:
        assert len(read_all(node.bootstrap, "kept", 1, 3)) == 3
    with run_node(tmp_path) as node:
        assert _send(node.bootstrap, "wide", 999, 1) == [None]
        assert _send(node.bootstrap, "wide", 0, 1) == [None]


def test_a_full_disk_on_a_leader_moves_its_partitions_and_loses_nothing(
    tmp_path: Path, small_disk: Path
) -> None:
    """Three brokers (dedicated controllers), broker 3's only log dir on a 2 MiB disk, and
    the partition's leader there (RF 3, min.insync.replicas=2). When the disk fills, broker 3
    can hold no replica: it asks to be fenced, so the partition gets another leader and ISR at
    once, the idempotent producer carries on without an error, every acknowledged record is
    read back once, and broker 3 names its failed dir (DescribeLogDirs)."""
    cluster = start_cluster(
        tmp_path,
        3,
        3,
        {"replica.fetch.backoff.ms": "200"},
        each={3: {"log.dirs": str(small_disk), "metadata.log.dir": str(tmp_path / "meta-3")}},
    )
    bootstrap = ",".join(b.bootstrap for b in cluster.brokers)
    try:
        admin = admin_client(bootstrap)
        created = admin.create_topics(
            [
                NewTopic(
                    "filling",
                    num_partitions=1,
                    replica_assignment=[[3, 1, 2]],
                    config={"min.insync.replicas": "2"},
                )
            ]
        )
        created["filling"].result(timeout=30)
        producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, **QUIET}
        )
        errors: list[KafkaError] = []

        def delivered(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                errors.append(error)

        values = [b"%05d" % i + b"x" * 65_536 for i in range(100)]  # 6.5 MB: 3 times the disk
        for value in values:
            producer.produce("filling", value=value, on_delivery=delivered)
            producer.poll(0)
            time.sleep(0.01)
        assert producer.flush(90) == 0
        assert errors == []

        partition = admin.list_topics("filling", timeout=10).topics["filling"].partitions[0]
        assert partition.leader in (1, 2)
        assert 3 not in partition.isrs
        read = [m.value() for m in read_all(bootstrap, "filling", 1, len(values))]
        assert read == values
        dirs = _log_dirs(cluster.broker(3))
        assert dirs == {str(small_disk): KafkaError.KAFKA_STORAGE_ERROR}
        assert "asking to be fenced" in cluster.broker(3).log_tail(200_000)
    finally:
        cluster.kill()


def _log_dirs(node: RunningNode) -> dict[str, int]:
    """DescribeLogDirs, asked of `node` itself: each log dir's error code."""
    body = fill(request_type(ApiKey.DESCRIBE_LOG_DIRS, 4), {"topics": None})
    answer = call(("localhost", node.port), ApiKey.DESCRIBE_LOG_DIRS, 4, body)
    return {result.log_dir: int(result.error_code) for result in answer.results}
