"""DescribeTopicPartitions, DescribeQuorum on the broker listeners and ListConfigResources
(issue 25), each run against three combined Gregor nodes and against three Apache Kafka 4.3.1
nodes: the same scenario gives each system's answers, normalized where the systems may rightly
differ (topic ids, which node leads what), and the two must be equal; the Kafka run proves the
scenario says what it claims.

- Kafka's `kafka-broker-api-versions` finds the three advertised at the same versions;
- `kafka-topics --describe` (Kafka 4's Admin `describeTopics`, DescribeTopicPartitions when
  advertised) prints the same columns, `Elr:` and `LastKnownElr:` included; by hand, a page of
  2 partitions and the cursor that resumes it, and an unknown topic;
- `kafka-metadata-quorum --bootstrap-server <broker>` describes the quorum through each node's
  broker listener (forwarded to the active controller), and DescribeQuorum v2 sent by hand to
  each broker listener names the same leader, with every voter;
- ListConfigResources v1 lists brokers, broker loggers and topics; v0 client-metrics resources
  only (none); a type Kafka does not list is UNSUPPORTED_VERSION.
"""

from __future__ import annotations

import pprint
import re
from pathlib import Path
from typing import Any

import pytest

from broker.protocol import ApiKey, ErrorCode, request_type
from tests.support.clusters import three_nodes
from tests.support.kafka_dist import KafkaTools, run_tool
from tests.support.requests import fill
from tests.support.wire import call

pytestmark = [pytest.mark.integration, pytest.mark.slow]

METADATA_QUORUM_COMMAND = "org.apache.kafka.tools.MetadataQuorumCommand"
TOPICS = {"described": 5, "described-too": 1}
"""Our topics and their partition counts (replication factor 3)."""

Answers = dict[str, Any]


def _addresses(bootstrap: str) -> list[tuple[str, int]]:
    return [(host, int(port)) for host, port in (a.rsplit(":", 1) for a in bootstrap.split(","))]


def _call(address: tuple[str, int], api_key: ApiKey, version: int, values: Any) -> Any:
    return call(address, api_key, version, fill(request_type(api_key, version), values))


def _columns(line: str) -> list[str]:
    return re.findall(r"(\w+):", line)


def _scenario(bootstrap: str) -> Answers:
    answers: Answers = {}
    tools = KafkaTools(bootstrap)
    addresses = _addresses(bootstrap)
    for name, partitions in TOPICS.items():
        tools.topics("--create", "--topic", name, "--partitions", str(partitions),
                     "--replication-factor", "3")  # fmt: skip

    # Advertised as Kafka advertises them (so Kafka's Admin picks them, as below).
    advertised = tools.broker_api_versions().stdout
    answers["kafka-broker-api-versions of the three APIs"] = sorted(
        set(
            re.findall(
                r"((?:DescribeTopicPartitions|DescribeQuorum|ListConfigResources)\(\d+\): [^,]*)",
                advertised,
            )
        )
    )

    # -- DescribeTopicPartitions ------------------------------------------------------------
    described = tools.topics("--describe", "--topic", "described").stdout.splitlines()
    answers["kafka-topics --describe columns"] = [_columns(line) for line in described if line]
    first = addresses[0]
    values: dict[str, Any] = {
        "topics": [{"name": n} for n in ("described-too", "described", "nowhere")],
        "response_partition_limit": 2,
        "cursor": None,
    }
    pages: list[list[Any]] = []
    for _ in range(5):
        page = _call(first, ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, values)
        pages.append(
            [
                (
                    t.name,
                    t.error_code,
                    t.topic_id is not None,
                    t.is_internal,
                    t.topic_authorized_operations,
                    [
                        (
                            p.partition_index,
                            p.error_code,
                            sorted(p.replica_nodes),
                            sorted(p.isr_nodes),
                            p.eligible_leader_replicas,
                            p.last_known_elr,
                            p.offline_replicas,
                        )
                        for p in t.partitions
                    ],
                )
                for t in page.topics
            ]
        )
        cursor = page.next_cursor
        pages[-1].append(None if cursor is None else (cursor.topic_name, cursor.partition_index))
        if cursor is None:
            break
        values["cursor"] = {
            "topic_name": cursor.topic_name,
            "partition_index": cursor.partition_index,
        }
    answers["DescribeTopicPartitions in pages of 2"] = pages
    every = _call(first, ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, {"topics": [], "cursor": None})
    answers["DescribeTopicPartitions of every topic lists ours"] = sorted(
        (t.name, len(t.partitions)) for t in every.topics if t.name in TOPICS
    )
    refused = _call(
        first,
        ApiKey.DESCRIBE_TOPIC_PARTITIONS,
        0,
        {
            "topics": [{"name": "described"}],
            "cursor": {"topic_name": "other", "partition_index": 0},
        },
    )
    answers["DescribeTopicPartitions with a cursor not named"] = [
        (t.name, t.error_code, t.partitions) for t in refused.topics
    ]

    # -- DescribeQuorum on the broker listeners ---------------------------------------------
    leaders = set()
    for address in addresses:
        response = _call(address, ApiKey.DESCRIBE_QUORUM, 2, {
            "topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]
        })  # fmt: skip
        (topic,) = response.topics
        (partition,) = topic.partitions
        answers[f"DescribeQuorum v2 through broker {addresses.index(address) + 1}"] = (
            response.error_code,
            topic.topic_name,
            partition.error_code,
            sorted(v.replica_id for v in partition.current_voters),
            sorted(n.node_id for n in response.nodes),
        )
        leaders.add(partition.leader_id)
    answers["DescribeQuorum names one leader through every broker"] = len(leaders)
    status = run_tool(
        METADATA_QUORUM_COMMAND, "--bootstrap-server", bootstrap, "describe", "--status"
    ).stdout
    keys = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    answers["kafka-metadata-quorum --bootstrap-server describe --status"] = (
        sorted(key.strip() for key in keys),
        int(keys["LeaderId"]) in (1, 2, 3),
        keys["CurrentVoters"].count('"id"'),
    )
    replication = run_tool(
        METADATA_QUORUM_COMMAND, "--bootstrap-server", addresses[-1][0] + f":{addresses[-1][1]}",
        "describe", "--replication",
    ).stdout.splitlines()  # fmt: skip
    answers["kafka-metadata-quorum --bootstrap-server describe --replication"] = (
        replication[0].split(),
        sorted(line.split()[-1] for line in replication[1:]),
    )

    # -- ListConfigResources ---------------------------------------------------------------
    for version, types in ((1, []), (1, [2, 4]), (0, []), (1, [1])):
        response = _call(first, ApiKey.LIST_CONFIG_RESOURCES, version, {"resource_types": types})
        listed = [
            (getattr(r, "resource_type", None), r.resource_name)
            for r in response.config_resources
            if r.resource_type != 2 or r.resource_name in TOPICS
        ]
        answers[f"ListConfigResources v{version} of {types}"] = (
            response.error_code,
            sorted(listed),
        )
    return answers


