"""The operator's Kafka client and `live_configs` against real brokers, Gregor's and Apache
Kafka's: it reads each broker's live configs (what it runs with, its per-broker value, its
file's), sets a changed one on every broker without a restart, sees the brokers apply it to
their topics, and deletes it once the spec drops it, naming the brokers still started with
it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource, ConfigSource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from gregor_operator.kafka import alter_broker_configs, broker_facts
from gregor_operator.live_configs import live_changes
from gregor_operator.observed import LiveConfig
from tests.integration.clients import QUIET
from tests.support.clusters import ThreeNodes, shared_three_nodes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAY = "86400000"
HOUR = "3600000"

cluster = shared_three_nodes({"log.retention.ms": DAY})


def configs(bootstrap: str) -> dict[int, dict[str, LiveConfig]]:
    facts = broker_facts(bootstrap)
    assert facts is not None
    assert set(facts.configs) == {1, 2, 3}, facts.configs
    return {node: dict(said) for node, said in facts.configs.items()}


def settled(bootstrap: str, key: str, wanted: LiveConfig) -> dict[int, dict[str, LiveConfig]]:
    """The configs once every broker says `key` is `wanted`: a broker takes a change as it
    replays the metadata log (Kafka's do so a moment after the answer)."""
    deadline = time.monotonic() + 20
    while True:
        found = configs(bootstrap)
        if all(said[key] == wanted for said in found.values()):
            return found
        assert time.monotonic() < deadline, {node: said[key] for node, said in found.items()}
        time.sleep(0.2)


def topic_retention(bootstrap: str, topic: str) -> tuple[str, Any]:
    """The topic's `retention.ms` and its source, as any broker answers: each learns of a new
    topic from its own copy of the metadata, so one may not know it yet for a moment."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    deadline = time.monotonic() + 20
    while True:
        try:
            answer = admin.describe_configs([resource], request_timeout=10)[resource].result(20)
            entry = answer["retention.ms"]
            return entry.value, entry.source
        except KafkaException as exc:
            unknown = exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            if not unknown or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def topic(cluster: ThreeNodes) -> Iterator[str]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
    name = "live-configs"
    admin.create_topics([NewTopic(name, 3, 3)], operation_timeout=10)[name].result(30)
    yield name
    admin.delete_topics([name], operation_timeout=10)[name].result(30)


def test_a_live_config_is_set_on_running_brokers_and_deleted_when_dropped(
    cluster: ThreeNodes, topic: str
) -> None:
    before = configs(cluster.bootstrap)
    for node in (1, 2, 3):
        assert before[node]["log.retention.ms"] == LiveConfig(DAY, None, DAY)
    assert topic_retention(cluster.bootstrap, topic) == (
        DAY,
        ConfigSource.STATIC_BROKER_CONFIG.value,
    )

    changes = live_changes({"log.retention.ms": HOUR}, before)
    assert changes.updates == {n: {"log.retention.ms": HOUR} for n in (1, 2, 3)}
    for node, update in changes.updates.items():
        alter_broker_configs(cluster.bootstrap, node, update)
    after = settled(cluster.bootstrap, "log.retention.ms", LiveConfig(HOUR, HOUR, DAY))
    assert live_changes({"log.retention.ms": HOUR}, after).updates == {}
    # The brokers apply it to their topics at once (a topic without its own retention).
    assert topic_retention(cluster.bootstrap, topic) == (
        HOUR,
        ConfigSource.DYNAMIC_BROKER_CONFIG.value,
    )

    dropped = live_changes({}, after)
    assert dropped.updates == {n: {"log.retention.ms": None} for n in (1, 2, 3)}
    assert dropped.stale == dict.fromkeys((1, 2, 3), ("log.retention.ms",))
    for node, update in dropped.updates.items():
        alter_broker_configs(cluster.bootstrap, node, update)
    settled(cluster.bootstrap, "log.retention.ms", LiveConfig(DAY, None, DAY))
