"""Where the metadata meets the disks: what a replica holds must be what the metadata says it
holds, whatever happened to the node meanwhile. Each scenario loses acknowledged records or
serves deleted ones on a broker that gets it wrong; each runs on three combined Gregor nodes
and on three Apache Kafka 4.3 nodes, one cluster of each for the module, left with every node
running and in sync for the next scenario.

- A topic deleted and created again while one of its replicas was down: that replica comes
  back holding the old topic's directory under the same name, and must set it aside (Kafka's
  topic ids in `partition.metadata`, KIP-516), not serve it as the new topic's.
- DeleteRecords: it answers once every replica has moved its log start past the offset, so a
  leader lost at once does not bring the deleted records back.
- A replaced disk: the follower stops, then the leader, the last in-sync replica, and the
  leader's volume is replaced by an empty one. The empty replica must never lead; the follower,
  an eligible leader replica (KIP-966), leads when it returns, and nothing acknowledged is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ElectionType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.support.clusters import ThreeNodes, shared_three_nodes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SETTINGS = {"auto.leader.rebalance.enable": "false"}
"""Leaders stay where failures and elections put them."""


cluster = shared_three_nodes(SETTINGS)


@pytest.fixture
def nodes(cluster: ThreeNodes) -> Iterator[ThreeNodes]:
    """The module's cluster, every node started again after the scenario whatever it did."""
    try:
        yield cluster
    finally:
        cluster.restart_stopped()


def _admin(cluster: ThreeNodes) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # a broker that is restarting answers with errors
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def _partition(cluster: ThreeNodes, topic: str) -> Any:
    """Partition 0 of `topic` as the cluster's metadata has it (leader, replicas, isrs)."""
    found = _admin(cluster).list_topics(topic, timeout=5).topics[topic]
    if found.error is not None:
        raise RuntimeError(str(found.error))
    return found.partitions[0]


def _wait_fenced(cluster: ThreeNodes, node_id: int) -> None:
    """Until the metadata leaves `node_id` out of the brokers it lists (the fenced ones)."""
    _wait(
        f"node {node_id} fenced",
        lambda: node_id not in _admin(cluster).list_topics(timeout=5).brokers,
    )


def _wait_for_isr(cluster: ThreeNodes, topic: str, isr: set[int]) -> None:
    _wait(
        f"{topic}-0's ISR to be {sorted(isr)}", lambda: set(_partition(cluster, topic).isrs) == isr
    )


def _wait_for_leader(cluster: ThreeNodes, topic: str, leader: int) -> None:
    _wait(f"{topic}-0 led by {leader}", lambda: _partition(cluster, topic).leader == leader)


def _create(cluster: ThreeNodes, topic: str, replicas: list[int], **configs: str) -> None:
    def created() -> bool:
        new = NewTopic(topic, num_partitions=1, replica_assignment=[replicas], config=configs)
        admin = _admin(cluster)  # held: a future whose client is collected never completes
        admin.create_topics([new])[topic].result(15)
        return True

    # A topic just deleted may still be on its way out: Kafka then refuses its name for a
    # moment (TOPIC_ALREADY_EXISTS), so the creation is retried.
    _wait(f"{topic} created on {replicas}", created)


def _delete(cluster: ThreeNodes, topic: str) -> None:
    def deleted() -> bool:
        admin = _admin(cluster)
        try:
            admin.delete_topics([topic])[topic].result(15)
        except KafkaException as exc:
            # NOT_CONTROLLER while the quorum elects (a killed node may have led it) is
            # retried; UNKNOWN_TOPIC_OR_PART says an earlier try went through.
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
        return True

    _wait(f"{topic} deleted", deleted)
    _wait(
        f"{topic} gone",
        lambda: topic not in _admin(cluster).list_topics(timeout=5).topics,
    )


def _produce(cluster: ThreeNodes, topic: str, values: list[bytes]) -> None:
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": 90_000,
        }
    )
    failures: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=delivered)
    assert producer.flush(100) == 0, "records still unacknowledged"
    assert not failures, failures


def _consumer(cluster: ThreeNodes) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def _watermarks(cluster: ThreeNodes, topic: str) -> tuple[int, int]:
    """Partition 0's log start and high watermark, as its leader answers ListOffsets. A new
    client each try: one whose first metadata came from a broker still catching up (a node
    just restarted) keeps that view for minutes (librdkafka's metadata refresh interval)."""
    consumer = _consumer(cluster)
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)
        return int(low), int(high)
    finally:
        consumer.close()


