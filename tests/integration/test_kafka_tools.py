"""Apache Kafka's own command-line tools (4.3.1, run by main class) against a broker, as an
operator would use them: kafka-topics, kafka-console-producer and -consumer, kafka-consumer-
groups, kafka-configs, kafka-delete-records and kafka-producer-perf-test.

Each scenario is written once and runs against Gregor and against Apache Kafka itself; the
Kafka run proves the scenario and the harness right. A scenario first checks that the broker
serves every API it needs, so that a broker lacking one fails at once, naming it, rather than
after a client's timeout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from broker.protocol import ApiKey
from tests.support.brokers import GROUP_CONSUMER_APIS, RunningBroker, require_apis
from tests.support.kafka_dist import KafkaTools

pytestmark = pytest.mark.slow

TOPICS_ADMIN = (ApiKey.METADATA, ApiKey.CREATE_TOPICS, ApiKey.DESCRIBE_CONFIGS)
PRODUCE = (ApiKey.PRODUCE, ApiKey.INIT_PRODUCER_ID, ApiKey.METADATA)
CONSUMER_WAIT_MS = "30000"


@pytest.fixture
def tools(broker: RunningBroker) -> KafkaTools:
    return KafkaTools(broker.bootstrap)


def create_topic(tools: KafkaTools, topic: str, partitions: int, *configs: str) -> None:
    options = [f"--config={config}" for config in configs]
    created = tools.topics("--create", "--topic", topic, "--partitions", str(partitions), *options)
    assert f"Created topic {topic}." in created.stdout


def produce_keyed(tools: KafkaTools, topic: str, lines: list[str]) -> None:
    """kafka-console-producer with `parse.key=true`: each line is `key:value`."""
    tools.console_producer(
        "--topic",
        topic,
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        "key.separator=:",
        stdin="".join(f"{line}\n" for line in lines),
    )


def consume(tools: KafkaTools, topic: str, group: str, count: int, *options: str) -> list[str]:
    """kafka-console-consumer in `group`: each record as `partition|key|value`, stopping after
    `count` records or when none arrives for 30 s."""
    result = tools.console_consumer(
        "--topic",
        topic,
        "--group",
        group,
        "--max-messages",
        str(count),
        "--timeout-ms",
        CONSUMER_WAIT_MS,
        "--formatter-property",
        "print.partition=true",
        "--formatter-property",
        "print.key=true",
        "--formatter-property",
        "key.separator=|",
        *options,
    )
    assert f"Processed a total of {count} messages" in result.stderr, result.describe()
    # The formatter writes "Partition:N", the key and the value, separated by key.separator.
    return [line.removeprefix("Partition:") for line in result.stdout.splitlines() if line]


def describe_group(tools: KafkaTools, group: str) -> dict[int, tuple[int, int, int]]:
    """kafka-consumer-groups --describe: partition -> (current offset, log end offset, lag)."""
    out = tools.consumer_groups("--describe", "--group", group).stdout
    rows: dict[int, tuple[int, int, int]] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[0] == group and fields[2].isdigit():
            rows[int(fields[2])] = (int(fields[3]), int(fields[4]), int(fields[5]))
    assert rows, f"no partitions in kafka-consumer-groups --describe:\n{out}"
    return rows


def test_topics_create_list_describe_alter_and_delete(
    broker: RunningBroker, tools: KafkaTools
) -> None:
    require_apis(broker, (*TOPICS_ADMIN, ApiKey.CREATE_PARTITIONS, ApiKey.DELETE_TOPICS))
    create_topic(tools, "orders", 3, "retention.ms=3600000", "cleanup.policy=compact")

    assert "orders" in tools.topics("--list").stdout.split()

    described = tools.topics("--describe", "--topic", "orders").stdout
    assert "PartitionCount: 3" in described
    assert "retention.ms=3600000" in described
    assert "cleanup.policy=compact" in described
    assert len(re.findall(r"Partition: \d+\s+Leader: 1\b", described)) == 3, described

    tools.topics("--alter", "--topic", "orders", "--partitions", "5")
    assert "PartitionCount: 5" in tools.topics("--describe", "--topic", "orders").stdout

    refused = tools.topics("--alter", "--topic", "orders", "--partitions", "2", check=False)
    assert refused.returncode != 0
    assert (
        "The topic orders currently has 5 partition(s); 2 would not be an increase."
        in refused.stdout + refused.stderr
    ), refused.describe()

    again = tools.topics("--create", "--topic", "orders", "--partitions", "1", check=False)
    assert again.returncode != 0
    assert "Topic 'orders' already exists." in again.stdout + again.stderr, again.describe()

    tools.topics("--delete", "--topic", "orders")
    assert "orders" not in tools.topics("--list").stdout.split()


def test_console_producer_keys_are_read_back_by_the_console_consumer(
    broker: RunningBroker, tools: KafkaTools
) -> None:
    require_apis(broker, (*TOPICS_ADMIN, *PRODUCE, *GROUP_CONSUMER_APIS))
    create_topic(tools, "payments", 2)
    lines = [f"{key}:{key}-{n}" for n in range(5) for key in ("alice", "bob", "carol")]
    produce_keyed(tools, "payments", lines)

    records = consume(tools, "payments", "readers", len(lines), "--from-beginning")
    by_key: dict[str, list[str]] = {}
    partition_of: dict[str, set[str]] = {}
    for record in records:
        partition, key, value = record.split("|")
        by_key.setdefault(key, []).append(value)
        partition_of.setdefault(key, set()).add(partition)
    # Every record back, each key's records in the order produced, all in one partition.
    assert by_key == {key: [f"{key}-{n}" for n in range(5)] for key in ("alice", "bob", "carol")}
    assert all(len(partitions) == 1 for partitions in partition_of.values()), partition_of

    # The group committed its offsets: it resumes after them and sees only what is new.
    produce_keyed(tools, "payments", ["dave:dave-0"])
    assert [r.split("|", 1)[1] for r in consume(tools, "payments", "readers", 1)] == ["dave|dave-0"]


def test_consumer_groups_list_describe_lag_and_reset_offsets(
    broker: RunningBroker, tools: KafkaTools
) -> None:
    require_apis(
        broker,
        (*TOPICS_ADMIN, *PRODUCE, *GROUP_CONSUMER_APIS, ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS),
    )
    create_topic(tools, "ledger", 2)
    produce_keyed(tools, "ledger", [f"k{n}:v{n}" for n in range(10)])
    assert len(consume(tools, "ledger", "auditors", 10, "--from-beginning")) == 10
    produce_keyed(tools, "ledger", [f"k{n}:late{n}" for n in range(5)])

    assert "auditors" in tools.consumer_groups("--list").stdout.split()

    rows = describe_group(tools, "auditors")
    assert sorted(rows) == [0, 1]
    assert sum(current for current, _, _ in rows.values()) == 10
    assert sum(end for _, end, _ in rows.values()) == 15
    assert sum(lag for _, _, lag in rows.values()) == 5
    assert all(end - current == lag for current, end, lag in rows.values())

    planned = tools.consumer_groups(
        "--reset-offsets", "--group", "auditors", "--topic", "ledger", "--to-earliest", "--dry-run"
    )
    assert re.search(r"auditors\s+ledger\s+0\s+0\b", planned.stdout), planned.describe()
    assert sum(current for current, _, _ in describe_group(tools, "auditors").values()) == 10

    tools.consumer_groups(
        "--reset-offsets", "--group", "auditors", "--topic", "ledger", "--to-earliest", "--execute"
    )
    rows = describe_group(tools, "auditors")
    assert [current for current, _, _ in rows.values()] == [0, 0]
    assert sum(lag for _, _, lag in rows.values()) == 15
    assert len(consume(tools, "ledger", "auditors", 15)) == 15


def test_configs_describe_and_alter_topic_and_broker(
    broker: RunningBroker, tools: KafkaTools
) -> None:
    require_apis(broker, (*TOPICS_ADMIN, ApiKey.INCREMENTAL_ALTER_CONFIGS))
    create_topic(tools, "settings", 1)
    topic = ("--entity-type", "topics", "--entity-name", "settings")

    altered = tools.configs(
        "--alter", *topic, "--add-config", "retention.ms=86400000,max.message.bytes=2000000"
    )
    assert "Completed updating config for topic settings." in altered.stdout
    described = tools.configs("--describe", *topic).stdout
    assert "retention.ms=86400000" in described
    assert "max.message.bytes=2000000" in described

    tools.configs("--alter", *topic, "--delete-config", "retention.ms")
    described = tools.configs("--describe", *topic).stdout
    assert "retention.ms" not in described
    assert "max.message.bytes=2000000" in described

    unknown = tools.configs("--alter", *topic, "--add-config", "no.such.config=1", check=False)
    assert unknown.returncode != 0
    assert "Unknown topic config name: no.such.config" in unknown.stderr, unknown.describe()

    node = ("--entity-type", "brokers", "--entity-name", "1")
    altered = tools.configs("--alter", *node, "--add-config", "log.retention.ms=172800000")
    assert "Completed updating config for broker 1." in altered.stdout
    assert "log.retention.ms=172800000" in tools.configs("--describe", *node).stdout
    everything = tools.configs("--describe", *node, "--all").stdout
    assert re.search(r"^\s*node\.id=1 ", everything, re.MULTILINE), everything[:2000]


def test_delete_records_moves_the_log_start_offset(
    broker: RunningBroker, tools: KafkaTools, tmp_path: Path
) -> None:
    require_apis(broker, (*TOPICS_ADMIN, *PRODUCE, *GROUP_CONSUMER_APIS, ApiKey.DELETE_RECORDS))
    create_topic(tools, "trimmed", 1)
    produce_keyed(tools, "trimmed", [f"k:v{n}" for n in range(10)])
    offsets = tmp_path / "offsets.json"
    offsets.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": "trimmed", "partition": 0, "offset": 4}]}
        )
    )

    deleted = tools.delete_records("--offset-json-file", str(offsets))
    assert "partition: trimmed-0\tlow_watermark: 4" in deleted.stdout, deleted.describe()

    records = consume(tools, "trimmed", "after-trim", 6, "--from-beginning")
    assert records == [f"0|k|v{n}" for n in range(4, 10)]


def test_producer_perf_test_reports_every_record_acknowledged(
    broker: RunningBroker, tools: KafkaTools
) -> None:
    require_apis(broker, (*TOPICS_ADMIN, *PRODUCE, *GROUP_CONSUMER_APIS))
    create_topic(tools, "perf", 2)
    result = tools.producer_perf(
        "--topic",
        "perf",
        "--num-records",
        "2000",
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--command-property",
        "acks=all",
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("2000 records sent, "), result.describe()
    assert re.search(r"[\d.]+ ms 50th, [\d.]+ ms 95th, [\d.]+ ms 99th", summary), summary

    # kafka-consumer-perf-test reads every one of them back.
    consumed = tools.consumer_perf("--topic", "perf", "--num-records", "2000", "--timeout", "30000")
    header, row = consumed.stdout.strip().splitlines()[-2:]
    columns = dict(zip((c.strip() for c in header.split(",")), row.split(","), strict=True))
    assert int(columns["data.consumed.in.nMsg"]) == 2000, consumed.describe()
