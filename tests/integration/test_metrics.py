"""The Prometheus endpoint of a real `gregor broker`, scraped over HTTP while confluent-kafka
produces and consumes: counters move by what the clients sent, gauges match the topics, and a
bad `gregor.metrics.listener` stops the node naming the key."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.clients import QUIET, admin_client, create_topic, read_all
from tests.support.nodes import (
    RunningNode,
    format_node,
    free_port,
    refused_start,
    run_node,
    start_cluster,
    start_quorum,
)

KEY = "gregor.metrics.listener"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class MeteredNode:
    node: RunningNode
    metrics_url: str
    log_dir: Path

    @property
    def bootstrap(self) -> str:
        return self.node.bootstrap

    def scrape(self, accept: str | None = None) -> str:
        request = urllib.request.Request(self.metrics_url, headers={"Accept": accept or "*/*"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
            body: bytes = response.read()
        return body.decode()

    def samples(self) -> Samples:
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(self.scrape())
            for sample in family.samples
        }

    def disk_bytes(self, topic: str, partition: int) -> int:
        """What the partition's segment files hold: the record batches as producers sent them."""
        return sum(p.stat().st_size for p in (self.log_dir / f"{topic}-{partition}").glob("*.log"))


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeteredNode]:
    tmp = tmp_path_factory.mktemp("metrics")
    port = free_port()
    extra = {KEY: f"http://127.0.0.1:{port}", "auto.create.topics.enable": "false"}
    with run_node(tmp, extra) as node:
        yield MeteredNode(node, f"http://127.0.0.1:{port}/metrics", tmp / "logs")


def _produce(bootstrap: str, topic: str, count: int) -> None:
    delivered: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **QUIET})
    for i in range(count):
        producer.produce(
            topic,
            key=f"key-{i % 11}".encode(),
            value=f"value-{i}".encode() * 10,
            on_delivery=lambda error, _message: delivered.append(error),
        )
    assert producer.flush(15) == 0
    assert delivered == [None] * count


def test_byte_and_message_counters_move_by_what_the_clients_sent(metered: MeteredNode) -> None:
    topic, partitions, count = "metered", 3, 120
    before = metered.samples()
    create_topic(metered.bootstrap, topic, partitions)
    _produce(metered.bootstrap, topic, count)
    produced = metered.samples()
    sizes = [metered.disk_bytes(topic, p) for p in range(partitions)]
    sent = sum(sizes)
    assert sent > count * 60  # the values alone are 60+ bytes each

    def moved(now: Samples, name: str, **labels: str) -> float:
        return value(now, name, **labels) - value(before, name, **labels)

    bytes_in = "kafka_server_brokertopicmetrics_bytesin_total"
    messages_in = "kafka_server_brokertopicmetrics_messagesin_total"
    assert moved(produced, bytes_in, topic=topic) == sent
    assert moved(produced, bytes_in) == sent
    assert moved(produced, messages_in, topic=topic) == count
    assert moved(produced, messages_in) == count
    appends = moved(produced, "kafka_server_brokertopicmetrics_totalproducerequests_total")
    assert 3 <= appends < count  # once per partition per request, never per record
    assert moved(produced, "kafka_server_brokertopicmetrics_failedproducerequests_total") == 0
    for partition, size in enumerate(sizes):
        assert value(produced, "kafka_log_log_size", topic=topic, partition=str(partition)) == size

    assert len(read_all(metered.bootstrap, topic, partitions, count)) == count
    consumed = metered.samples()
    bytes_out = "kafka_server_brokertopicmetrics_bytesout_total"
    assert moved(consumed, bytes_out, topic=topic) == sent
    assert moved(consumed, bytes_out) == sent
    assert moved(consumed, "kafka_server_brokertopicmetrics_totalfetchrequests_total") >= 3
    assert moved(consumed, "kafka_server_brokertopicmetrics_failedfetchrequests_total") == 0


