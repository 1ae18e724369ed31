"""Apache Kafka's tools that act on a cluster of brokers, against three combined Gregor nodes
and against three Apache Kafka nodes (4.3.1): the Kafka run proves the scenario and the
harness right. kafka-topics --describe shows each partition's leader, replicas and ISR;
kafka-leader-election moves leaderships back to the preferred replicas."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

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


@pytest.fixture(params=["gregor", "kafka"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ToolCluster]:
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
    assert "Successfully completed leader election (PREFERRED) for partitions elect-0" in (
        elected.stdout
    )
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
