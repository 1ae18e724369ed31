"""What a node's HTTP listener says of restarting nodes (`/v1/restart-verdict`) and of itself
(`/v1/state`), on real `gregor broker` processes; and that the verdict means what it says: a
producer with `acks=all` goes on being served with the nodes the verdict let stop stopped.

The verdict is Gregor's own resource (Apache Kafka has none; Strimzi computes the same rule
from the Admin API), so these scenarios run against Gregor only. What it is computed from, the
ISR and `min.insync.replicas`, is what the replication tests compare with Kafka."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from gregor_operator.kafka import restart_verdict
from gregor_operator.observed import Verdict
from tests.integration.clients import QUIET
from tests.support.nodes import Cluster, free_port, start_cluster, start_quorum

KEY = "gregor.metrics.listener"
FAST = {"replica.lag.time.max.ms": "1500", "broker.session.timeout.ms": "60000"}


def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body.startswith(b"{") else body.decode()


def verdict(port: int, *nodes: int) -> dict[str, Any]:
    code, answer = get(port, f"/v1/restart-verdict?nodes={','.join(map(str, nodes))}")
    assert code == 200, answer
    assert isinstance(answer, dict)
    return answer


def blocking(answer: dict[str, Any]) -> set[tuple[str, int, str]]:
    return {(p["topic"], p["partition"], p["rule"]) for p in answer["partitions"]}


def wait_until(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


class Brokers:
    """Brokers 1-4 (broker-only nodes) with a dedicated controller (node 5)."""

    def __init__(self, cluster: Cluster, ports: dict[int, int]) -> None:
        self.cluster = cluster
        self.ports = ports

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.cluster.brokers)


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Brokers]:
    ports = {node_id: free_port() for node_id in range(1, 6)}
    cluster = start_cluster(
        tmp_path,
        brokers=4,
        controllers=1,
        extra=FAST,
        each={node_id: {KEY: f"http://127.0.0.1:{port}"} for node_id, port in ports.items()},
    )
    try:
        yield Brokers(cluster, ports)
    finally:
        cluster.kill()


def create(bootstrap: str, name: str, assignment: list[int], min_isr: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    topic = NewTopic(
        name,
        1,  # confluent-kafka wants the count with an assignment, whatever its docs say
        replica_assignment=[assignment],
        config={"min.insync.replicas": str(min_isr)},
    )
    admin.create_topics([topic], operation_timeout=10)[name].result(timeout=30)


def in_sync(brokers: Brokers, port: int) -> bool:
    """Whether the node on `port` sees every partition of both topics fully in sync."""
    answer = verdict(port, 1, 2, 3, 4)
    return {(p["topic"], len(p["isr"])) for p in answer["partitions"]} >= {("a", 3), ("b", 2)}


def produce(bootstrap: str, topic: str) -> str | None:
    """One record with acks=all; None when acknowledged, else the error's name."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 8000, **QUIET}
    )
    outcome: list[str | None] = []
    producer.produce(
        topic, b"v", on_delivery=lambda e, _m: outcome.append(None if e is None else str(e.name()))
    )
    producer.flush(15)
    return outcome[0] if outcome else "not delivered"


def test_the_verdict_blocks_only_the_brokers_whose_partitions_would_lose_availability(
    brokers: Brokers,
) -> None:
    """`a` on brokers 1-3 with min ISR 2, `b` on 3-4 with min ISR 1. One broker of `a` may
    stop, not two; once broker 4 is gone, `b` (under-replicated) blocks broker 3, its last
    in-sync replica, and nobody else: brokers 1 and 2 hold none of it."""
    create(brokers.bootstrap, "a", [1, 2, 3], 2)
    create(brokers.bootstrap, "b", [3, 4], 1)
    asked = brokers.ports[2]
    wait_until(lambda: in_sync(brokers, asked), "the topics did not reach broker 2 in sync")

    assert verdict(asked, 1)["safe"] is True
    assert verdict(asked, 3)["safe"] is True
    pair = verdict(asked, 1, 2)
    assert pair["safe"] is False
    assert blocking(pair) == {("a", 0, "P3")}
    assert pair["partitions"][0]["reason"] == (
        "1 in-sync replica(s) would stay, min.insync.replicas is 2"
    )
    assert blocking(verdict(asked, 3, 4)) == {("b", 0, "P1")}

    # What the operator reads of it (gregor_operator.kafka), and of a node it cannot reach.
    read = restart_verdict(f"127.0.0.1:{asked}", (1, 2))
    assert read == Verdict(
        (1, 2),
        safe=False,
        blocking=("a-0 (P3: 1 in-sync replica(s) would stay, min.insync.replicas is 2)",),
    )
    assert restart_verdict(f"127.0.0.1:{free_port()}", (1,)) is None

    brokers.cluster.broker(4).kill()
    wait_until(
        lambda: blocking(verdict(asked, 3)) == {("b", 0, "P1")},
        "b did not drop broker 4 from its ISR",
    )
    assert verdict(asked, 1)["safe"] is True  # b's missing replica blocks no one else

    # The verdict means what it says: with broker 1 stopped as it allowed, acks=all works.
    brokers.cluster.broker(1).stop()
    assert produce(brokers.bootstrap, "a") is None
    assert verdict(asked, 3)["safe"] is False
    assert blocking(verdict(asked, 3)) >= {("a", 0, "P3")}


def test_a_node_says_what_it_is_doing_and_rejects_what_it_cannot_read(brokers: Brokers) -> None:
    for node_id, port in brokers.ports.items():
        code, state = get(port, "/v1/state")
        assert code == 200
        roles = ["controller"] if node_id == 5 else ["broker"]
        assert state == {"nodeId": node_id, "roles": roles, "state": "running"}
    assert get(brokers.ports[1], "/v1/restart-verdict?nodes=one")[0] == 400
    code, said = get(brokers.ports[1], "/v1/nope")
    assert code == 404
    assert "/v1/restart-verdict" in said
    own = verdict(brokers.ports[1])
    assert own["nodes"] == [1]


def test_only_the_quorum_leader_judges_a_voter_and_it_counts_caught_up_voters(
    tmp_path: Path,
) -> None:
    ports = {node_id: free_port() for node_id in (1, 2, 3)}
    nodes = start_quorum(
        tmp_path,
        3,
        FAST | {"controller.quorum.fetch.timeout.ms": "1000"},
        each={node_id: {KEY: f"http://127.0.0.1:{port}"} for node_id, port in ports.items()},
    )
    try:
        wait_until(
            lambda: verdict(ports[1], 1).get("quorum", {}).get("leader") is not None,
            "no quorum leader",
        )
        leader = verdict(ports[1], 1)["quorum"]["leader"]
        follower, other = (n for n in (1, 2, 3) if n != leader)
        said = verdict(ports[follower], other)
        assert said["safe"] is False
        assert said["quorum"]["judged"] is False
        assert said["quorum"]["leader"] == leader

        wait_until(lambda: verdict(ports[leader], other)["safe"], "the voters never caught up")
        assert verdict(ports[leader], leader)["safe"] is True  # the leader itself may stop

        nodes[follower - 1].kill()
        wait_until(
            lambda: verdict(ports[leader], other)["quorum"]["risk"] is not None,
            "the leader still counts the killed voter as caught up",
        )
        risk = verdict(ports[leader], other)["quorum"]["risk"]
        assert risk.endswith(f"a majority of 3 is 2; not caught up: {follower}"), risk
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill()