def test_requests_are_counted_and_timed_per_api(metered: MeteredNode) -> None:
    create_topic(metered.bootstrap, "timed", 1)
    _produce(metered.bootstrap, "timed", 5)
    samples = metered.samples()
    requests: dict[str, float] = {}
    for (name, labels), count in samples.items():
        if name == "kafka_network_requestmetrics_requests_total":
            label = dict(labels)
            assert label["version"].isdigit()
            requests[label["request"]] = requests.get(label["request"], 0) + count
    assert {"ApiVersions", "Metadata", "CreateTopics", "Produce"} <= requests.keys()
    histogram = "kafka_network_requestmetrics_totaltimems"
    for api, count in requests.items():
        assert value(samples, f"{histogram}_count", request=api) == count
        assert value(samples, f"{histogram}_sum", request=api) > 0
        buckets = sorted(
            (float(dict(labels)["le"]), n)
            for (name, labels), n in samples.items()
            if name == f"{histogram}_bucket" and dict(labels)["request"] == api
        )
        assert buckets[-1] == (float("inf"), count)
        assert [n for _, n in buckets] == sorted(n for _, n in buckets)


def test_error_codes_in_responses_are_counted_per_api(metered: MeteredNode) -> None:
    errors = "kafka_network_requestmetrics_errors_total"
    before = metered.samples()
    create_topic(metered.bootstrap, "twice", 1)
    with pytest.raises(Exception, match="already exists"):
        create_topic(metered.bootstrap, "twice", 1)
    admin = admin_client(metered.bootstrap)
    missing = admin.list_topics(topic="no-such-topic", timeout=10).topics["no-such-topic"]
    assert missing.error is not None
    after = metered.samples()

    def moved(**labels: str) -> float:
        return value(after, errors, **labels) - value(before, errors, **labels)

    assert moved(request="CreateTopics", error="TOPIC_ALREADY_EXISTS") == 1
    assert moved(request="CreateTopics", error="NONE") == 1
    assert moved(request="Metadata", error="UNKNOWN_TOPIC_OR_PARTITION") >= 1


