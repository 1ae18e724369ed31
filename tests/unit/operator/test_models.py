"""The custom resources' models and the CRDs generated from them: what a user writes is
accepted or refused with a message that names the problem, the committed CRDs are what the
models generate, and the API server's defaulting gives the values the models give."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from gregor_operator.crds import RESOURCES, TARGETS, crd, target_path
from gregor_operator.models import KafkaCluster, Topic, User

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
MODELS: dict[str, type[BaseModel]] = {"KafkaCluster": KafkaCluster, "Topic": Topic, "User": User}

SPLIT = {"controllers": {"replicas": 3}, "brokers": {"replicas": 3}}


def cluster(**spec: Any) -> KafkaCluster:
    return KafkaCluster.model_validate({"metadata": {"name": "c"}, "spec": spec})


def topic(**spec: Any) -> Topic:
    return Topic.model_validate({"metadata": {"name": "t"}, "spec": {"cluster": "c"} | spec})


def refusal(build: Any, **spec: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        build(**spec)
    return str(caught.value)


# -- the generated CRDs ----------------------------------------------------------------------


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_the_committed_crds_are_what_the_models_generate(resource: Any) -> None:
    for target in TARGETS:
        path = target_path(target, resource)
        assert path.exists(), f"{path} is missing: run `make crds`"
        assert path.read_text() == target.render(resource), f"{path} is stale: run `make crds`"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node under `node`, with where it is."""
    if not isinstance(node, dict):
        return []
    found = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        found += _walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            found += _walk(node[key], f"{path}[{key}]")
    return found


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_the_schemas_are_structural_and_carry_no_noise(resource: Any) -> None:
    """What the API server refuses in a structural schema, and what makes GitOps tools report
    a difference that is not one (Argo CD's complaints about Strimzi's CRDs)."""
    schema = crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        where = f"{resource.kind}{path}"
        for key in ("$ref", "anyOf", "oneOf", "allOf", "title", "nullable", "const"):
            assert key not in node, f"{where} has {key}"
        open_ended = node.get("x-kubernetes-preserve-unknown-fields") or node.get(
            "x-kubernetes-int-or-string"
        )
        assert "type" in node or open_ended, f"{where} has no type"
        assert node.get("properties", None) != {}, f"{where} has empty properties"
        assert not ("properties" in node and "additionalProperties" in node), where
        if "default" in node:
            assert node["default"] is not None, f"{where} defaults to null"
        assert "description" not in node or "\n" not in node["description"].strip("\n"), (
            f"{where}'s description keeps the docstring's line breaks"
        )


def _defaulted(node: dict[str, Any], value: Any) -> Any:
    """`value` with the schema's defaults filled in as the API server fills them: a missing
    field with a default gets it, and defaulting goes on inside what was filled in."""
    if isinstance(value, dict) and "properties" in node:
        value = dict(value)
        for name, sub in node["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = _defaulted(sub, value[name])
    elif isinstance(value, list) and "items" in node:
        value = [_defaulted(node["items"], item) for item in value]
    return value


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_api_servers_defaults_mean_what_the_models_defaults_mean(example: Path) -> None:
    """The CRDs write object defaults as `{}` and leave each field's default to its own
    schema; a resource defaulted that way reads back as the model reads the one written."""
    document = yaml.safe_load(example.read_text())
    resource = next(r for r in RESOURCES if r.kind == document["kind"])
    schema = crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    defaulted = _defaulted(schema, document)
    assert defaulted != document, "the example exercises no default"
    model = MODELS[document["kind"]]
    assert model.model_validate(defaulted) == model.model_validate(document)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_a_valid_resource(example: Path) -> None:
    document = yaml.safe_load(example.read_text())
    MODELS[document["kind"]].model_validate(document)


def test_the_crds_name_their_short_names_and_printer_columns() -> None:
    names = {resource.kind: crd(resource)["spec"]["names"] for resource in RESOURCES}
    assert {kind: n["shortNames"] for kind, n in names.items()} == {
        "KafkaCluster": ["kc"],
        "Topic": ["kt"],
        "User": ["ku"],
    }
    columns = {
        c["name"] for c in crd(RESOURCES[0])["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    assert {"Ready", "Nodes", "Bootstrap"} <= columns


# -- KafkaCluster ----------------------------------------------------------------------------


def test_a_cluster_defaults_to_one_plain_listener_and_persistent_storage() -> None:
    spec = cluster(**SPLIT).spec
    assert [(listener.name, listener.port, listener.type) for listener in spec.listeners] == [
        ("plain", 9092, "internal")
    ]
    assert spec.brokers is not None
    assert (spec.brokers.storage.type, spec.brokers.storage.size) == ("persistent-claim", "10Gi")
    assert spec.metrics.enabled
    assert not spec.delete_claims


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "give either combined, or controllers and brokers"),
        ({"combined": {"replicas": 1}} | SPLIT, "give either combined, or controllers and brokers"),
        ({"controllers": {"replicas": 3}}, "controllers and brokers go together"),
        ({"combined": {"replicas": 0}}, "greater than or equal to 1"),
        (SPLIT | {"config": {"node.id": 4}}, "node.id, which the operator sets itself"),
        (SPLIT | {"config": {"log.retention.hour": 1}}, "`log.retention.hour`\n  Extra inputs"),
        (SPLIT | {"config": {"log.retention.ms": {"a": 1}}}, "should be a valid integer"),
        (SPLIT | {"config": {"ssl.keystore.password": "x"}}, "`ssl.keystore.password`\n  Extra"),
        (SPLIT | {"listeners": [{"name": "a", "port": 9091}]}, "operator's own"),
        (
            SPLIT | {"listeners": [{"name": "a", "port": 9092}, {"name": "b", "port": 9092}]},
            "listener ports must differ",
        ),
        (SPLIT | {"listeners": [{"name": "PLAIN", "port": 9092}]}, "should match pattern"),
        (SPLIT | {"listeners": [{"name": "a", "port": 9092, "tls": True}]}, "not supported yet"),
        (SPLIT | {"listeners": []}, "at least 1 item"),
        ({"combined": {"replicas": 1, "storage": {"size": "ten"}}}, "should match pattern"),
        (
            {"combined": {"replicas": 1, "storage": {"type": "ephemeral"}}},
            "spec.combined\n  Value error, ephemeral storage is for brokers only: a voter's "
            "metadata log is lost with its pod, and the quorum cannot tell a replaced voter "
            "from the one it replaced",
        ),
        (
            SPLIT | {"controllers": {"replicas": 3, "storage": {"type": "ephemeral"}}},
            "spec.controllers\n  Value error, ephemeral storage is for brokers only",
        ),
        (SPLIT | {"replicas": 3}, "Extra inputs are not permitted"),
    ],
)
def test_an_invalid_cluster_is_refused_with_a_message_naming_the_problem(
    spec: dict[str, Any], message: str
) -> None:
    assert message in refusal(cluster, **spec)


