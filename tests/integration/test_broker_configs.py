"""Broker configs as a real client sees them, Gregor beside Apache Kafka 4.3.1 in the same run:
DescribeConfigs of a broker lists every config Kafka lists, with the node's own values and
their sources; dynamic updates Kafka accepts (per broker and as every broker's default) are
accepted, shown as dynamic and kept across a restart; the ones Kafka refuses are refused with
Kafka's error code and words; a dynamic connection limit takes effect on the running node."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)

from tests.integration.clients import admin_client
from tests.support.kafka_dist import KafkaBroker, KafkaTools, run_kafka
from tests.support.nodes import run_node, start_node
from tests.support.wire import API_VERSIONS, exchange

pytestmark = pytest.mark.slow

STATIC = {"log.retention.hours": "100", "max.connections": "500"}
"""Set in both brokers' `server.properties`: reported as STATIC_BROKER_CONFIG by both."""

PER_BROKER = {
    "sasl.kerberos.min.time.before.relogin": "61000",
    "ssl.client.auth": "requested",
    "log.cleaner.threads": "2",
    "log.retention.ms": "172800000",
}
"""Dynamic configs Kafka accepts for one broker (the first two only for one broker)."""

CLUSTER_DEFAULT = {
    "num.io.threads": "4",
    "background.threads": "5",
    "log.cleaner.io.max.bytes.per.second": "1000000.0",
    "compression.gzip.level": "5",
}
"""Dynamic configs Kafka accepts as every broker's default."""

INVALID_REQUEST = "org.apache.kafka.common.errors.InvalidRequestException: "

REFUSED: list[tuple[str, dict[str, str]]] = [
    ("1", {"log.dirs": "/elsewhere"}),
    ("1", {"node.id": "7"}),
    ("", {"process.roles": "broker"}),
    ("1", {"advertised.listeners": "PLAINTEXT://elsewhere:9092"}),
    ("", {"sasl.kerberos.min.time.before.relogin": "61000"}),
    ("1", {"ssl.keystore.location": "/etc/keystore.jks"}),
    ("1", {"log.retention.ms": "two days"}),
    ("1", {"max.connections": "-5"}),
    ("", {"compression.gzip.level": "42"}),
    ("1", {"log.cleanup.policy": "archive"}),
]
"""(broker, configs) Kafka refuses: not dynamic, per-broker only at the cluster level, security
configs without a listener prefix, values of the wrong type or range."""


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    with run_kafka(tmp_path_factory.mktemp("kafka"), STATIC) as running:
        yield running


def _describe(admin: AdminClient, broker: str) -> dict[str, Any]:
    resource = ConfigResource(ConfigResource.Type.BROKER, broker)
    return dict(admin.describe_configs([resource])[resource].result(30))


def _alter(admin: AdminClient, broker: str, configs: dict[str, str]) -> KafkaError | None:
    """IncrementalAlterConfigs SET of `configs` on broker `broker`: None if accepted, else the
    broker's error."""
    resource = ConfigResource(
        ConfigResource.Type.BROKER,
        broker,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in configs.items()
        ],
    )
    try:
        admin.incremental_alter_configs([resource])[resource].result(30)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return error
    return None


def _alter_default(bootstrap: str, configs: dict[str, str], *, delete: bool = False) -> str | None:
    """kafka-configs --alter --entity-default (librdkafka refuses an empty broker name): None
    if accepted, else the error line the tool printed."""
    change = (
        ("--delete-config", ",".join(configs))
        if delete
        else ("--add-config", ",".join(f"{k}={v}" for k, v in configs.items()))
    )
    result = KafkaTools(bootstrap).configs(
        "--alter", "--entity-type", "brokers", "--entity-default", *change, check=False
    )
    if result.returncode == 0:
        assert "Completed updating default config for brokers in the cluster." in result.stdout
        return None
    errors = [line for line in result.stderr.splitlines() if "Exception: " in line]
    assert errors, result.describe()
    return errors[0][errors[0].index("org.apache.kafka") :]


def _describe_default(bootstrap: str) -> dict[str, str]:
    """kafka-configs --describe --entity-default: name -> value of every broker's defaults."""
    out = (
        KafkaTools(bootstrap)
        .configs("--describe", "--entity-type", "brokers", "--entity-default")
        .stdout
    )
    found = re.findall(r"^\s+([a-z0-9.]+)=(\S*) sensitive=", out, re.MULTILINE)
    return dict(found)


def test_a_broker_lists_every_config_kafka_lists_with_the_values_it_runs_with(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    expected = _describe(admin_client(kafka.bootstrap), "1")
    with run_node(tmp_path, STATIC) as node:
        described = _describe(admin_client(node.bootstrap), "1")
    # Nothing is left out: every name a Kafka 4.3.1 broker lists.
    assert set(expected) - set(described) == set()
    for name, entry in expected.items():
        ours = described[name]
        kind = (ours.is_read_only, ours.is_sensitive)
        assert kind == (entry.is_read_only, entry.is_sensitive), name
        if entry.is_sensitive:
            assert ours.value is None, name
    for name, value in STATIC.items():
        assert described[name].value == value
        assert described[name].source == ConfigSource.STATIC_BROKER_CONFIG.value
        assert expected[name].source == ConfigSource.STATIC_BROKER_CONFIG.value
    # The node's server.properties names no advertised.listeners: the listeners it derived.
    advertised = described["advertised.listeners"]
    assert advertised.value == f"PLAINTEXT://localhost:{node.port}"
    assert advertised.source == ConfigSource.DEFAULT_CONFIG.value
    assert described["listeners"].value == f"PLAINTEXT://localhost:{node.port}"
    assert described["listeners"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert described["node.id"].value == "1"
    assert described["log.dirs"].value == str(tmp_path / "logs")
    assert described["socket.request.max.bytes"].value == "104857600"
    # log.retention.ms is unset (null) while the hours decide, as Kafka shows it; the hours
    # list their synonyms as Kafka does.
    assert described["log.retention.ms"].value is None
    assert expected["log.retention.ms"].value is None
    for name in ("log.retention.ms", "log.retention.hours", "max.connections"):
        ours, theirs = described[name].synonyms, expected[name].synonyms
        assert [(s.name, s.value, s.source) for s in ours.values()] == [
            (s.name, s.value, s.source) for s in theirs.values()
        ], name


def test_dynamic_configs_kafka_accepts_are_accepted_shown_and_kept_across_a_restart(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    reference = admin_client(kafka.bootstrap)
    assert _alter(reference, "1", PER_BROKER) is None
    assert _alter_default(kafka.bootstrap, CLUSTER_DEFAULT) is None

    node = start_node(tmp_path)
    try:
        admin = admin_client(node.bootstrap)
        assert _alter(admin, "1", PER_BROKER) is None
        assert _alter_default(node.bootstrap, CLUSTER_DEFAULT) is None
        for described in (_describe(admin, "1"), _describe(reference, "1")):
            for name, value in PER_BROKER.items():
                assert (described[name].value, described[name].source) == (
                    value,
                    ConfigSource.DYNAMIC_BROKER_CONFIG.value,
                ), name
            for name, value in CLUSTER_DEFAULT.items():
                assert (described[name].value, described[name].source) == (
                    value,
                    ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value,
                ), name
        ours = _describe_default(node.bootstrap)
        assert ours == {k: v for k, v in _describe_default(kafka.bootstrap).items() if k in ours}
        assert ours == CLUSTER_DEFAULT
    finally:
        assert node.stop() == 0
    node = start_node(tmp_path)
    try:
        described = _describe(admin_client(node.bootstrap), "1")
        for name, value in PER_BROKER.items():
            assert described[name].value == value, name
            assert described[name].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        for name, value in CLUSTER_DEFAULT.items():
            assert described[name].value == value, name
            assert described[name].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    finally:
        assert node.stop() == 0


def test_configs_kafka_refuses_dynamically_are_refused_in_kafkas_words(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    reference = admin_client(kafka.bootstrap)
    with run_node(tmp_path) as node:
        admin = admin_client(node.bootstrap)
        for broker, configs in REFUSED:
            if broker:
                theirs = _alter(reference, broker, configs)
                ours = _alter(admin, broker, configs)
                assert theirs is not None, (broker, configs)
                assert ours is not None, (broker, configs)
                assert ours.code() == theirs.code() == KafkaError.INVALID_REQUEST, configs
                assert ours.str() == theirs.str(), (broker, configs)
            else:
                their_line = _alter_default(kafka.bootstrap, configs)
                our_line = _alter_default(node.bootstrap, configs)
                assert their_line is not None, configs
                assert their_line.startswith(INVALID_REQUEST), their_line
                assert our_line == their_line, configs
        described = _describe(admin, "1")
        assert described["log.dirs"].value == str(tmp_path / "logs")
        assert described["log.retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def _served(port: int, source: str) -> bool:
    """Whether a new connection from `source` is served: its ApiVersions answered (True) or
    the connection closed (False; one over a limit is closed at once, never left silent).
    Both are events seen on the connection, so no wait decides it: a broker that neither
    answers nor closes within 10 s fails the test with TimeoutError."""
    with socket.socket() as sock:
        sock.bind((source, 0))
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        try:
            return exchange(sock, API_VERSIONS) is not None
        except ConnectionError:  # reset, or a broken pipe on sending
            return False


def test_a_dynamic_connection_limit_applies_to_the_running_node(tmp_path: Path) -> None:
    """An override for 127.0.0.2 closes its connections while others' carry on; deleting it
    lets them in again."""
    with run_node(tmp_path) as node:
        assert _served(node.port, "127.0.0.2")
        overrides = {"max.connections.per.ip.overrides": "127.0.0.2:0"}
        assert _alter_default(node.bootstrap, overrides) is None
        assert not _served(node.port, "127.0.0.2")
        assert _served(node.port, "127.0.0.3")
        assert _alter_default(node.bootstrap, overrides, delete=True) is None
        assert _served(node.port, "127.0.0.2")
