"""The API versions Gregor raised to Kafka 4.3's maxima, each answered as Kafka 4.3.1 answers it.

Every scenario runs, by hand at an exact version (`tests.support.wire`), against a Gregor node
and against Apache Kafka, and the two answers must be equal once the ids each broker gave its
topic are set aside. The cases are the new semantics of each raised version: topics named by id
in Produce v13, Fetch v13–v18, OffsetCommit v10 and OffsetFetch v10 (an unknown id answered
UNKNOWN_TOPIC_ID); ListOffsets' special timestamps -4, -5 and -6 (v8, v9, v11) on a broker
without tiered storage, and UNSUPPORTED_VERSION for each below its version; Metadata v13's
top-level error; OffsetCommit v9's GROUP_ID_NOT_FOUND for a group that does not exist, and
OffsetFetch v9's member id and epoch on a classic group; DescribeGroups v6's not found with its
message; FindCoordinator v6's share-group key; DescribeCluster v2's fenced brokers;
DescribeLogDirs v5's cordoned flag; InitProducerId v5.

The other tests here: `gregor api-versions` prints exactly what a node advertises on the wire;
kafka-python, which infers a broker's release from the advertised maxima, takes Gregor for
Kafka 4.3 and produces and consumes with it; and real clients do send the new versions (the
node's request metrics count each version served).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.protocol import ApiKey, ErrorCode, request_type
from broker.protocol.records import Record, build_batch
from tests.support.brokers import RunningBroker, run_broker
from tests.support.kafka_dist import KafkaTools
from tests.support.kafka_python import close_kafka_python
from tests.support.nodes import RunningNode, free_port, run_node
from tests.support.requests import fill
from tests.support.wire import call

TOPIC = "kafka4"
BATCH = build_batch([Record(offset=0, timestamp=1_700_000_000_000, key=b"k", value=b"v")])
"""One record with a fixed timestamp, so that both brokers hold the same bytes."""
MiB = 1 << 20

Answers = dict[str, Any]


class Scenario:
    """One broker's answers to every case, keyed by case, with its topic ids replaced by
    `"topic id"` and ids nobody made by `"unknown id"`."""

    def __init__(self, broker: RunningBroker) -> None:
        self.address = broker.host_port
        self.unknown = uuid.uuid4()
        self.answers: Answers = {}
        self.topic_id = self._create_topic()

    def call(self, api_key: ApiKey, version: int, values: dict[str, Any]) -> Any:
        return call(self.address, api_key, version, fill(request_type(api_key, version), values))

    def retry(
        self, api_key: ApiKey, version: int, values: dict[str, Any], done: Callable[[Any], bool]
    ) -> Any:
        """Ask again until `done` (a coordinator still loading), for up to 30 s."""
        deadline = time.monotonic() + 30
        while not done(response := self.call(api_key, version, values)):
            assert time.monotonic() < deadline, response
            time.sleep(0.2)
        return response

    def id_of(self, value: Any) -> str:
        if value == self.topic_id:
            return "topic id"
        return "unknown id" if value == self.unknown else repr(value)

    def _create_topic(self) -> uuid.UUID:
        values = {
            "topics": [{"name": TOPIC, "num_partitions": 1, "replication_factor": 1}],
            "timeout": timedelta(seconds=30),
        }
        (created,) = self.call(ApiKey.CREATE_TOPICS, 7, values).topics
        assert created.error_code == ErrorCode.none, created
        return uuid.UUID(str(created.topic_id))

    def run(self) -> Answers:
        for case in (
            self.metadata,
            self.produce,
            self.fetch,
            self.list_offsets,
            self.offsets,
            self.groups,
            self.cluster,
            self.deletions,
        ):
            case()
        return self.answers

    # -- the cases --------------------------------------------------------------------------

    def metadata(self) -> None:
        for wanted in ({"name": TOPIC}, {"name": None, "topic_id": self.unknown}):
            values = {"topics": [wanted], "allow_auto_topic_creation": False}
            response = self.call(ApiKey.METADATA, 13, values)
            self.answers[f"Metadata v13 of {wanted['name'] or 'an unknown id'}"] = (
                response.error_code,
                [(t.name, self.id_of(t.topic_id), t.error_code) for t in response.topics],
            )

    def produce(self) -> None:
        for topic_id in (self.topic_id, self.unknown):
            values = {
                "transactional_id": None,
                "acks": -1,
                "timeout": timedelta(seconds=10),
                "topic_data": [
                    {"topic_id": topic_id, "partition_data": [{"index": 0, "records": BATCH}]}
                ],
            }
            (topic,) = self.call(ApiKey.PRODUCE, 13, values).responses
            (partition,) = topic.partition_responses
            self.answers[f"Produce v13 to the {self.id_of(topic_id)}"] = (
                self.id_of(topic.topic_id),
                partition.error_code,
                partition.base_offset,
                partition.log_start_offset,
            )

    def fetch(self) -> None:
        for version in (13, 15, 16, 17, 18):
            for topic_id in (self.topic_id, self.unknown):
                values = {
                    "replica_id": -1,
                    "max_wait": timedelta(0),
                    "min_bytes": 0,
                    "max_bytes": MiB,
                    "session_epoch": -1,
                    "topics": [
                        {
                            "topic_id": topic_id,
                            "partitions": [
                                {
                                    "partition": 0,
                                    "current_leader_epoch": -1,
                                    "fetch_offset": 0,
                                    "last_fetched_epoch": -1,
                                    "log_start_offset": -1,
                                    "partition_max_bytes": MiB,
                                    "high_watermark": -1,
                                }
                            ],
                        }
                    ],
                    "forgotten_topics_data": [],
                    "rack_id": "",
                }
                response = self.call(ApiKey.FETCH, version, values)
                (topic,) = response.responses
                (p,) = topic.partitions
                self.answers[f"Fetch v{version} from the {self.id_of(topic_id)}"] = (
                    response.error_code,
                    self.id_of(topic.topic_id),
                    p.error_code,
                    p.high_watermark,
                    p.last_stable_offset,
                    p.log_start_offset,
                    bytes(p.records or b""),
                    getattr(response, "node_endpoints", ()),
                )

    def list_offsets(self) -> None:
        for version in (7, 8, 9, 10, 11):
            for timestamp in (-1, -2, -3, -4, -5, -6):
                values = {
                    "replica_id": -1,
                    "timeout": timedelta(seconds=10),
                    "topics": [
                        {
                            "name": TOPIC,
                            "partitions": [
                                {
                                    "partition_index": 0,
                                    "current_leader_epoch": -1,
                                    "timestamp": timestamp,
                                }
                            ],
                        }
                    ],
                }
                (topic,) = self.call(ApiKey.LIST_OFFSETS, version, values).topics
                (p,) = topic.partitions
                self.answers[f"ListOffsets v{version} at {timestamp}"] = (
                    p.error_code,
                    p.offset,
                    p.timestamp,
                    p.leader_epoch,
                )

    def _coordinator(self, group: str) -> None:
        values = {"key_type": 0, "coordinator_keys": [group]}
        self.retry(
            ApiKey.FIND_COORDINATOR,
            6,
            values,
            lambda r: r.coordinators[0].error_code == ErrorCode.none,
        )

    def _commit(self, version: int, group: str, generation: int, topic_id: uuid.UUID) -> Any:
        values = {
            "group_id": group,
            "generation_id_or_member_epoch": generation,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "name": TOPIC,
                    "topic_id": topic_id,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": 1,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "m",
                        }
                    ],
                }
            ],
        }
        (topic,) = self.call(ApiKey.OFFSET_COMMIT, version, values).topics
        (p,) = topic.partitions
        return self.id_of(getattr(topic, "topic_id", None)), p.error_code

    def _fetch_offsets(
        self, version: int, group: str, topic_id: uuid.UUID | None, member: str | None = None
    ) -> Any:
        topics = None
        if topic_id is not None:
            topics = [{"name": TOPIC, "topic_id": topic_id, "partition_indexes": [0]}]
        values = {
            "groups": [
                {
                    "group_id": group,
                    "member_id": member,
                    "member_epoch": 7 if member else -1,
                    "topics": topics,
                }
            ],
            "require_stable": False,
        }
        (answer,) = self.call(ApiKey.OFFSET_FETCH, version, values).groups
        return answer.error_code, [
            (
                getattr(t, "name", None),
                self.id_of(getattr(t, "topic_id", None)),
                [(p.committed_offset, p.metadata, p.error_code) for p in t.partitions],
            )
            for t in answer.topics
        ]

    def offsets(self) -> None:
        self._coordinator("simple")
        for version in (8, 9, 10):
            self.answers[f"OffsetCommit v{version} with a generation, no group"] = self._commit(
                version, f"none-v{version}", 5, self.topic_id
            )
        for topic_id in (self.topic_id, self.unknown):
            where = self.id_of(topic_id)
            self.answers[f"OffsetCommit v10 to the {where}"] = self._commit(
                10, "simple", -1, topic_id
            )
            self.answers[f"OffsetFetch v10 of the {where}"] = self._fetch_offsets(
                10, "simple", topic_id
            )
        self.answers["OffsetFetch v10 of every topic"] = self._fetch_offsets(10, "simple", None)
        self.answers["OffsetFetch v9 naming a member and epoch (classic group)"] = (
            self._fetch_offsets(9, "simple", self.topic_id, member="someone")
        )
        self.answers["OffsetFetch v10 of a group that does not exist"] = self._fetch_offsets(
            10, "nobody", self.topic_id
        )

    def groups(self) -> None:
        for version in (5, 6):
            values = {"groups": ["nobody-here", "simple"], "include_authorized_operations": True}
            response = self.call(ApiKey.DESCRIBE_GROUPS, version, values)
            self.answers[f"DescribeGroups v{version}"] = [
                (
                    g.group_id,
                    g.error_code,
                    getattr(g, "error_message", None),
                    g.group_state,
                    g.authorized_operations,
                )
                for g in response.groups
            ]
        values = {"key_type": 2, "coordinator_keys": [f"share:{self.topic_id}:0"]}
        (found,) = self.call(ApiKey.FIND_COORDINATOR, 6, values).coordinators
        self.answers["FindCoordinator v6 of a share group"] = (found.error_code, found.node_id)

    def cluster(self) -> None:
        for fenced in (False, True):
            values = {
                "include_cluster_authorized_operations": False,
                "endpoint_type": 1,
                "include_fenced_brokers": fenced,
            }
            response = self.call(ApiKey.DESCRIBE_CLUSTER, 2, values)
            self.answers[f"DescribeCluster v2, fenced brokers {fenced}"] = (
                response.error_code,
                [(b.broker_id, b.is_fenced) for b in response.brokers],
            )
        response = self.call(ApiKey.DESCRIBE_LOG_DIRS, 5, {"topics": None})
        self.answers["DescribeLogDirs v5"] = [
            (r.error_code, r.is_cordoned) for r in response.results
        ]
        init: dict[str, Any] = {
            "transactional_id": None,
            "transaction_timeout": timedelta(seconds=60),
            "producer_id": -1,
            "producer_epoch": -1,
        }
        response = self.retry(
            ApiKey.INIT_PRODUCER_ID,
            5,
            init,
            lambda r: r.error_code != ErrorCode.coordinator_load_in_progress,
        )
        self.answers["InitProducerId v5"] = (response.error_code, response.producer_epoch)

    def deletions(self) -> None:
        """DeleteTopics naming a topic twice, an id twice, both a name and an id, or neither:
        each refused, and the topics named twice not deleted."""
        values: dict[str, Any] = {
            "topics": [
                {"name": name, "num_partitions": 1, "replication_factor": 1}
                for name in ("twice-v5", "twice-v6", "by-id-twice")
            ],
            "timeout": timedelta(seconds=30),
        }
        created = {t.name: t.topic_id for t in self.call(ApiKey.CREATE_TOPICS, 7, values).topics}
        twice_id = created["by-id-twice"]
        v5 = {"topic_names": ["twice-v5", "twice-v5"], "timeout": timedelta(seconds=30)}
        response = self.call(ApiKey.DELETE_TOPICS, 5, v5)
        self.answers["DeleteTopics v5 naming a topic twice"] = sorted(
            (r.name, r.error_code, r.error_message) for r in response.responses
        )
        v6 = {
            "topics": [
                {"name": "twice-v6", "topic_id": None},
                {"name": "twice-v6", "topic_id": None},
                {"name": None, "topic_id": twice_id},
                {"name": None, "topic_id": twice_id},
                {"name": TOPIC, "topic_id": self.topic_id},
                {"name": None, "topic_id": None},
            ],
            "timeout": timedelta(seconds=30),
        }
        response = self.call(ApiKey.DELETE_TOPICS, 6, v6)
        self.answers["DeleteTopics v6 with duplicates, both and neither"] = sorted(
            (
                r.name or "",
                "the id named twice" if r.topic_id == twice_id else self.id_of(r.topic_id),
                r.error_code,
                r.error_message,
            )
            for r in response.responses
        )
        # Kafka's brokers learn of new topics a moment after CreateTopics answers: wait for
        # them all (up to 30 s; a broker that deleted them fails here).
        metadata = self.retry(
            ApiKey.METADATA,
            12,
            {"topics": None},
            lambda r: {*created, TOPIC} <= {t.name for t in r.topics},
        )
        self.answers["topics left after the refused deletions"] = sorted(
            t.name for t in metadata.topics if t.name in (*created, TOPIC)
        )


def _answers(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Answers]:
    with run_broker(kind, tmp_path_factory.mktemp(kind)) as broker:  # type: ignore[arg-type]
        yield Scenario(broker).run()


@pytest.fixture(scope="module")
def gregor_answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Answers]:
    yield from _answers("gregor", tmp_path_factory)


@pytest.fixture(scope="module")
def kafka_answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Answers]:
    yield from _answers("kafka", tmp_path_factory)


def test_gregor_answers_every_case_as_kafka_does(
    gregor_answers: Answers, kafka_answers: Answers
) -> None:
    assert list(gregor_answers) == list(kafka_answers)
    differ = {
        case: {"gregor": gregor_answers[case], "kafka": kafka_answers[case]}
        for case in kafka_answers
        if gregor_answers[case] != kafka_answers[case]
    }
    assert not differ, differ


def test_the_cases_say_what_they_test(kafka_answers: Answers) -> None:
    """Kafka's answers are what this file's docstring claims, so the comparison above compares
    the semantics meant (a Kafka that answered everything UNSUPPORTED_VERSION would match a
    Gregor that did the same)."""
    e = ErrorCode
    assert kafka_answers["Produce v13 to the topic id"] == ("topic id", e.none, 0, 0)
    assert kafka_answers["Produce v13 to the unknown id"][:2] == ("unknown id", e.unknown_topic_id)
    fetched = kafka_answers["Fetch v18 from the topic id"]
    assert fetched[1:4] == ("topic id", e.none, 1)
    assert fetched[6], "no records fetched"
    assert kafka_answers["Fetch v13 from the unknown id"][1:3] == ("unknown id", e.unknown_topic_id)
    assert kafka_answers["ListOffsets v8 at -4"] == (e.none, 0, -1, 0)
    assert kafka_answers["ListOffsets v7 at -4"][0] == e.unsupported_version
    assert kafka_answers["ListOffsets v9 at -5"] == (e.none, -1, -1, -1)
    assert kafka_answers["ListOffsets v8 at -5"][0] == e.unsupported_version
    assert kafka_answers["ListOffsets v11 at -6"] == (e.none, -1, -1, -1)
    assert kafka_answers["ListOffsets v10 at -6"][0] == e.unsupported_version
    assert kafka_answers["OffsetCommit v8 with a generation, no group"][1] == e.illegal_generation
    assert kafka_answers["OffsetCommit v9 with a generation, no group"][1] == e.group_id_not_found
    assert kafka_answers["OffsetCommit v10 to the unknown id"][1] == e.unknown_topic_id
    assert kafka_answers["DescribeGroups v6"][0][1:3] == (
        e.group_id_not_found,
        "Group nobody-here not found.",
    )
    refused = kafka_answers["DeleteTopics v6 with duplicates, both and neither"]
    assert {(name, error) for name, _, error, _ in refused} == {
        ("twice-v6", e.invalid_request),
        ("", e.invalid_request),
        (TOPIC, e.invalid_request),
    }
    assert kafka_answers["topics left after the refused deletions"] == sorted(
        ["twice-v5", "twice-v6", "by-id-twice", TOPIC]
    )


def test_gregor_api_versions_prints_what_the_wire_advertises(node: RunningNode) -> None:
    values = {"client_software_name": "gregor-tests", "client_software_version": "1"}
    response = call(
        ("localhost", node.port),
        ApiKey.API_VERSIONS,
        3,
        fill(request_type(ApiKey.API_VERSIONS, 3), values),
    )
    on_the_wire = [
        f"{ApiKey(k.api_key).name:<32} {k.api_key:>3}  v{k.min_version}-v{k.max_version}"
        for k in response.api_keys
    ]
    printed = subprocess.run(
        [sys.executable, "-m", "broker.cli", "api-versions"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).parents[2],
    ).stdout.splitlines()
    assert printed == on_the_wire


def _requests_served(metrics_url: str) -> set[tuple[str, int]]:
    """(request, version) of every request the node has answered, from its metrics."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.labels["request"], int(sample.labels["version"]))
        for family in text_string_to_metric_families(text)
        if family.name == "kafka_network_requestmetrics_requests"
        for sample in family.samples
    }


@pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning")
def test_kafka_python_takes_gregor_for_kafka_4_and_produces_and_consumes(
    tmp_path: Path,
) -> None:
    from kafka import KafkaConsumer, KafkaProducer  # noqa: PLC0415 - warns on import

    port = free_port()
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    with run_node(tmp_path, {"gregor.metrics.listener": f"http://127.0.0.1:{port}"}) as node:
        _produce_and_consume(node, KafkaProducer, KafkaConsumer)
        served = _requests_served(metrics_url)
    # kafka-python then speaks the versions it knows up to Kafka 4.3's: these were above
    # Gregor's old maxima.
    assert {("Metadata", 13), ("ListOffsets", 11), ("FindCoordinator", 6)} <= served, served


def _produce_and_consume(node: RunningNode, KafkaProducer: Any, KafkaConsumer: Any) -> None:

    producer = KafkaProducer(bootstrap_servers=node.bootstrap, acks="all", linger_ms=0)
    try:
        # kafka-python reads the release from marker versions: DescribeLogDirs v5 is 4.3.
        assert producer.config["api_version"] == (4, 3)
        sent = [producer.send("kp-4", key=b"k%d" % i, value=b"v%d" % i) for i in range(20)]
        producer.flush(30)
        offsets = [future.get(timeout=30).offset for future in sent]
    finally:
        close_kafka_python(producer, 10)
    assert offsets == list(range(20))

    consumer = KafkaConsumer(
        "kp-4",
        bootstrap_servers=node.bootstrap,
        group_id="kp-4-readers",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=20_000,
    )
    try:
        assert consumer.config["api_version"] == (4, 3)
        got: list[tuple[bytes, bytes]] = []
        for message in consumer:
            got.append((message.key, message.value))
            if len(got) == 20:
                break
        consumer.commit()
        (partition,) = consumer.assignment()
        committed = consumer.committed(partition)
    finally:
        close_kafka_python(consumer)
    assert got == [(b"k%d" % i, b"v%d" % i) for i in range(20)]
    assert committed == 20


