"""The CRDs on a real API server: they are accepted (structural schemas, CEL rules that
compile), the examples are valid resources, an invalid resource is refused at admission with a
message that names the problem, and applying the same manifests again changes nothing a GitOps
tool would flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import Kubectl

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MANAGER = "gregor-e2e"


def apply(kubectl: Kubectl, namespace: str, document: dict[str, Any], *extra: str) -> str:
    return kubectl(
        "apply",
        "--server-side",
        f"--field-manager={MANAGER}",
        *extra,
        "-f",
        "-",
        namespace=namespace,
        stdin=json.dumps(document),
    )


def refused(kubectl: Kubectl, namespace: str, document: dict[str, Any]) -> str:
    with pytest.raises(AssertionError) as caught:
        apply(kubectl, namespace, document)
    return str(caught.value)


def example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return loaded


def test_the_examples_are_accepted_and_a_second_apply_changes_nothing(
    crds: None, kubectl: Kubectl, namespace: str
) -> None:
    for name in ("kafkacluster.yaml", "kafkacluster-combined.yaml", "topic.yaml"):
        apply(kubectl, namespace, example(name))
    stored = json.loads(kubectl("get", "kafkacluster", "gregor", "-o", "json", namespace=namespace))
    # The API server filled in the defaults the models give.
    assert stored["spec"]["brokers"]["storage"]["type"] == "persistent-claim"
    assert stored["spec"]["listeners"] == [
        {"name": "plain", "port": 9092, "type": "internal", "tls": False}
    ]
    # What Argo CD and Flux do on every sync: nothing to change, nothing to report.
    for name in ("kafkacluster.yaml", "kafkacluster-combined.yaml", "topic.yaml"):
        kubectl(
            "diff",
            "--server-side",
            f"--field-manager={MANAGER}",
            "-f",
            str(EXAMPLES / name),
            namespace=namespace,
        )
    listed = kubectl("get", "kc,kt", namespace=namespace)
    for column in ("READY", "NODES", "BOOTSTRAP", "CLUSTER", "PARTITIONS", "REPLICAS"):
        assert column in listed, listed


CLUSTER, COMBINED, TOPIC = "kafkacluster.yaml", "kafkacluster-combined.yaml", "topic.yaml"


@pytest.mark.parametrize(
    ("example_name", "change", "message"),
    [
        (CLUSTER, {"config": {"node.id": 7}}, ".spec.config.node.id: field not declared in schema"),
        (
            CLUSTER,
            {"config": {"log.retention.hour": 1, "num.partitions": 3}},
            ".spec.config.log.retention.hour: field not declared in schema",
        ),
        (
            CLUSTER,
            {"config": {"auto.create.topics.enable": "no"}},
            ".spec.config.auto.create.topics.enable: expected boolean",
        ),
        (
            CLUSTER,
            {"combined": {"replicas": 1}},
            "give either combined, or controllers and brokers",
        ),
        (CLUSTER, {"listeners": [{"name": "plain", "port": 9091}]}, "operator's own"),
        (
            CLUSTER,
            {"listeners": [{"name": "outside", "port": 9094, "type": "nodeport"}]},
            "a cluster needs an internal listener",
        ),
        (CLUSTER, {"brokers": {"replicas": 0}}, "should be greater than or equal to 1"),
        (CLUSTER, {"brokers": {"replicas": 3, "storage": {"size": "lots"}}}, "should match"),
        (
            CLUSTER,
            {"controllers": {"replicas": 3, "storage": {"type": "ephemeral"}}},
            "ephemeral storage is for brokers only: a voter's metadata log is lost with its pod",
        ),
        (
            COMBINED,
            {"combined": {"replicas": 1, "storage": {"type": "ephemeral"}}},
            "the quorum cannot tell a replaced voter from the one it replaced",
        ),
        (
            TOPIC,
            {"config": {"min.insync.replicas": 3}},
            "min.insync.replicas must be below replicas",
        ),
        (
            TOPIC,
            {"config": {"retention.hours": 1}},
            ".spec.config.retention.hours: field not declared in schema",
        ),
        (TOPIC, {"topicName": "has spaces"}, "should match"),
    ],
)
@pytest.mark.usefixtures("crds")
def test_an_invalid_resource_is_refused_at_admission_with_a_message_naming_the_problem(
    kubectl: Kubectl,
    namespace: str,
    example_name: str,
    change: dict[str, Any],
    message: str,
) -> None:
    document = example(example_name)
    document["spec"] |= change
    assert message in refused(kubectl, namespace, document)


def test_a_topics_cluster_and_name_cannot_change(
    crds: None, kubectl: Kubectl, namespace: str
) -> None:
    document = example("topic.yaml")
    document["spec"]["topicName"] = "orders.v1"
    apply(kubectl, namespace, document)
    for field, value, message in (
        ("cluster", "other", "cluster cannot be changed"),
        ("topicName", "orders.v2", "topicName cannot be changed"),
    ):
        changed = json.loads(json.dumps(document))
        changed["spec"][field] = value
        assert message in refused(kubectl, namespace, changed)
    long_name = example("topic.yaml")
    long_name["metadata"]["name"] = "t" * 250
    assert "at most 249 characters" in refused(kubectl, namespace, long_name)
