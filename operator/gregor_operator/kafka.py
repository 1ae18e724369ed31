"""The operator's Kafka client: what a cluster's brokers say of themselves, through the Admin
API of a well-kept client library (confluent-kafka), never hand-written protocol.

What it owns: asking a cluster for the facts the planner weighs (which brokers are registered
and unfenced, how many partitions are under-replicated, what a node's HTTP listener says of
restarting nodes, each broker's live configs), the per-broker config changes `live_configs`
plans, and, for topics, the Admin calls a `Topic` needs. What it must never do: decide
anything, or block a reconciliation for long: every call has a short timeout, and a cluster
that does not answer is reported as unreachable.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import logging
import urllib.request
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

# Re-exported by confluent_kafka.admin without an __all__ the type checker reads.
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewPartitions, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from .live_configs import LIVE_PER_BROKER_CONFIGS
from .observed import BrokerFacts, LiveConfig, Verdict
from .topics import Action, AddPartitions, CreateTopic, KafkaTopic, SetConfigs

__all__ = [
    "TIMEOUT_S",
    "active_controller",
    "admin",
    "alter_broker_configs",
    "broker_facts",
    "carry_out",
    "delete_topic",
    "describe_topic",
    "restart_verdict",
]

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0
"""How long one Admin call may take before the cluster counts as unreachable."""


def admin(bootstrap: str) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.timeout.ms": int(TIMEOUT_S * 1000),
            "client.id": "gregor-operator",
            # A cluster that does not answer is reported once per reconciliation by the
            # caller; librdkafka would say so every 50 ms.
            "log_level": 2,
        }
    )


def broker_facts(bootstrap: str) -> BrokerFacts | None:
    """The brokers that are registered and unfenced (a KRaft cluster describes only those),
    and how many partitions have fewer in-sync replicas than replicas; None when the cluster
    does not answer within TIMEOUT_S."""
    client = admin(bootstrap)
    try:
        described: Any = client.describe_cluster(request_timeout=TIMEOUT_S).result(
            timeout=TIMEOUT_S * 2
        )
        metadata = client.list_topics(timeout=TIMEOUT_S)
    except Exception as exc:  # the client raises KafkaException or a timeout, both mean "no"
        log.info("cluster at %s did not answer: %s", bootstrap, exc)
        return None
    under = sum(
        1
        for topic in metadata.topics.values()
        for partition in topic.partitions.values()
        if len(partition.isrs) < len(partition.replicas)
    )
    brokers = sorted(int(node.id) for node in described.nodes)
    return BrokerFacts(
        brokers=dict.fromkeys(brokers, "Unfenced"),
        under_replicated=under,
        active_controller=None,
        configs=_live_configs(client, brokers),
    )


def _live_configs(client: AdminClient, brokers: list[int]) -> dict[int, dict[str, LiveConfig]]:
    """Each broker's live configs (`live_configs`) as its DescribeConfigs says them: what it
    runs with, its per-broker value, its file's value. Empty when any broker does not say."""
    if not brokers:
        return {}
    try:
        # librdkafka takes one broker resource per call: all are sent, then awaited.
        futures = {
            node: client.describe_configs(
                [ConfigResource(ResourceType.BROKER, str(node))], request_timeout=TIMEOUT_S
            )
            for node in brokers
        }
        answers = {node: _result(asked) for node, asked in futures.items()}
    except Exception as exc:  # KafkaException or a timeout: the configs are not compared
        log.info("the brokers' configs could not be read: %s", exc)
        return {}
    found: dict[int, dict[str, LiveConfig]] = {}
    for node, entries in answers.items():
        found[node] = {}
        for name in LIVE_PER_BROKER_CONFIGS & set(entries):
            entry = entries[name]
            levels = [(entry.name, entry.value, entry.source)] + [
                (s.name, s.value, s.source) for s in (entry.synonyms or {}).values()
            ]
            found[node][name] = LiveConfig(
                value=entry.value,
                dynamic=_level(levels, name, ConfigSource.DYNAMIC_BROKER_CONFIG),
                static=_level(levels, name, ConfigSource.STATIC_BROKER_CONFIG),
            )
    return found


def _level(
    levels: list[tuple[str, str | None, int]], name: str, source: ConfigSource
) -> str | None:
    """The value `name` itself has at `source`, among an entry's own level and synonyms."""
    return next((v for n, v, s in levels if n == name and s == source.value), None)


def alter_broker_configs(bootstrap: str, node: int, changes: Mapping[str, str | None]) -> None:
    """Set (None: delete) configs for one broker alone (IncrementalAlterConfigs on `BROKER
    <node>`); raises what Kafka answers."""
    entries = [
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
        if value is not None
        else ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE)
        for key, value in sorted(changes.items())
    ]
    resource = ConfigResource(ResourceType.BROKER, str(node), incremental_configs=entries)
    client = admin(bootstrap)  # held until the answer: a client collected drops its requests
    _result(client.incremental_alter_configs([resource], request_timeout=TIMEOUT_S))