def test_ephemeral_storage_is_for_brokers_and_the_api_server_refuses_it_for_voters() -> None:
    spec = cluster(**SPLIT | {"brokers": {"replicas": 3, "storage": {"type": "ephemeral"}}}).spec
    assert spec.brokers is not None
    assert spec.brokers.storage.type == "ephemeral"
    resource = next(r for r in RESOURCES if r.kind == "KafkaCluster")
    schema = crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pools = schema["properties"]["spec"]["properties"]
    for voters in ("combined", "controllers"):
        (rule,) = pools[voters]["x-kubernetes-validations"]
        assert rule["rule"] == (
            "!has(self.storage) || !has(self.storage.type) || self.storage.type != 'ephemeral'"
        )
        assert "a voter's metadata log is lost with its pod" in rule["message"]
    assert "x-kubernetes-validations" not in pools["brokers"]


def test_config_values_are_rendered_as_kafka_writes_them() -> None:
    spec = cluster(**SPLIT, config={"auto.create.topics.enable": False, "num.partitions": 6}).spec
    assert spec.config is not None
    assert spec.config.properties() == {
        "auto.create.topics.enable": "false",
        "num.partitions": "6",
    }


# -- Topic -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"replicas": 3, "config": {"min.insync.replicas": 3}}, "must be below replicas"),
        ({"config": {"retention.hours": 1}}, "`retention.hours`\n  Extra inputs"),
        ({"config": {"retention.ms": "soon"}}, "retention.ms"),
        ({"config": {"cleanup.policy": "shred"}}, "cleanup.policy"),
        ({"partitions": 0}, "greater than or equal to 1"),
        ({"topicName": "no spaces"}, "should match pattern"),
        ({"deletionPolicy": "orphan"}, "'delete' or 'retain'"),
    ],
)
def test_an_invalid_topic_is_refused_with_a_message_naming_the_problem(
    spec: dict[str, Any], message: str
) -> None:
    assert message in refusal(topic, **spec)


def test_a_topic_takes_configs_as_yaml_gives_them() -> None:
    spec = topic(
        partitions=6, replicas=3, config={"min.insync.replicas": 2, "preallocate": True}
    ).spec
    assert (spec.partitions, spec.replicas, spec.deletion_policy) == (6, 3, "delete")
    assert spec.topic_name is None


def test_a_user_is_modelled_with_its_acls() -> None:
    user = User.model_validate(
        {
            "spec": {
                "cluster": "c",
                "authentication": {"type": "scram-sha-512"},
                "authorization": {
                    "acls": [
                        {"resource": {"type": "topic", "name": "orders"}, "operations": ["Read"]}
                    ]
                },
            }
        }
    )
    assert user.spec.authorization is not None
    assert user.spec.authorization.acls[0].resource.pattern_type == "literal"
    no_operations = {"resource": {"type": "group"}, "operations": []}
    with pytest.raises(ValidationError, match="at least 1 item"):
        User.model_validate({"spec": {"cluster": "c", "authorization": {"acls": [no_operations]}}})