def test_kafka_s_own_tools_use_the_new_versions_with_gregor(tmp_path: Path) -> None:
    """Kafka 4.3.1's console producer and consumer (a classic group) pick the maxima
    themselves: topic ids in Produce v13 and Fetch v18, OffsetCommit/OffsetFetch v9."""
    port = free_port()
    with run_node(tmp_path, {"gregor.metrics.listener": f"http://127.0.0.1:{port}"}) as node:
        tools = KafkaTools(node.bootstrap)
        tools.topics("--create", "--topic", "java-4", "--partitions", "1")
        tools.console_producer("--topic", "java-4", stdin="a\nb\nc\n")
        consumed = tools.console_consumer(
            "--topic", "java-4", "--group", "java-4", "--from-beginning",
            "--max-messages", "3", "--timeout-ms", "30000",
        )  # fmt: skip
        served = _requests_served(f"http://127.0.0.1:{port}/metrics")
    assert consumed.stdout.split() == ["a", "b", "c"]
    expected = {
        ("Produce", 13),
        ("Fetch", 18),
        ("ListOffsets", 11),
        ("Metadata", 13),
        ("OffsetCommit", 9),
        ("OffsetFetch", 9),
        ("FindCoordinator", 6),
        ("InitProducerId", 5),
    }
    assert expected <= served, served
