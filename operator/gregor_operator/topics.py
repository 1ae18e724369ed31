"""The topic planner: what to do in Kafka for a `Topic`, from its spec and what Kafka has.

What it owns: every decision of a topic's reconciliation. A topic that does not exist is
created; one that exists (made by a client, or before the resource) is adopted, not
recreated; partitions may grow; configs are set to what the spec says, and a config set
outside Kubernetes is reported and put back. A decrease of partitions or a change of the
replication factor is refused with a condition that says why (moving replicas is the
day-2 work). It is pure, like the cluster's planner. What it must never do: call Kafka or
Kubernetes, or act on an invalid spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from .models import Topic, problems
from .planner import ConditionState

__all__ = [
    "Action",
    "AddPartitions",
    "CreateTopic",
    "KafkaTopic",
    "SetConfigs",
    "TopicPlan",
    "cluster_serves_topics",
    "plan_topic",
    "topic_name",
]


@dataclass(frozen=True, slots=True)
class KafkaTopic:
    """A topic as Kafka describes it."""

    topic_id: str
    partitions: int
    replicas: int
    configs: Mapping[str, str]
    """The configs set on the topic itself (DescribeConfigs source DYNAMIC_TOPIC_CONFIG)."""


@dataclass(frozen=True, slots=True)
class CreateTopic:
    name: str
    partitions: int | None
    """None: the broker's `num.partitions`."""
    replicas: int | None
    """None: the broker's `default.replication.factor`."""
    configs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class SetConfigs:
    name: str
    set: Mapping[str, str]
    delete: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AddPartitions:
    name: str
    total: int


Action = CreateTopic | SetConfigs | AddPartitions
"""What the topic planner asks of Kafka."""


@dataclass(frozen=True, slots=True)
class TopicPlan:
    actions: list[Action]
    conditions: list[ConditionState]
    status: dict[str, Any]
    events: list[tuple[str, str, str]] = field(default_factory=list)
    requeue_after: float | None = None


WAIT_S = 10.0


def topic_name(resource: Mapping[str, Any]) -> str:
    """The topic's name in Kafka: `spec.topicName`, else the resource's name."""
    spec = resource.get("spec") or {}
    return str(spec.get("topicName") or resource["metadata"]["name"])


def _not_ready(reason: str, message: str, *, requeue: float | None = WAIT_S) -> TopicPlan:
    return TopicPlan(
        actions=[],
        conditions=[
            ConditionState("Ready", "False", reason, message),
            ConditionState("Reconciling", "False" if requeue is None else "True", reason, message),
        ],
        status={},
        events=[("Warning", reason, message)] if requeue is None else [],
        requeue_after=requeue,
    )


ROLLING_REASONS = frozenset({"RollingRestart", "NodesNotReady"})
"""A cluster's Ready reasons while it rolls and otherwise works: its nodes wait their turn,
or one it restarted is not back yet."""


