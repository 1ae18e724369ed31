"""Consumer groups with real clients against a real `gregor broker`: rebalancing as members
join and leave, committed offsets that a restarted consumer resumes from, group admin, and
offsets that survive a SIGKILL of the broker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from broker.aio import wait_for
from tests.integration.clients import QUIET, admin_client, create_topic
from tests.support.kafka_python import close_kafka_python
from tests.support.nodes import RunningNode, run_node, start_node


def _topic(bootstrap: str, name: str, partitions: int, records: int) -> None:
    create_topic(bootstrap, name, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, **QUIET})
    for i in range(records):
        producer.produce(name, key=str(i).encode(), value=f"value-{i}".encode())
    assert producer.flush(10) == 0


def _consumer(bootstrap: str, group: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **extra,
            **QUIET,
        }
    )


def _poll_until(consumers: list[Consumer], done: Any, timeout: float = 30) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while not done(got) and time.monotonic() < deadline:
        for consumer in consumers:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append(message)
    return got


def test_group_rebalances_as_members_join_and_leave(node: RunningNode) -> None:
    _topic(node.bootstrap, "rebalance", partitions=4, records=40)
    first = _consumer(node.bootstrap, "rebalancers")
    first.subscribe(["rebalance"])
    got = _poll_until([first], lambda g: len(g) >= 40)
    assert len(got) == 40
    assert {m.partition() for m in got} == {0, 1, 2, 3}
    assert len(first.assignment()) == 4

    second = _consumer(node.bootstrap, "rebalancers")
    second.subscribe(["rebalance"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for consumer in (first, second):
            consumer.poll(0.2)
        if len(first.assignment()) == 2 and len(second.assignment()) == 2:
            break
    assert sorted(tp.partition for tp in first.assignment() + second.assignment()) == [0, 1, 2, 3]

    second.close()  # LeaveGroup: the survivor gets every partition back
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(first.assignment()) != 4:
        first.poll(0.2)
    assert len(first.assignment()) == 4
    first.close()


def test_commit_and_resume_after_consumer_restart(node: RunningNode) -> None:
    _topic(node.bootstrap, "resume", partitions=2, records=30)
    consumer = _consumer(node.bootstrap, "resumers", **{"enable.auto.commit": False})
    consumer.subscribe(["resume"])
    got = _poll_until([consumer], lambda g: len(g) >= 10)
    first_batch = got[:10]
    last: dict[int, int] = {}
    for message in first_batch:
        last[message.partition()] = max(last.get(message.partition(), -1), message.offset())
    consumer.commit(
        offsets=[TopicPartition("resume", p, o + 1) for p, o in last.items()], asynchronous=False
    )
    consumer.close()

    restarted = _consumer(node.bootstrap, "resumers", **{"enable.auto.commit": False})
    committed = restarted.committed(
        [TopicPartition("resume", 0), TopicPartition("resume", 1)], timeout=10
    )
    assert {tp.partition: tp.offset for tp in committed} == {
        p: last[p] + 1 if p in last else -1001 for p in (0, 1)
    }
    restarted.subscribe(["resume"])
    rest = _poll_until([restarted], lambda g: len(g) >= 30 - len(first_batch))
    restarted.close()
    seen = {(m.partition(), m.offset()) for m in first_batch} | {
        (m.partition(), m.offset()) for m in rest
    }
    assert len(seen) == 30  # nothing skipped
    assert not {(m.partition(), m.offset()) for m in first_batch} & {
        (m.partition(), m.offset()) for m in rest
    }  # nothing committed is read again


def test_list_and_describe_groups(node: RunningNode) -> None:
    _topic(node.bootstrap, "described", partitions=2, records=5)
    consumer = _consumer(node.bootstrap, "describers")
    consumer.subscribe(["described"])
    _poll_until([consumer], lambda g: len(g) >= 5)
    admin = admin_client(node.bootstrap)
    listed = admin.list_consumer_groups().result(10)
    assert "describers" in {g.group_id for g in listed.valid}
    description = admin.describe_consumer_groups(["describers"])["describers"].result(10)
    assert str(description.state).endswith("STABLE")
    assert len(description.members) == 1
    assert {tp.partition for tp in description.members[0].assignment.topic_partitions} == {0, 1}
    consumer.close()


@pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning")
def test_kafka_python_group_consumer(node: RunningNode) -> None:
    from kafka import KafkaConsumer, TopicPartition  # noqa: PLC0415 - warns on import

    _topic(node.bootstrap, "kp-group", partitions=3, records=30)

    def reader(timeout_ms: int) -> KafkaConsumer:
        return KafkaConsumer(
            "kp-group",
            bootstrap_servers=node.bootstrap,
            group_id="kp-readers",
            auto_offset_reset="earliest",
            consumer_timeout_ms=timeout_ms,
        )

    consumer = reader(10_000)
    try:
        got = [message for _, message in zip(range(30), consumer, strict=False)]
        consumer.commit()
    finally:
        close_kafka_python(consumer)
    assert len(got) == 30
    again = reader(2_000)
    try:
        assert list(again) == []  # resumed from the committed offsets
        # ... which are the ends of the partitions (an empty read alone proves no resume).
        committed = [again.committed(TopicPartition("kp-group", p)) for p in range(3)]
        assert sum(offset or 0 for offset in committed) == 30
        # The empty read could be a consumer not yet fetching after 2 s; the same consumer, given
        # one record now, must read that one first: resumed anywhere earlier, older ones come first.
        producer = Producer({"bootstrap.servers": node.bootstrap, **QUIET})
        producer.produce("kp-group", value=b"after", partition=0)
        assert producer.flush(10) == 0
        fresh: list[Any] = []
        deadline = time.monotonic() + 20
        while not fresh and time.monotonic() < deadline:
            fresh = [r for records in again.poll(timeout_ms=500).values() for r in records]
    finally:
        close_kafka_python(again)
    assert [(r.partition, r.offset, r.value) for r in fresh] == [(0, committed[0], b"after")]


def test_aiokafka_group_consumer(node: RunningNode) -> None:
    from aiokafka import AIOKafkaConsumer  # noqa: PLC0415
    from aiokafka import TopicPartition as AioTopicPartition  # noqa: PLC0415

    _topic(node.bootstrap, "aio-group", partitions=3, records=30)

    async def scenario() -> tuple[int, int]:
        consumer = AIOKafkaConsumer(
            "aio-group",
            bootstrap_servers=node.bootstrap,
            group_id="aio-readers",
            auto_offset_reset="earliest",
        )
        try:
            await consumer.start()
            count = 0
            while count < 30:
                batches = await wait_for(consumer.getmany(timeout_ms=1000), 20)
                count += sum(len(messages) for messages in batches.values())
            await consumer.commit()
            committed = [
                await consumer.committed(AioTopicPartition("aio-group", p)) for p in range(3)
            ]
            return count, sum(offset or 0 for offset in committed)
        finally:
            await consumer.stop()

    assert asyncio.run(scenario()) == (30, 30)  # read, and committed back to the coordinator


def test_group_offsets_survive_sigkill(tmp_path: Path) -> None:
    node = start_node(tmp_path)
    try:
        _topic(node.bootstrap, "kept", partitions=2, records=20)
        consumer = _consumer(node.bootstrap, "keepers", **{"enable.auto.commit": False})
        consumer.subscribe(["kept"])
        _poll_until([consumer], lambda g: len(g) >= 20)
        consumer.commit(
            offsets=[TopicPartition("kept", 0, 7), TopicPartition("kept", 1, 3)],
            asynchronous=False,
        )
        consumer.close()
    finally:
        node.kill()
    with run_node(tmp_path) as restarted:
        consumer = _consumer(restarted.bootstrap, "keepers")
        committed = consumer.committed(
            [TopicPartition("kept", 0), TopicPartition("kept", 1)], timeout=10
        )
        consumer.close()
        assert {tp.partition: tp.offset for tp in committed} == {0: 7, 1: 3}
