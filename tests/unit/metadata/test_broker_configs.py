"""The broker config table and the rules that read it: every row is well formed and its default
passes its own checks; updates are refused in Kafka's order and words; DescribeConfigs' values,
sources and synonyms resolve as Kafka resolves them; the node's own defaults agree with
Kafka's wherever Gregor does not say otherwise."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.metadata.broker_configs import (
    BROKER_CONFIGS,
    CLUSTER_LEVEL_LISTENER_CONFIGS,
    LISTED_ONLY_WHEN_SET,
    LISTENER_ONLY_SECURITY_CONFIGS,
    DescribedConfig,
    UpdateMode,
    describe_broker,
    describe_cluster_default,
    invalid_broker_update,
    invalid_value,
)
from broker.metadata.configs import TOPIC_CONFIGS, ConfigSource, ConfigType
from broker.storage.config import LogConfig

DEFAULTS = {name: d.default for name, d in BROKER_CONFIGS.items()}

GREGOR_OWN_DEFAULTS = {
    "process.roles": "Kafka requires it; Gregor runs combined for `make run`",
    "node.id": "Kafka requires it; Gregor defaults to 1",
    "broker.id": "follows node.id, as in Kafka's KRaft mode",
    "advertised.listeners": "Kafka's null means the listeners; Gregor shows them",
    "listener.security.protocol.map": "Gregor maps CONTROLLER to PLAINTEXT without being told",
    "inter.broker.listener.name": "Kafka's null means PLAINTEXT; Gregor shows it",
    "controller.listener.names": "empty rather than null: the node runs with no such listener",
    "log.dirs": "Kafka's null means log.dir; Gregor shows the directory it uses",
}
"""Names whose value on a node that sets nothing differs from Kafka's default, and why."""


def test_every_row_is_well_formed_and_its_default_passes_its_own_checks() -> None:
    assert len(BROKER_CONFIGS) == 343
    for name, definition in BROKER_CONFIGS.items():
        assert definition.name == name
        if definition.default is not None and definition.type is not ConfigType.PASSWORD:
            assert invalid_value(definition, definition.default) is None, name


def test_the_update_modes_kafka_documents() -> None:
    modes = [d.mode for d in BROKER_CONFIGS.values()]
    assert modes.count(UpdateMode.READ_ONLY) == 241
    assert modes.count(UpdateMode.PER_BROKER) == 37
    assert modes.count(UpdateMode.CLUSTER_WIDE) == 65
    for name in LISTENER_ONLY_SECURITY_CONFIGS | CLUSTER_LEVEL_LISTENER_CONFIGS:
        assert BROKER_CONFIGS[name].dynamic, name
    for name in LISTED_ONLY_WHEN_SET:
        assert BROKER_CONFIGS[name].mode is UpdateMode.CLUSTER_WIDE


def test_every_topic_default_a_broker_provides_is_a_dynamic_broker_config() -> None:
    for topic in TOPIC_CONFIGS.values():
        if topic.broker_name is not None:
            row = BROKER_CONFIGS[topic.broker_name]
            assert row.mode is UpdateMode.CLUSTER_WIDE, topic.broker_name
            assert row.default in (topic.default, None), topic.broker_name


def test_gregor_runs_with_kafkas_defaults_except_where_it_says_why() -> None:
    ours = BrokerConfig().kafka_values()
    differing = {name for name, value in ours.items() if value != DEFAULTS[name]}
    assert differing == set(GREGOR_OWN_DEFAULTS)
    storage = LogConfig.from_properties({})
    assert str(storage.segment_bytes) == DEFAULTS["log.segment.bytes"]
    assert str(storage.retention_bytes) == DEFAULTS["log.retention.bytes"]


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("log.retention.ms", "two days", "Not a number of type LONG"),
        ("log.retention.ms", "9223372036854775808", "Not a number of type LONG"),
        ("max.connections", "2147483648", "Not a number of type INT"),
        ("max.connections", "-5", "Value must be at least 0"),
        ("sasl.login.refresh.buffer.seconds", "40000", "Not a number of type SHORT"),
        ("log.preallocate", "yes", "Expected value to be either true or false"),
        ("log.cleaner.min.cleanable.ratio", "1.5", "Value must be no more than 1"),
        ("log.cleaner.min.cleanable.ratio", "half", "Not a number of type DOUBLE"),
        ("compression.gzip.level", "42", "Value must be between 1 and 9 or equal to -1"),
        ("compression.type", "brotli", "String must be one of: uncompressed, zstd, lz4, "),
        ("log.cleanup.policy", "compact,archive", "String must be one of: compact, delete"),
    ],
)
def test_values_are_checked_by_type_and_range_as_kafka_checks_them(
    name: str, value: str, problem: str
) -> None:
    found = invalid_value(BROKER_CONFIGS[name], value)
    assert found is not None
    assert found.startswith(problem)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("log.cleaner.io.max.bytes.per.second", "1e6"),
        ("compression.gzip.level", "-1"),
        ("log.cleanup.policy", "compact,delete"),
        ("log.preallocate", "TRUE"),
        ("sasl.kerberos.min.time.before.relogin", " 61000 "),
    ],
)
def test_values_kafka_accepts(name: str, value: str) -> None:
    assert invalid_value(BROKER_CONFIGS[name], value) is None


