"""server.properties with Kafka's names: parsing, defaults, precedence, and errors that name
the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig, InvalidConfig, Listener, parse_properties


def test_java_properties_syntax() -> None:
    text = (
        "# comment\n! also a comment\n"
        "node.id=3\n"
        "log.dirs = /a,\\\n   /b\n"
        "broker.rack: eu-west-1a\n"
        "empty=\n"
    )
    assert parse_properties(text) == {
        "node.id": "3",
        "log.dirs": "/a,/b",
        "broker.rack": "eu-west-1a",
        "empty": "",
    }


def test_kafka_defaults() -> None:
    config = BrokerConfig.from_properties({})
    assert config.num_partitions == 1
    assert config.default_replication_factor == 1
    assert config.min_insync_replicas == 1
    assert config.auto_create_topics_enable is True
    assert config.offsets_topic_replication_factor == 3
    assert config.socket_request_max_bytes == 100 * 1024 * 1024
    assert config.connections_max_idle_ms == 600_000
    assert config.log.retention_ms == 7 * 24 * 3600 * 1000
    assert config.log.segment_bytes == 1024**3
    assert config.max_connections == config.max_connections_per_ip == 2**31 - 1
    assert config.queued_max_request_bytes == -1
    assert config.log_cleaner_enable is True
    assert config.log_cleaner_backoff_ms == 15_000
    assert config.log_cleaner_dedupe_buffer_size == 128 * 1024 * 1024


def test_admission_settings() -> None:
    config = BrokerConfig.from_properties(
        {
            "max.connections": "1000",
            "max.connections.per.ip": "100",
            "max.connections.per.ip.overrides": "10.0.0.1:5, [::1]:0",
            "queued.max.request.bytes": "67108864",
        }
    )
    assert config.max_connections == 1000
    assert config.max_connections_per_ip == 100
    assert config.max_connections_per_ip_overrides == {"10.0.0.1": 5, "::1": 0}
    assert config.queued_max_request_bytes == 64 * 1024 * 1024


def test_listeners_and_advertised_listeners() -> None:
    config = BrokerConfig.from_properties(
        {
            "listeners": "PLAINTEXT://:9092,INTERNAL://0.0.0.0:9093",
            "advertised.listeners": "PLAINTEXT://broker-0.kafka:9092",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT",
        }
    )
    assert config.listeners == (
        Listener("PLAINTEXT", "", 9092),
        Listener("INTERNAL", "0.0.0.0", 9093),
    )
    assert config.advertised == (Listener("PLAINTEXT", "broker-0.kafka", 9092),)


def test_broker_level_log_settings_become_topic_defaults_with_kafkas_precedence() -> None:
    config = BrokerConfig.from_properties(
        {"log.retention.ms": "1000", "log.retention.hours": "5", "log.segment.bytes": "4096"}
    )
    assert config.log.retention_ms == 1000
    assert config.log.segment_bytes == 4096
    assert BrokerConfig.from_properties({"log.retention.hours": "2"}).log.retention_ms == 7_200_000


@pytest.mark.parametrize(
    ("properties", "key"),
    [
        ({"num.partitions": "zero"}, "num.partitions"),
        ({"num.partitions": "0"}, "num.partitions"),
        ({"auto.create.topics.enable": "yes"}, "auto.create.topics.enable"),
        ({"process.roles": "worker"}, "process.roles"),
        ({"listeners": "localhost:9092"}, "listeners"),
        ({"listeners": "PLAINTEXT://:99999"}, "listeners"),
        ({"listeners": "SECRET://:9092"}, "listener.security.protocol.map"),
        ({"advertised.listeners": "OTHER://h:1"}, "advertised.listeners"),
        ({"controller.quorum.voters": "1@host"}, "controller.quorum.voters"),
        ({"node.id": "2", "controller.quorum.voters": "1@h:9093"}, "controller.quorum.voters"),
        ({"process.roles": "broker"}, "controller.quorum.voters"),
        (
            {"controller.quorum.voters": "1@h:9093,2@h:9094,3@h:9095"},
            "controller.listener.names",
        ),
        ({"process.roles": "controller"}, "controller.quorum.voters"),
        (
            {
                "process.roles": "controller",
                "controller.quorum.voters": "1@h:9093",
                "controller.listener.names": "CONTROLLER",
                "listeners": "CONTROLLER://:9093,PLAINTEXT://:9092",
            },
            "not on PLAINTEXT",
        ),
        (
            {
                "process.roles": "broker",
                "node.id": "4",
                "controller.quorum.voters": "1@h:9093",
                "listeners": "PLAINTEXT://:9092",
            },
            "controller.listener.names",
        ),
        (
            {
                "process.roles": "broker",
                "node.id": "4",
                "controller.quorum.voters": "1@h:9093",
                "controller.listener.names": "CONTROLLER",
                "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093",
            },
            "CONTROLLER is a controller listener",
        ),
        (
            {
                "listeners": "INTERNAL://:9092",
                "listener.security.protocol.map": "INTERNAL:PLAINTEXT",
            },
            "inter.broker.listener.name",
        ),
        ({"log.retention.hours": "soon"}, "log.retention.hours"),
        ({"log.cleanup.policy": "shred"}, "log.cleanup.policy"),
        ({"max.connections": "-1"}, "max.connections"),
        ({"max.connections.per.ip.overrides": "10.0.0.1"}, "max.connections.per.ip.overrides"),
        ({"queued.max.request.bytes": "0"}, "queued.max.request.bytes"),
        ({"log.cleaner.enable": "maybe"}, "log.cleaner.enable"),
        ({"log.cleaner.backoff.ms": "-5"}, "log.cleaner.backoff.ms"),
        ({"replica.selector.class": "com.example.Mine"}, "replica.selector.class"),
    ],
)
def test_invalid_values_name_the_key(properties: dict[str, str], key: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        BrokerConfig.from_properties(properties)
    assert key in str(caught.value)


def test_kafkas_two_replica_selectors_are_understood_by_name() -> None:
    rack_aware = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
    leader = "org.apache.kafka.common.replica.LeaderSelector"
    assert (
        BrokerConfig.from_properties({"replica.selector.class": rack_aware}).replica_selector_class
        == rack_aware
    )
    assert (
        BrokerConfig.from_properties({"replica.selector.class": leader}).replica_selector_class
        is None
    )
    assert BrokerConfig.from_properties({}).replica_selector_class is None


def test_dedicated_controllers_and_broker_only_nodes_are_valid() -> None:
    voters = {"controller.quorum.voters": "1@h:9093", "controller.listener.names": "CONTROLLER"}
    controller = BrokerConfig.from_properties(
        voters | {"process.roles": "controller", "listeners": "CONTROLLER://:9093"}
    )
    broker = BrokerConfig.from_properties(
        voters | {"process.roles": "broker", "node.id": "4", "listeners": "PLAINTEXT://:9092"}
    )
    assert controller.process_roles == frozenset({"controller"})
    assert broker.process_roles == frozenset({"broker"})


KAFKA_DEFAULT_MAP = "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT"
"""`listener.security.protocol.map` as Kafka 4.3 defaults it."""


@pytest.mark.parametrize("protocol", ["SSL", "SASL_PLAINTEXT", "SASL_SSL"])
def test_a_listener_on_a_protocol_gregor_does_not_serve_stops_the_node(protocol: str) -> None:
    protocols = f"PLAINTEXT:PLAINTEXT,EXTERNAL:{protocol},CONTROLLER:PLAINTEXT"
    with pytest.raises(InvalidConfig) as caught:
        BrokerConfig.from_properties(
            {
                "listeners": "PLAINTEXT://:9092,EXTERNAL://:9094",
                "listener.security.protocol.map": protocols,
            }
        )
    assert caught.value.key == "listener.security.protocol.map"
    assert str(caught.value) == (
        f"invalid value {protocols!r} for configuration listener.security.protocol.map: "
        f"listener EXTERNAL uses {protocol}, but Gregor serves only PLAINTEXT listeners so far "
        "(no TLS or SASL)"
    )


def test_a_listener_named_ssl_is_ssl_by_kafkas_default_map() -> None:
    with pytest.raises(InvalidConfig, match="listener SSL uses SSL") as caught:
        BrokerConfig.from_properties({"listeners": "PLAINTEXT://:9092,SSL://:9093"})
    assert caught.value.key == "listener.security.protocol.map"


def test_a_broker_reaching_its_controllers_over_tls_stops_the_node() -> None:
    with pytest.raises(InvalidConfig, match="listener CONTROLLER uses SSL") as caught:
        BrokerConfig.from_properties(
            {
                "process.roles": "broker",
                "node.id": "4",
                "controller.quorum.voters": "1@h:9093",
                "controller.listener.names": "CONTROLLER",
                "listeners": "PLAINTEXT://:9092",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL",
            }
        )
    assert caught.value.key == "listener.security.protocol.map"


def test_secure_entries_of_the_map_no_listener_uses_are_accepted() -> None:
    written = BrokerConfig.from_properties({"listener.security.protocol.map": KAFKA_DEFAULT_MAP})
    assert written.listener_security_protocol_map["SASL_SSL"] == "SASL_SSL"
    assert BrokerConfig.from_properties({}).listener_security_protocol_map["SSL"] == "SSL"


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("sasl.enabled.mechanisms", "PLAIN", "Gregor serves only PLAINTEXT listeners so far"),
        ("sasl.enabled.mechanisms", "GSSAPI", "Gregor serves only PLAINTEXT listeners so far"),
        ("listener.name.external.sasl.enabled.mechanisms", "SCRAM-SHA-512", "no TLS or SASL"),
        ("ssl.keystore.location", "/etc/kafka/broker.jks", "no TLS or SASL) and would ignore"),
        ("listener.name.external.ssl.keystore.location", "/etc/kafka/broker.jks", "no TLS"),
        ("ssl.truststore.location", "/etc/kafka/clients.jks", "no TLS or SASL"),
        ("ssl.client.auth", "required", "no TLS or SASL"),
        ("ssl.client.auth", "requested", "no TLS or SASL"),
        ("security.inter.broker.protocol", "SSL", "Gregor serves only PLAINTEXT listeners"),
        (
            "authorizer.class.name",
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "Gregor has no authorizer yet and would ignore it: every client may do everything",
        ),
        ("super.users", "User:admin", "Gregor has no authorizer yet"),
    ],
)
def test_a_security_setting_gregor_would_ignore_stops_the_node(
    key: str, value: str, reason: str
) -> None:
    with pytest.raises(InvalidConfig) as caught:
        BrokerConfig.from_properties({key: value})
    assert caught.value.key == key
    assert str(caught.value).startswith(f"invalid value {value!r} for configuration {key}: ")
    assert reason in str(caught.value)


def test_a_secret_security_setting_is_named_not_repeated() -> None:
    key = "listener.name.external.plain.sasl.jaas.config"
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required password="s3cret";'
    with pytest.raises(InvalidConfig) as caught:
        BrokerConfig.from_properties({key: jaas})
    assert str(caught.value).startswith(f"invalid value '[hidden]' for configuration {key}: ")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("sasl.enabled.mechanisms", ""),
        ("ssl.client.auth", "none"),
        ("ssl.client.auth", "NONE"),
        ("authorizer.class.name", ""),
        ("super.users", ""),
        ("security.inter.broker.protocol", "PLAINTEXT"),
        ("ssl.keystore.type", "PKCS12"),
        ("sasl.kerberos.min.time.before.relogin", "61000"),
    ],
)
def test_security_settings_that_ask_for_nothing_are_kept(key: str, value: str) -> None:
    assert BrokerConfig.from_properties({key: value}).extra == {key: value}


def test_unknown_names_are_kept_not_refused() -> None:
    config = BrokerConfig.from_properties({"num.network.threads": "8"})
    assert config.extra == {"num.network.threads": "8"}


def test_load_applies_overrides_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("node.id=1\nnum.partitions=3\n")
    config = BrokerConfig.load(path, {"num.partitions": "6"})
    assert (config.node_id, config.num_partitions) == (1, 6)