def _read(cluster: ThreeNodes, topic: str, timeout: float = 30.0) -> list[tuple[int, bytes]]:
    """Every record of partition 0 from its log start, as (offset, value), read from its
    leader up to its end (the high watermark)."""
    low, high = _wait(f"{topic}-0's offsets", lambda: _watermarks(cluster, topic))
    consumer = _consumer(cluster)
    try:
        consumer.assign([TopicPartition(topic, 0, low)])
        found: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while (not found or found[-1][0] < high - 1) and high > low:
            assert time.monotonic() < deadline, f"read {found} of {low}..{high}"
            message = consumer.poll(1)
            if message is None or message.error():
                continue
            offset, value = message.offset(), message.value()
            assert offset is not None
            assert value is not None
            found.append((offset, value))
        return found
    finally:
        consumer.close()


def _elect_preferred(cluster: ThreeNodes, topic: str) -> None:
    def elected() -> bool:
        partition = TopicPartition(topic, 0)
        admin = _admin(cluster)
        answer = admin.elect_leaders(ElectionType.PREFERRED, [partition])
        errors = answer.result(15)
        error = errors.get(partition)
        # ELECTION_NOT_NEEDED: the preferred replica leads already.
        return error is None or error.code() == 84

    _wait(f"{topic}-0's preferred replica elected", elected)


def test_a_topic_created_again_while_a_replica_was_down_serves_only_its_own_records(
    nodes: ThreeNodes,
) -> None:
    topic = "recreated"
    _create(nodes, topic, [1, 2, 3])
    _produce(nodes, topic, [b"OLD-topic-record-%d" % i for i in range(5)])
    _wait_for_isr(nodes, topic, {1, 2, 3})
    assert nodes.stop(3) == 0  # its copy of the old topic stays on its disk
    _wait_fenced(nodes, 3)

    _delete(nodes, topic)
    _create(nodes, topic, [3, 1, 2])  # node 3 preferred: it leads once it is back
    new = [b"NEW-topic-record-%d" % i for i in range(5)]
    _produce(nodes, topic, new)

    nodes.restart(3)
    _wait_for_isr(nodes, topic, {1, 2, 3})
    _elect_preferred(nodes, topic)
    _wait_for_leader(nodes, topic, 3)
    assert _read(nodes, topic) == list(enumerate(new)), (
        "node 3 must serve the new topic's records, never its old copy of the old topic's"
    )
    _delete(nodes, topic)


def test_records_deleted_stay_deleted_when_the_leader_is_lost_at_once(nodes: ThreeNodes) -> None:
    topic = "trimmed"
    _create(nodes, topic, [1, 2, 3], **{"min.insync.replicas": "2"})
    _produce(nodes, topic, [b"record-%d" % i for i in range(20)])
    _wait_for_isr(nodes, topic, {1, 2, 3})

    admin = _admin(nodes)
    deleted = admin.delete_records([TopicPartition(topic, 0, 10)])
    assert deleted[TopicPartition(topic, 0)].result(15).low_watermark == 10
    nodes.kill(1)  # the leader, before the followers could fetch again
    _wait(f"{topic}-0 led by another node", lambda: _partition(nodes, topic).leader in (2, 3))

    records = _read(nodes, topic)
    assert records[0] == (10, b"record-10"), "deleted records came back on the new leader"
    assert [offset for offset, _ in records] == list(range(10, 20))

    nodes.restart(1)
    _wait_for_isr(nodes, topic, {1, 2, 3})
    _elect_preferred(nodes, topic)
    _wait_for_leader(nodes, topic, 1)
    assert _read(nodes, topic)[0] == (10, b"record-10"), "the old leader serves them again"
    _delete(nodes, topic)


def test_a_replaced_disk_never_leads_and_loses_nothing_acknowledged(nodes: ThreeNodes) -> None:
    topic = "replaced"
    _create(nodes, topic, [1, 2], **{"min.insync.replicas": "2"})
    values = [b"acknowledged-%d" % i for i in range(20)]
    _produce(nodes, topic, values)
    _wait_for_isr(nodes, topic, {1, 2})

    assert nodes.stop(2) == 0  # the follower
    _wait(f"{topic}-0's ISR without 2", lambda: set(_partition(nodes, topic).isrs) == {1})
    assert nodes.stop(1) == 0  # the leader, the last in-sync replica
    nodes.replace_disk(1)
    nodes.restart(1)  # empty, formatted again: a new directory, no clean-shutdown marker
    time.sleep(5)  # time it would take to be elected, and it must not be
    assert _partition(nodes, topic).leader != 1, "the replica with the empty disk leads"

    nodes.restart(2)
    _wait_for_leader(nodes, topic, 2)
    assert _read(nodes, topic) == list(enumerate(values)), "acknowledged records were lost"
    _wait_for_isr(nodes, topic, {1, 2})  # the new disk fetched them all from node 2
    _elect_preferred(nodes, topic)
    _wait_for_leader(nodes, topic, 1)
    assert _read(nodes, topic) == list(enumerate(values))
    _delete(nodes, topic)