@pytest.mark.parametrize(
    ("configs", "per_broker", "message"),
    [
        ({"log.dirs": "/x", "node.id": "2"}, True, "Cannot update these configs dynamically: "),
        ({"ssl.keystore.location": "/k"}, True, "These security configs can be dynamically "),
        ({"log.retention.ms": "x"}, False, "Invalid value x for configuration log.retention.ms"),
        ({"sasl.kerberos.min.time.before.relogin": "1"}, False, "Cannot update these configs "),
        ({"listener.name.external.ssl.keystore.type": "PKCS12"}, False, "Cannot update these "),
        ({"listener.name.external.max.connections": "x"}, False, "Invalid value x for "),
        # Kafka's order: a fixed name is reported before a bad value beside it.
        ({"node.id": "2", "max.connections": "x"}, True, "Cannot update these configs dyn"),
    ],
)
def test_updates_are_refused_in_kafkas_order_and_words(
    configs: dict[str, str | None], per_broker: bool, message: str
) -> None:
    refused = invalid_broker_update(configs, per_broker=per_broker)
    assert refused is not None
    assert refused.startswith(message)


def test_refused_names_are_listed_as_kafka_lists_a_set() -> None:
    refused = invalid_broker_update({"node.id": "2", "log.dirs": "/x"}, per_broker=True)
    assert refused == "Cannot update these configs dynamically: [log.dirs, node.id]"


@pytest.mark.parametrize(
    ("configs", "per_broker"),
    [
        ({"sasl.kerberos.min.time.before.relogin": "61000"}, True),
        ({"listener.name.external.ssl.keystore.type": "PKCS12"}, True),
        ({"listener.name.external.max.connections": "10"}, False),
        ({"num.io.threads": "4", "log.retention.ms": "1000"}, False),
        ({"a.plugin.setting": "anything"}, False),
        ({"node.id": None}, True),
    ],
)
def test_updates_kafka_accepts(configs: dict[str, str | None], per_broker: bool) -> None:
    assert invalid_broker_update(configs, per_broker=per_broker) is None


def _described(
    broker: dict[str, str], cluster: dict[str, str], static: dict[str, str]
) -> dict[str, DescribedConfig]:
    return {d.name: d for d in describe_broker(broker, cluster, static, DEFAULTS)}


def test_a_value_resolves_from_the_most_specific_level_with_every_level_as_a_synonym() -> None:
    entries = _described({"num.io.threads": "6"}, {"num.io.threads": "4"}, {"num.io.threads": "2"})
    threads = entries["num.io.threads"]
    assert threads.value == "6"
    assert threads.source == ConfigSource.DYNAMIC_BROKER_CONFIG
    assert threads.synonyms == (
        ("num.io.threads", "6", ConfigSource.DYNAMIC_BROKER_CONFIG),
        ("num.io.threads", "4", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("num.io.threads", "2", ConfigSource.STATIC_BROKER_CONFIG),
        ("num.io.threads", "8", ConfigSource.DEFAULT_CONFIG),
    )


def test_retention_lists_its_hours_under_it_only_once_set_itself_as_kafka_does() -> None:
    static = {"log.retention.hours": "100"}
    unset = _described({}, {}, static)["log.retention.ms"]
    assert (unset.value, unset.source, unset.synonyms) == (
        None,
        ConfigSource.DEFAULT_CONFIG,
        (),
    )
    dynamic = _described({"log.retention.ms": "1000"}, {}, static)["log.retention.ms"]
    assert dynamic.synonyms == (
        ("log.retention.ms", "1000", ConfigSource.DYNAMIC_BROKER_CONFIG),
        ("log.retention.hours", "100", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG),
    )


def test_passwords_are_never_shown() -> None:
    entries = _described(
        {"listener.name.external.ssl.key.password": "p"}, {}, {"ssl.key.password": "secret"}
    )
    password = entries["ssl.key.password"]
    assert password.value is None
    assert password.sensitive
    assert password.synonyms == (("ssl.key.password", None, ConfigSource.STATIC_BROKER_CONFIG),)
    default = describe_cluster_default({"listener.name.external.ssl.key.password": "p"})
    assert [(d.name, d.value, d.sensitive) for d in default] == [
        ("listener.name.external.ssl.key.password", None, True)
    ]


def test_which_names_a_broker_lists() -> None:
    entries = _described(
        {"a.plugin.setting": "1"}, {"leader.replication.throttled.rate": "1000"}, {"x.y": "z"}
    )
    assert set(BROKER_CONFIGS) - set(entries) == LISTED_ONLY_WHEN_SET - {
        "leader.replication.throttled.rate"
    }
    assert "a.plugin.setting" not in entries
    unknown = entries["x.y"]
    assert (unknown.type, unknown.read_only, unknown.doc) == (0, True, None)
