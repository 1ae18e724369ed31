"""Apache Kafka's tools that act on a cluster of brokers, against three combined Gregor nodes
and against three Apache Kafka nodes (4.3.1): the Kafka run proves the scenario and the
harness right. kafka-topics --describe shows each partition's leader, replicas and ISR;
kafka-leader-election moves leaderships back to the preferred replicas; kafka-reassign-partitions
moves a partition under a replication throttle; kafka-cluster unregister removes a broker that
a clean stop left registered."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.support.kafka_dist import (
    KafkaTools,
    ToolFailed,
    start_kafka_cluster,
    stop_kafka_cluster,
)
from tests.support.nodes import start_cluster, wait_listening

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NO_REBALANCE = {"auto.leader.rebalance.enable": "false"}
"""Leaders stay where failures put them until a tool moves them."""


@dataclass
class ToolCluster:
    """Three brokers (ids 1-3), whatever runs them."""

    bootstrap: str
    stop: Callable[[int], int]
    """SIGTERM broker `id` (a controlled shutdown), wait for it to exit; its exit code."""
    restart: Callable[[int], None]
    """Start broker `id` again; returns once it serves."""


@pytest.fixture(scope="module", params=["gregor", "kafka"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToolCluster]:
    """One cluster per system for the module (three nodes take 5 to 15 s to start): each test
    works on topics of its own and leaves every broker running and registered."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    if request.param == "gregor":
        running = start_cluster(tmp_path, 3, 0, NO_REBALANCE)

        def restart(node_id: int) -> None:
            running.broker(node_id).restart()
            wait_listening(running.broker(node_id), timeout=30)

        try:
            yield ToolCluster(
                ",".join(b.bootstrap for b in running.brokers),
                lambda node_id: running.broker(node_id).stop(),
                restart,
            )
        finally:
            running.kill()
    else:
        brokers = start_kafka_cluster(tmp_path, 3, NO_REBALANCE)
        try:
            yield ToolCluster(
                ",".join(b.bootstrap for b in brokers),
                lambda node_id: brokers[node_id - 1].stop(),
                lambda node_id: brokers[node_id - 1].restart(),
            )
        finally:
            stop_kafka_cluster(brokers)


_DESCRIBED = re.compile(
    r"Partition: (\d+)\s+Leader: (-?\d+|none)\s+Replicas: ([\d,]+)\s+Isr: ([\d,]*)"
)


def _describe(tools: KafkaTools, topic: str) -> dict[int, tuple[int, list[int], set[int]]]:
    """kafka-topics --describe: partition → (leader, replicas, ISR)."""
    described = tools.topics("--describe", "--topic", topic).stdout
    found = {}
    for partition, leader, replicas, isr in _DESCRIBED.findall(described):
        found[int(partition)] = (
            -1 if leader == "none" else int(leader),
            [int(r) for r in replicas.split(",")],
            {int(r) for r in isr.split(",") if r},
        )
    assert found, described
    return found


def _wait_until(
    tools: KafkaTools,
    topic: str,
    check: Callable[[dict[int, tuple[int, list[int], set[int]]]], bool],
    what: str,
    timeout: float = 60.0,
) -> dict[int, tuple[int, list[int], set[int]]]:
    deadline = time.monotonic() + timeout
    while True:
        described = _describe(tools, topic)
        if check(described):
            return described
        assert time.monotonic() < deadline, f"{what}: {described}"
        time.sleep(0.5)


def test_leader_election_moves_leaders_back_to_their_preferred_replicas(
    cluster: ToolCluster,
) -> None:
    tools = KafkaTools(cluster.bootstrap)
    created = tools.topics(
        "--create", "--topic", "elect", "--replica-assignment", "1:2:3,2:3:1,3:1:2"
    )
    assert "Created topic elect." in created.stdout
    described = _wait_until(
        tools, "elect", lambda d: all(p[0] == p[1][0] for p in d.values()), "preferred leaders"
    )
    assert {index: p[1] for index, p in described.items()} == {
        0: [1, 2, 3],
        1: [2, 3, 1],
        2: [3, 1, 2],
    }

    # Broker 1 goes (its partition moves) and comes back into every ISR, leading nothing.
    cluster.stop(1)
    _wait_until(tools, "elect", lambda d: d[0][0] in (2, 3), "partition 0 moves")
    cluster.restart(1)
    described = _wait_until(
        tools, "elect", lambda d: all(p[2] == {1, 2, 3} for p in d.values()), "1 rejoins"
    )
    assert described[0][0] != 1

    elected = tools.leader_election("--election-type", "preferred", "--all-topic-partitions")
    # The tool lists every partition it moved, in no set order (the module's other tests may
    # have left leaders of their own topics away from their preferred replicas).
    moved = re.search(
        r"Successfully completed leader election \(PREFERRED\) for partitions (.*)", elected.stdout
    )
    assert moved is not None, elected.stdout
    assert "elect-0" in moved.group(1).split(", "), elected.stdout
    described = _describe(tools, "elect")
    assert {index: p[0] for index, p in described.items()} == {0: 1, 1: 2, 2: 3}

    again = tools.leader_election(
        "--election-type", "preferred", "--topic", "elect", "--partition", "1"
    )
    assert "Valid replica already elected for partitions elect-1" in again.stdout

    with pytest.raises(ToolFailed) as refused:
        tools.leader_election(
            "--election-type", "preferred", "--topic", "elect", "--partition", "7"
        )
    assert "Error completing leader election (PREFERRED) for partition: elect-7" in str(
        refused.value
    )
    assert "UnknownTopicOrPartitionException" in str(refused.value)


