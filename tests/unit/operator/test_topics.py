"""The topic planner's decisions that need no broker: what counts as drift, and what a
topic with nothing to change reports."""

from __future__ import annotations

from typing import Any

from gregor_operator.topics import (
    CreateTopic,
    KafkaTopic,
    SetConfigs,
    cluster_serves_topics,
    plan_topic,
)

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


def test_nothing_is_done_for_an_invalid_spec_or_a_cluster_not_ready() -> None:
    invalid = plan_topic(
        topic(1, None, config={"cleanup.policy": "shred"}), cluster_ready=True, found=None
    )
    assert invalid.actions == []
    assert invalid.conditions[0].reason == "InvalidSpec"
    assert "cleanup.policy" in invalid.conditions[0].message
    waiting = plan_topic(topic(1, None), cluster_ready=False, found=None)
    assert waiting.actions == []
    assert waiting.conditions[0].reason == "ClusterNotReady"
    assert waiting.requeue_after is not None
    orphan = plan_topic(topic(1, None), cluster_ready=None, found=None)
    assert orphan.conditions[0].reason == "ClusterNotFound"


def test_topics_are_served_while_the_cluster_rolls_and_wait_while_it_starts() -> None:
    def conditions(ready: str, reason: str, reconciling: str, why: str) -> list[dict[str, str]]:
        return [
            {"type": "Ready", "status": ready, "reason": reason},
            {"type": "Reconciling", "status": reconciling, "reason": why},
        ]

    assert cluster_serves_topics(conditions("True", "Ready", "False", "Reconciled"))
    rolling = conditions("False", "NodesNotReady", "True", "RollingRestart")
    assert cluster_serves_topics(rolling)
    starting = conditions("False", "NodesNotReady", "True", "NodesNotReady")
    assert not cluster_serves_topics(starting)
    down = conditions("False", "QuorumNotFormed", "True", "RollingRestart")
    assert not cluster_serves_topics(down)
    assert not cluster_serves_topics([])
