"""The topic planner's decisions that need no broker: what counts as drift, and what a
topic with nothing to change reports."""

from __future__ import annotations

from typing import Any

from gregor_operator.topics import CreateTopic, KafkaTopic, SetConfigs, plan_topic

FOUND = KafkaTopic("t-id", 6, 3, {"retention.ms": "1000"})


def topic(generation: int, observed: int | None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "orders", "generation": generation},
        "spec": {"cluster": "gregor"} | spec,
        "status": {"observedGeneration": observed},
    }


def test_a_new_generation_changes_configs_without_calling_it_drift() -> None:
    planned = plan_topic(
        topic(2, 1, config={"retention.ms": 2000}), cluster_ready=True, found=FOUND
    )
    assert planned.actions == [SetConfigs("orders", {"retention.ms": "2000"}, ())]
    assert not [e for e in planned.events if e[1] == "DriftCorrected"]


def test_the_same_generation_with_other_configs_in_kafka_is_drift() -> None:
    planned = plan_topic(topic(2, 2), cluster_ready=True, found=FOUND)
    assert planned.actions == [SetConfigs("orders", {}, ("retention.ms",))]
    (drift,) = [e for e in planned.events if e[1] == "DriftCorrected"]
    assert drift == (
        "Warning",
        "DriftCorrected",
        "orders had configs set outside Kubernetes, put back: retention.ms=1000",
    )


def test_unset_partitions_and_replicas_leave_them_to_the_broker() -> None:
    planned = plan_topic(topic(1, None), cluster_ready=True, found=None)
    assert planned.actions == [CreateTopic("orders", None, None, {})]
    settled = plan_topic(
        topic(1, 1, config={"retention.ms": 1000}), cluster_ready=True, found=FOUND
    )
    assert settled.actions == []
    assert settled.status == {
        "topicName": "orders",
        "topicId": "t-id",
        "partitions": 6,
        "replicas": 3,
        "config": {"retention.ms": "1000"},
    }
    assert settled.requeue_after is None