RECORDS = 4000
RECORD = b"r" * 1024


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5}
    )
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    for number in range(count):
        producer.produce(topic, RECORD, key=str(number).encode(), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert failures == []


def _read_back(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    keys: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(keys) < count and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                keys.append(message.key() or b"")
    finally:
        consumer.close()
    return keys


def _reassignment(topic: str, replicas: list[int]) -> str:
    return json.dumps(
        {"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": replicas}]}
    )


def test_a_throttled_reassignment_moves_a_partition_and_loses_nothing(
    cluster: ToolCluster, tmp_path: Path
) -> None:
    tools = KafkaTools(cluster.bootstrap)
    tools.topics("--create", "--topic", "moving", "--replica-assignment", "1:2")
    _wait_until(tools, "moving", lambda d: d[0][2] == {1, 2}, "both replicas in sync")
    _produce(cluster.bootstrap, "moving", RECORDS)

    to_move = tmp_path / "to-move.json"
    to_move.write_text(json.dumps({"version": 1, "topics": [{"topic": "moving"}]}))
    generated = tools.reassign_partitions(
        "--generate", "--topics-to-move-json-file", str(to_move), "--broker-list", "2,3"
    )
    assert "Current partition replica assignment" in generated.stdout
    assert '"replicas":[1,2]' in generated.stdout
    assert "Proposed partition reassignment configuration" in generated.stdout

    plan = tmp_path / "plan.json"
    plan.write_text(_reassignment("moving", [2, 3]))
    executed = tools.reassign_partitions(
        "--execute", "--reassignment-json-file", str(plan), "--throttle", "1"
    )
    assert "Successfully started partition reassignment for moving-0" in executed.stdout

    # One byte per second: the new replica cannot catch up, so the move stays under way.
    listed = tools.reassign_partitions("--list").stdout
    assert "moving-0: replicas: 2,3,1. adding: 3. removing: 1." in listed, listed
    in_progress = tools.reassign_partitions("--verify", "--reassignment-json-file", str(plan))
    assert "Reassignment of partition moving-0 is still in progress." in in_progress.stdout
    time.sleep(3)
    assert _describe(tools, "moving")[0][1] == [2, 3, 1]  # still moving

    # The throttle raised, the move completes, and --verify clears the throttles.
    tools.reassign_partitions(
        "--execute",
        "--reassignment-json-file",
        str(plan),
        "--additional",
        "--throttle",
        "100000000",
    )
    deadline = time.monotonic() + 60
    while True:
        verified = tools.reassign_partitions(
            "--verify", "--reassignment-json-file", str(plan)
        ).stdout
        if "Reassignment of partition moving-0 is completed." in verified:
            break
        assert time.monotonic() < deadline, verified
        time.sleep(1)
    assert "Clearing broker-level throttles on brokers 1,2,3" in verified
    assert "Clearing topic-level throttles on topic moving" in verified
    assert "No partition reassignments found." in tools.reassign_partitions("--list").stdout
    described = _wait_until(tools, "moving", lambda d: d[0][2] == {2, 3}, "the new ISR")
    assert described[0][1] == [2, 3]
    for broker in (1, 2, 3):
        configs = tools.configs(
            "--describe", "--entity-type", "brokers", "--entity-name", str(broker)
        ).stdout
        assert "replication.throttled.rate" not in configs, configs
    topic_configs = tools.configs(
        "--describe", "--entity-type", "topics", "--entity-name", "moving"
    )
    assert "throttled.replicas" not in topic_configs.stdout, topic_configs.stdout

    keys = _read_back(cluster.bootstrap, "moving", RECORDS)
    assert keys == [str(number).encode() for number in range(RECORDS)]


def test_log_dirs_and_api_versions_answer_for_every_broker(cluster: ToolCluster) -> None:
    tools = KafkaTools(cluster.bootstrap)
    tools.topics("--create", "--topic", "dirs", "--partitions", "2", "--replication-factor", "3")
    _wait_until(tools, "dirs", lambda d: all(p[2] == {1, 2, 3} for p in d.values()), "in sync")
    _produce(cluster.bootstrap, "dirs", 100)

    described = tools.log_dirs("--describe", "--topic-list", "dirs").stdout
    assert "Received log directory information from brokers 1,2,3" in described, described
    report = json.loads(described.strip().splitlines()[-1])
    sizes: dict[int, dict[str, int]] = {}
    for broker in report["brokers"]:
        for directory in broker["logDirs"]:
            assert directory["error"] is None, directory
            for partition in directory["partitions"]:
                sizes.setdefault(broker["broker"], {})[partition["partition"]] = partition["size"]
    # Every broker holds both partitions, every record replicated (1 KiB each, so > 100 KiB).
    assert set(sizes) == {1, 2, 3}
    for held in sizes.values():
        assert set(held) == {"dirs-0", "dirs-1"}
        assert sum(held.values()) > 100 * 1024, sizes

    versions = tools.broker_api_versions().stdout
    for broker in (1, 2, 3):
        assert f"(id: {broker} rack: " in versions, versions
    # Each broker's line for Produce: the versions it serves, and that the tool will use.
    assert len(re.findall(r"Produce\(0\): \d+ to 13 \[usable: 13\]", versions)) == 3, versions


def _registered(bootstrap: str) -> set[int]:
    """The brokers a Metadata response lists: the unfenced ones, as Kafka's do."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    return set(admin.list_topics(timeout=10).brokers)


def _create(bootstrap: str, topic: str, assignment: list[list[int]]) -> KafkaError | None:
    """CreateTopics with a manual assignment, through confluent_kafka's AdminClient; the
    error it was refused with, or None."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    wanted = NewTopic(topic, num_partitions=len(assignment), replica_assignment=assignment)
    created = admin.create_topics([wanted])
    try:
        created[topic].result(timeout=30)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return error
    return None


def test_a_stopped_broker_stays_registered_until_it_is_unregistered(
    cluster: ToolCluster,
) -> None:
    """Issue 25, as in Kafka: a broker stopped cleanly stays registered, fenced, so a manual
    assignment may name it (its replica starts out of the ISR and joins once it is back).
    Only kafka-cluster unregister, what a scale-down does once a broker's pod is gone,
    removes it: its partitions move off it, an assignment naming it is refused, and a
    process started again under its id registers anew."""
    tools = KafkaTools(cluster.bootstrap)
    cluster.stop(3)  # (Kafka's JVM exits 143 on SIGTERM, Gregor 0)
    deadline = time.monotonic() + 30
    while _registered(cluster.bootstrap) != {1, 2}:  # Metadata lists the unfenced only
        assert time.monotonic() < deadline, _registered(cluster.bootstrap)
        time.sleep(0.5)

    assert _create(cluster.bootstrap, "kept", [[1, 2, 3]]) is None
    described = _wait_until(tools, "kept", lambda d: d[0][2] == {1, 2}, "in sync without 3")
    assert described[0] == (1, [1, 2, 3], {1, 2})
    cluster.restart(3)
    _wait_until(tools, "kept", lambda d: d[0][2] == {1, 2, 3}, "3 joins the ISR")

    tools.topics("--create", "--topic", "leaving", "--replica-assignment", "3:1:2")
    _wait_until(tools, "leaving", lambda d: d[0][2] == {1, 2, 3}, "in sync")
    cluster.stop(3)
    unregistered = tools.cluster("unregister", "--id", "3")
    assert "Broker 3 is no longer registered." in unregistered.stdout
    for topic in ("kept", "leaving"):
        described = _describe(tools, topic)
        assert described[0][0] in (1, 2)
        assert 3 not in described[0][2]
    refused = _create(cluster.bootstrap, "refused", [[1, 2, 3]])
    assert refused is not None
    assert refused.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT, refused
    assert "broker 3, but no such broker is registered" in refused.str(), refused

    with pytest.raises(ToolFailed) as unknown:
        tools.cluster("unregister", "--id", "7")
    assert "BrokerIdNotRegisteredException" in str(unknown.value)

    cluster.restart(3)
    deadline = time.monotonic() + 30
    while _registered(cluster.bootstrap) != {1, 2, 3}:
        assert time.monotonic() < deadline, _registered(cluster.bootstrap)
        time.sleep(0.5)