def cluster_serves_topics(conditions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a KafkaCluster with these status conditions takes topic changes: once Ready,
    and all through a rolling restart (its brokers restart one by one and the others answer
    the Admin API), rather than only between rolls. A cluster that is down while a roll is
    due (its quorum not formed, its nodes stuck, its brokers unreachable) does not."""
    by_type = {c.get("type"): c for c in conditions}
    ready = by_type.get("Ready") or {}
    reconciling = by_type.get("Reconciling") or {}
    rolling = (
        reconciling.get("status") == "True"
        and reconciling.get("reason") == "RollingRestart"
        and ready.get("reason") in ROLLING_REASONS
    )
    return ready.get("status") == "True" or rolling


def plan_topic(
    resource: Mapping[str, Any],
    *,
    cluster_ready: bool | None,
    found: KafkaTopic | None,
) -> TopicPlan:
    """`cluster_ready`: None when the named KafkaCluster does not exist, False when it is not
    ready or its brokers did not answer (`found` is then unknown and ignored)."""
    try:
        topic = Topic.model_validate(dict(resource) | {"status": None})
    except ValidationError as exc:
        return _not_ready("InvalidSpec", problems(exc), requeue=None)
    spec = topic.spec
    name = topic_name(resource)
    if cluster_ready is None:
        return _not_ready("ClusterNotFound", f"no KafkaCluster {spec.cluster} in this namespace")
    if not cluster_ready:
        return _not_ready(
            "ClusterNotReady", f"KafkaCluster {spec.cluster} is not ready or did not answer"
        )
    wanted = spec.config.properties() if spec.config is not None else {}
    if found is None:
        return TopicPlan(
            actions=[CreateTopic(name, spec.partitions, spec.replicas, wanted)],
            conditions=[
                ConditionState("Ready", "False", "Creating", f"creating topic {name}"),
                ConditionState("Reconciling", "True", "Creating", f"creating topic {name}"),
            ],
            status={"topicName": name},
            events=[("Normal", "Created", f"creating topic {name}")],
            requeue_after=WAIT_S,
        )
    actions: list[Action] = []
    refused: list[tuple[str, str]] = []
    events: list[tuple[str, str, str]] = []
    if spec.partitions is not None and spec.partitions > found.partitions:
        actions.append(AddPartitions(name, spec.partitions))
        events.append(
            ("Normal", "PartitionsAdded", f"{name}: {found.partitions} → {spec.partitions}")
        )
    elif spec.partitions is not None and spec.partitions < found.partitions:
        refused.append(
            (
                "PartitionDecreaseNotSupported",
                f"{name} keeps {found.partitions} partitions: Kafka cannot remove partitions "
                f"(asked: {spec.partitions})",
            )
        )
    if spec.replicas is not None and spec.replicas != found.replicas:
        refused.append(
            (
                "ReplicationFactorChangeNotSupported",
                f"{name} keeps replication factor {found.replicas}: changing it needs a "
                f"reassignment, which is not supported yet (asked: {spec.replicas})",
            )
        )
    to_set = {key: value for key, value in wanted.items() if found.configs.get(key) != value}
    to_delete = tuple(sorted(key for key in found.configs if key not in wanted))
    if to_set or to_delete:
        actions.append(SetConfigs(name, to_set, to_delete))
        generation = resource["metadata"].get("generation")
        handled = (resource.get("status") or {}).get("observedGeneration") == generation
        if handled:  # the spec did not change: someone changed the topic outside Kubernetes
            drift = [f"{k}={found.configs.get(k, '(default)')}" for k in sorted(to_set)] + [
                f"{k}={found.configs[k]}" for k in to_delete
            ]
            events.append(
                (
                    "Warning",
                    "DriftCorrected",
                    f"{name} had configs set outside Kubernetes, put back: {', '.join(drift)}",
                )
            )
    status = {
        "topicName": name,
        "topicId": found.topic_id,
        "partitions": found.partitions,
        "replicas": found.replicas,
        "config": dict(sorted(found.configs.items())),
    }
    conditions: list[ConditionState] = []
    if refused:
        reason, _ = refused[0]
        message = "; ".join(m for _, m in refused)
        conditions.append(ConditionState("Ready", "False", reason, message))
        events += [("Warning", r, m) for r, m in refused]
    elif actions:
        conditions.append(ConditionState("Ready", "False", "Updating", f"updating topic {name}"))
    else:
        conditions.append(ConditionState("Ready", "True", "Ready", f"topic {name} is as specified"))
    busy = bool(actions)
    conditions.append(
        ConditionState(
            "Reconciling",
            "True" if busy else "False",
            "Updating" if busy else "Reconciled",
            f"updating topic {name}" if busy else "the topic is as the spec asks, or refused",
        )
    )
    return TopicPlan(
        actions=actions,
        conditions=conditions,
        status=status,
        events=events,
        requeue_after=WAIT_S if busy else None,
    )