def _answers(kind: str, directory: Path) -> Answers:
    with three_nodes(kind, directory) as nodes:
        return _scenario(nodes.bootstrap)


@pytest.fixture(scope="module")
def gregor_answers(tmp_path_factory: pytest.TempPathFactory) -> Answers:
    return _answers("gregor", tmp_path_factory.mktemp("gregor"))


@pytest.fixture(scope="module")
def kafka_answers(tmp_path_factory: pytest.TempPathFactory) -> Answers:
    return _answers("kafka", tmp_path_factory.mktemp("kafka"))


def test_gregor_answers_as_kafka_does(gregor_answers: Answers, kafka_answers: Answers) -> None:
    assert list(gregor_answers) == list(kafka_answers)
    differ = {
        case: {"gregor": gregor_answers[case], "kafka": kafka_answers[case]}
        for case in kafka_answers
        if gregor_answers[case] != kafka_answers[case]
    }
    assert not differ, pprint.pformat(differ, width=100)


def test_the_cases_say_what_they_test(kafka_answers: Answers) -> None:
    e = ErrorCode
    columns = kafka_answers["kafka-topics --describe columns"]
    assert columns[0][:4] == ["Topic", "TopicId", "PartitionCount", "ReplicationFactor"]
    assert columns[1] == [
        "Topic", "Partition", "Leader", "Replicas", "Isr", "Elr", "LastKnownElr"
    ]  # fmt: skip
    assert kafka_answers["kafka-broker-api-versions of the three APIs"] == [
        "DescribeQuorum(55): 0 to 2 [usable: 2]",
        "DescribeTopicPartitions(75): 0 [usable: 0]",
        "ListConfigResources(74): 0 to 1 [usable: 1]",
    ]
    pages = kafka_answers["DescribeTopicPartitions in pages of 2"]
    assert [[(t[0], [p[0] for p in t[5]]) for t in page[:-1]] for page in pages] == [
        [("described", [0, 1])],
        [("described", [2, 3])],
        [("described", [4]), ("described-too", [0])],
        [("nowhere", [])],
    ]
    assert [page[-1] for page in pages] == [
        ("described", 2),
        ("described", 4),
        ("nowhere", 0),
        None,
    ]
    assert pages[3][0][1] == e.unknown_topic_or_partition
    assert kafka_answers["DescribeTopicPartitions with a cursor not named"] == [
        ("described", e.invalid_request, ())
    ]
    for broker in (1, 2, 3):
        assert kafka_answers[f"DescribeQuorum v2 through broker {broker}"] == (
            e.none, "__cluster_metadata", e.none, [1, 2, 3], [1, 2, 3]
        )  # fmt: skip
    assert kafka_answers["DescribeQuorum names one leader through every broker"] == 1
    assert kafka_answers["ListConfigResources v1 of []"] == (
        e.none,
        sorted([(t, str(b)) for t in (4, 8) for b in (1, 2, 3)] + [(2, n) for n in TOPICS]),
    )
    assert kafka_answers["ListConfigResources v0 of []"] == (e.none, [])
    assert kafka_answers["ListConfigResources v1 of [1]"] == (e.unsupported_version, [])