METRICS_TIMEOUT_S = 2.0
ACTIVE_CONTROLLER_METRIC = "kafka_controller_kafkacontroller_activecontrollercount"
"""1 on the quorum's leader, 0 on the other voters (Kafka's ActiveControllerCount)."""


def active_controller(voters: Mapping[str, str]) -> str | None:
    """Which of the voters (pod name → `host:port` of its metrics) leads the quorum, as each
    one's metrics say; None when none says so or they cannot be asked. The Admin API cannot
    tell: a KRaft cluster's Metadata names a random broker as its controller (KIP-590). The
    voters are asked at once, so an unreachable one costs one timeout, not one each."""
    if not voters:
        return None
    with concurrent.futures.ThreadPoolExecutor(len(voters)) as pool:
        leading = pool.map(_leads, sorted(voters.items()))
        found = [pod for pod, leads in zip(sorted(voters), leading, strict=True) if leads]
    return found[0] if found else None


def _leads(voter: tuple[str, str]) -> bool:
    pod, address = voter
    url = f"http://{address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as response:
            text = response.read().decode()
        families = list(text_string_to_metric_families(text))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        log.info("could not read %s's metrics at %s: %s", pod, url, exc)
        return False
    return any(
        family.name == ACTIVE_CONTROLLER_METRIC and any(s.value == 1 for s in family.samples)
        for family in families
    )


def restart_verdict(address: str, nodes: tuple[int, ...]) -> Verdict | None:
    """What the node whose HTTP listener is at `address` (`host:port`) says of stopping
    `nodes` together (`/v1/restart-verdict`); None when it cannot be asked or does not say
    (a node that is not running answers 503)."""
    query = ",".join(map(str, nodes))
    url = f"http://{address}/v1/restart-verdict?nodes={query}"
    try:
        with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as response:
            answer = json.loads(response.read())
        quorum = answer.get("quorum") or {}
        return Verdict(
            nodes=tuple(int(n) for n in answer["nodes"]),
            safe=bool(answer["safe"]),
            blocking=tuple(
                f"{p['topic']}-{p['partition']} ({p['rule']}: {p['reason']})"
                for p in answer.get("partitions", [])
            ),
            quorum_risk=quorum.get("risk"),
            judged_quorum=bool(quorum.get("judged", True)),
        )
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
        log.info("could not read the restart verdict at %s: %s", url, exc)
        return None


def _result(futures: dict[Any, Any]) -> Any:
    (future,) = futures.values()
    return future.result(timeout=TIMEOUT_S * 2)


def describe_topic(client: AdminClient, name: str) -> KafkaTopic | None:
    """The topic as Kafka has it; None if it does not exist."""
    try:
        description = _result(
            client.describe_topics(TopicCollection([name]), request_timeout=TIMEOUT_S)
        )
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise
    entries = _result(
        client.describe_configs(
            [ConfigResource(ResourceType.TOPIC, name)], request_timeout=TIMEOUT_S
        )
    )
    partitions = description.partitions
    return KafkaTopic(
        topic_id=str(description.topic_id),
        partitions=len(partitions),
        replicas=len(partitions[0].replicas) if partitions else 0,
        configs={
            entry.name: entry.value
            for entry in entries.values()
            if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value and entry.value is not None
        },
    )


def carry_out(client: AdminClient, action: Action) -> None:
    """One of the topic planner's actions, through the Admin API; raises what Kafka answers."""
    if isinstance(action, CreateTopic):
        new = NewTopic(
            action.name,
            num_partitions=action.partitions or -1,
            replication_factor=action.replicas or -1,
            config=dict(action.configs),
        )
        _result(client.create_topics([new], request_timeout=TIMEOUT_S))
    elif isinstance(action, AddPartitions):
        _result(
            client.create_partitions(
                [NewPartitions(action.name, action.total)], request_timeout=TIMEOUT_S
            )
        )
    elif isinstance(action, SetConfigs):
        changes = [
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
            for key, value in action.set.items()
        ] + [
            ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE)
            for key in action.delete
        ]
        resource = ConfigResource(ResourceType.TOPIC, action.name, incremental_configs=changes)
        _result(client.incremental_alter_configs([resource], request_timeout=TIMEOUT_S))


def delete_topic(client: AdminClient, name: str) -> None:
    """Delete the topic; one already gone is fine."""
    try:
        _result(client.delete_topics([name], request_timeout=TIMEOUT_S))
    except KafkaException as exc:
        if not (exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise
