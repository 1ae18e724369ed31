"""`gregor.dev/dry-run` on a KafkaCluster: the plan applies, restarts, sets and deletes
nothing, and `status.dryRun` says what the spec would restart and why, set on the running
brokers instead, add, or refuse."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from broker.config import parse_properties
from gregor_operator.objects import TEMPLATE_HASH
from gregor_operator.observed import Observed, StatefulSetState
from gregor_operator.planner import Plan
from tests.unit.operator.test_planner import (
    CURRENT,
    HEALTHY,
    condition,
    example,
    objects,
    planned,
    running,
)

DRY_RUN = {"gregor.dev/dry-run": "true"}


def as_applied(resource: dict[str, Any]) -> Observed:
    """The cluster as Kubernetes shows it once `resource` was applied and rolled: each
    StatefulSet with its template hash and image, each ConfigMap's properties."""
    found = planned(resource)
    observed = running(CURRENT)
    statefulsets = {}
    for role, state in observed.statefulsets.items():
        written = objects(found, "StatefulSet")[f"gregor-{role}"]
        statefulsets[role] = dataclasses.replace(
            state,
            template_hash=written["metadata"]["annotations"][TEMPLATE_HASH],
            image=written["spec"]["template"]["spec"]["containers"][0]["image"],
        )
    properties = {
        role: parse_properties(
            objects(found, "ConfigMap")[f"gregor-{role}-config"]["data"]["server.properties"]
        )
        for role in statefulsets
    }
    return dataclasses.replace(observed, statefulsets=statefulsets, properties=properties)


def dry_run(resource: dict[str, Any], observed: Observed) -> Plan:
    changed = copy.deepcopy(resource)
    changed["metadata"]["annotations"] = DRY_RUN
    changed["metadata"]["generation"] = 2
    return planned(changed, observed, HEALTHY)


def test_the_same_spec_would_restart_nothing() -> None:
    resource = example()
    found = dry_run(resource, as_applied(resource))
    assert found.status["dryRun"] == {
        "generation": 2,
        "summary": "no pod would restart",
        "restarts": [],
        "withoutRestart": [],
        "adds": [],
        "refused": [],
    }


def test_a_change_is_reported_and_nothing_is_done() -> None:
    """A config brokers must restart to take rolls both pools; one they take live is set
    instead; a broker more is added; nothing is applied, and observedGeneration stays."""
    resource = example()
    observed = as_applied(resource)
    changed = copy.deepcopy(resource)
    changed["spec"]["config"]["auto.create.topics.enable"] = False
    changed["spec"]["config"]["log.retention.ms"] = 3_600_000
    changed["spec"]["brokers"]["replicas"] = 4
    found = dry_run(changed, observed)
    report = found.status["dryRun"]
    why = "its configuration changes: auto.create.topics.enable (unset → false)"
    assert report["restarts"] == [
        {"pod": f"gregor-{role}-{i}", "reason": why}
        for role in ("broker", "controller")
        for i in range(3)
    ]
    assert report["withoutRestart"] == [{"config": "log.retention.ms", "value": "3600000"}]
    assert report["adds"] == ["gregor-broker-3"]
    assert report["summary"] == (
        "6 pod(s) would restart; 1 config(s) would be set without a restart; "
        "1 pod(s) would be added"
    )
    assert (found.objects, found.restarts, found.config_updates) == ([], (), {})
    assert (found.deletions, found.pod_annotations, found.asks) == ([], {}, [])
    assert found.applied is False
    reconciling = condition(found, "Reconciling")
    assert (reconciling.status, reconciling.reason) == ("False", "DryRun")
    assert reconciling.message.endswith(report["summary"])
    assert [e for e in found.events if e[0] == "Normal"] == []


def test_an_image_change_and_a_refusal_are_named() -> None:
    resource = example()
    observed = as_applied(resource)
    changed = copy.deepcopy(resource)
    changed["spec"]["image"] = "gregor-broker:1.0.1"
    changed["spec"]["controllers"]["replicas"] = 5
    report = dry_run(changed, observed).status["dryRun"]
    reasons = {entry["reason"] for entry in report["restarts"]}
    assert reasons == {"its image changes (gregor-broker:1.0.0 → gregor-broker:1.0.1)"}
    assert len(report["restarts"]) == 6
    assert report["refused"] == [
        "controller replicas stay 3: the controller quorum's voters are fixed when the "
        "cluster is created (asked: 5)"
    ]


def test_a_roll_under_way_is_held_and_its_pods_listed() -> None:
    resource = example()
    observed = as_applied(resource)
    stale = [
        dataclasses.replace(pod, revision="old") if pod.name == "gregor-broker-1" else pod
        for pod in observed.pods
    ]
    found = dry_run(resource, dataclasses.replace(observed, pods=stale))
    assert found.restarts == ()
    assert found.status["dryRun"]["restarts"] == [
        {"pod": "gregor-broker-1", "reason": "its configuration or image changed"}
    ]
    assert found.status["rollout"]["held"] == "held by the gregor.dev/dry-run annotation"


def test_without_the_annotation_the_report_goes() -> None:
    resource = example()
    assert planned(resource, as_applied(resource), HEALTHY).status["dryRun"] is None


def test_a_statefulset_without_a_template_hash_is_judged_by_its_image_and_config() -> None:
    resource = example()
    observed = as_applied(resource)
    older = {
        role: StatefulSetState(s.replicas, s.update_revision, s.claims, None, s.image)
        for role, s in observed.statefulsets.items()
    }
    found = dry_run(resource, dataclasses.replace(observed, statefulsets=older))
    assert found.status["dryRun"]["restarts"] == []
