"""The operator's topic reconciliation against a real Gregor node, through confluent-kafka's
Admin client: a `Topic` is created as written, an existing topic is adopted, partitions grow,
configs set outside Kubernetes are put back, a decrease is refused, and deletion deletes.
What needs no broker is in tests/unit/operator/test_topics.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from gregor_operator.kafka import admin, broker_facts, carry_out, delete_topic, describe_topic
from gregor_operator.topics import AddPartitions, SetConfigs, TopicPlan, plan_topic
from tests.integration.clients import create_topic
from tests.support.nodes import run_node


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with run_node(tmp_path_factory.mktemp("operator-topics")) as node:
        yield node.bootstrap


@pytest.fixture
def client(bootstrap: str) -> AdminClient:
    return admin(bootstrap)


def resource(
    name: str, generation: int = 1, observed: int | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": generation},
        "spec": {"cluster": "gregor"} | spec,
        "status": {"observedGeneration": observed} if observed else None,
    }


def reconcile(client: AdminClient, document: dict[str, Any]) -> TopicPlan:
    """What the handler does: describe, plan, carry out."""
    found = describe_topic(
        client, document["spec"].get("topicName") or document["metadata"]["name"]
    )
    planned = plan_topic(document, cluster_ready=True, found=found)
    for action in planned.actions:
        carry_out(client, action)
    return planned


def test_the_brokers_facts_say_who_is_unfenced(bootstrap: str) -> None:
    facts = broker_facts(bootstrap)
    assert facts is not None
    assert facts.brokers == {1: "Unfenced"}
    assert facts.under_replicated == 0
    assert broker_facts("127.0.0.1:1") is None


def test_a_topic_is_created_as_written_and_then_left_alone(client: AdminClient) -> None:
    document = resource(
        "orders",
        partitions=3,
        replicas=1,
        config={"retention.ms": 3_600_000, "cleanup.policy": "compact"},
    )
    first = reconcile(client, document)
    assert [type(a).__name__ for a in first.actions] == ["CreateTopic"]
    found = describe_topic(client, "orders")
    assert found is not None
    assert (found.partitions, found.replicas) == (3, 1)
    assert found.configs == {"retention.ms": "3600000", "cleanup.policy": "compact"}
    second = reconcile(client, document)
    assert second.actions == []
    assert second.status["topicId"] == found.topic_id
    assert [(c.type, c.status) for c in second.conditions] == [
        ("Ready", "True"),
        ("Reconciling", "False"),
    ]


def test_an_existing_topic_is_adopted_and_brought_to_the_spec(
    client: AdminClient, bootstrap: str
) -> None:
    create_topic(bootstrap, "payments", 2, **{"retention.ms": "1000"})
    before = describe_topic(client, "payments")
    assert before is not None
    planned = reconcile(
        client, resource("payments", partitions=4, config={"segment.bytes": 1_048_576})
    )
    assert planned.actions == [
        AddPartitions("payments", 4),
        SetConfigs("payments", {"segment.bytes": "1048576"}, ("retention.ms",)),
    ]
    after = describe_topic(client, "payments")
    assert after is not None
    assert after.topic_id == before.topic_id  # adopted, not recreated
    assert after.partitions == 4
    assert after.configs == {"segment.bytes": "1048576"}


def test_a_config_changed_outside_kubernetes_is_reported_and_put_back(client: AdminClient) -> None:
    document = resource("audit", partitions=1, config={"retention.ms": 86_400_000})
    reconcile(client, document)
    carry_out(
        client, SetConfigs("audit", {"retention.ms": "60000", "max.message.bytes": "2048"}, ())
    )
    handled = resource(
        "audit", generation=1, observed=1, partitions=1, config={"retention.ms": 86_400_000}
    )
    planned = reconcile(client, handled)
    (event,) = [e for e in planned.events if e[1] == "DriftCorrected"]
    assert "retention.ms=60000" in event[2]
    assert "max.message.bytes=2048" in event[2]
    found = describe_topic(client, "audit")
    assert found is not None
    assert found.configs == {"retention.ms": "86400000"}


def test_fewer_partitions_or_another_replication_factor_is_refused(client: AdminClient) -> None:
    reconcile(client, resource("events", partitions=3))
    planned = reconcile(client, resource("events", partitions=2, replicas=3))
    assert planned.actions == []
    ready = planned.conditions[0]
    assert (ready.status, ready.reason) == ("False", "PartitionDecreaseNotSupported")
    assert "keeps 3 partitions" in ready.message
    assert "keeps replication factor 1" in ready.message
    found = describe_topic(client, "events")
    assert found is not None
    assert found.partitions == 3


def test_deletion_deletes_and_a_topic_already_gone_is_fine(client: AdminClient) -> None:
    reconcile(client, resource("scratch", partitions=1))
    delete_topic(client, "scratch")
    delete_topic(client, "scratch")  # already gone is fine
    assert describe_topic(client, "scratch") is None


def test_the_topic_name_in_the_spec_wins_over_the_resources(client: AdminClient) -> None:
    reconcile(client, resource("orders-v2", topicName="Orders_V2", partitions=1))
    assert describe_topic(client, "Orders_V2") is not None
    assert describe_topic(client, "orders-v2") is None