def test_partition_leader_and_log_gauges_match_the_topics(metered: MeteredNode) -> None:
    create_topic(metered.bootstrap, "gauged-a", 4)
    create_topic(metered.bootstrap, "gauged-b", 2)
    _produce(metered.bootstrap, "gauged-a", 10)
    listed = admin_client(metered.bootstrap).list_topics(timeout=10)
    expected = {(name, p) for name, t in listed.topics.items() for p in t.partitions}
    assert {("gauged-a", 3), ("gauged-b", 1)} <= expected
    samples = metered.samples()
    assert value(samples, "kafka_server_replicamanager_partitioncount") == len(expected)
    assert value(samples, "kafka_server_replicamanager_leadercount") == len(expected)
    assert value(samples, "kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert value(samples, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert value(samples, "kafka_controller_kafkacontroller_globaltopiccount") == len(listed.topics)
    assert value(samples, "kafka_controller_kafkacontroller_globalpartitioncount") == len(expected)
    sizes = {
        (dict(labels)["topic"], int(dict(labels)["partition"])): size
        for (name, labels), size in samples.items()
        if name == "kafka_log_log_size"
    }
    assert sizes.keys() == expected
    for (topic, partition), size in sizes.items():
        assert size == metered.disk_bytes(topic, partition), (topic, partition)
    assert sum(sizes[("gauged-a", p)] for p in range(4)) > 0
    assert all(sizes[("gauged-b", p)] == 0 for p in range(2))


def test_openmetrics_scrapes_parse(metered: MeteredNode) -> None:
    """Prometheus asks for OpenMetrics first; what it gets must parse as such."""
    text = metered.scrape("application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
    assert text.endswith("# EOF\n")
    names = {family.name for family in openmetrics_families(text)}  # type: ignore[no-untyped-call]
    assert {
        "kafka_server_brokertopicmetrics_bytesin",
        "kafka_network_requestmetrics_totaltimems",
        "kafka_log_log_size",
    } <= names


def _refused(tmp: Path, listener: str, *, formatted: bool = False) -> str:
    """Start `gregor broker` with `listener` (on formatted dirs if `formatted`: a refusal
    that comes after the dirs are checked); it must exit 1. Returns what it said."""
    config = tmp / "server.properties"
    config.write_text(
        f"listeners=PLAINTEXT://localhost:{free_port()}\nlog.dirs={tmp / 'logs'}\n"
        f"{KEY}={listener}\n"
    )
    if formatted:
        format_node(config)
    return refused_start(config)


@pytest.mark.parametrize(
    "listener", ["tcp://0.0.0.0:9404", "http://0.0.0.0", "http://0.0.0.0:99999", "9404"]
)
def test_a_bad_metrics_listener_stops_the_node_naming_the_key(
    tmp_path: Path, listener: str
) -> None:
    assert KEY in _refused(tmp_path, listener)


def test_a_taken_metrics_port_stops_the_node_naming_the_key(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said = _refused(tmp_path, f"http://127.0.0.1:{port}", formatted=True)
    assert KEY in said
    assert "cannot listen" in said


def _probe(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_probes_say_a_serving_node_is_live_and_ready(metered: MeteredNode) -> None:
    base = metered.metrics_url.removesuffix("/metrics")
    assert _probe(f"{base}/livez") == (200, "ok\n")
    assert _probe(f"{base}/readyz") == (200, "ready\n")
    assert _probe(f"{base}/healthz")[0] == 404


def test_a_node_whose_quorum_is_lost_stays_live_but_is_not_ready(tmp_path: Path) -> None:
    """What Kubernetes' probes see of a cluster that lost two of its three voters: the last
    node is alive (no reason to restart it) but not ready (no reason to send it clients)."""
    ports = {node_id: free_port() for node_id in (1, 2, 3)}
    nodes = start_quorum(
        tmp_path,
        3,
        each={node_id: {KEY: f"http://127.0.0.1:{port}"} for node_id, port in ports.items()},
    )
    try:
        for port in ports.values():
            assert _probe(f"http://127.0.0.1:{port}/readyz") == (200, "ready\n")
        for node in nodes[1:]:
            node.kill()
        deadline = time.monotonic() + 30
        while (found := _probe(f"http://127.0.0.1:{ports[1]}/readyz"))[0] == 200:
            assert time.monotonic() < deadline, "still ready 30 s after losing its quorum"
            time.sleep(0.2)
        assert found == (503, "not ready: the metadata quorum has no leader\n")
        assert _probe(f"http://127.0.0.1:{ports[1]}/livez") == (200, "ok\n")
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill()


def test_a_broker_stays_ready_while_its_quorum_has_no_leader(tmp_path: Path) -> None:
    """Dedicated controllers 2-4 and broker 1: with two controllers gone the quorum has no
    leader, so the last controller is not ready; the broker keeps serving the partitions it
    has, as a Kafka broker does through a controller failover, and stays ready. Otherwise a
    restart of the active controller would take every broker out of its Service at once."""
    ports = {1: free_port(), 2: free_port()}
    cluster = start_cluster(
        tmp_path,
        brokers=1,
        controllers=3,
        extra={"controller.quorum.election.timeout.ms": "300"},
        each={node_id: {KEY: f"http://127.0.0.1:{port}"} for node_id, port in ports.items()},
    )
    broker, controller = (f"http://127.0.0.1:{ports[i]}/readyz" for i in (1, 2))
    try:
        deadline = time.monotonic() + 30
        while _probe(broker)[0] != 200 or _probe(controller)[0] != 200:
            assert time.monotonic() < deadline, (_probe(broker), _probe(controller))
            time.sleep(0.2)
        for node in cluster.controllers[1:]:
            node.kill()
        deadline = time.monotonic() + 30
        while (found := _probe(controller))[0] == 200:
            assert _probe(broker) == (200, "ready\n")
            assert time.monotonic() < deadline, "the controller is still ready"
            time.sleep(0.2)
        assert found == (503, "not ready: the metadata quorum has no leader\n")
        assert _probe(broker) == (200, "ready\n")
    finally:
        cluster.kill()
