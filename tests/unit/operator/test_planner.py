"""The planner without a cluster: the objects a `KafkaCluster` is made of, the changes it
refuses, the order of a rolling restart, and the status it reports."""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.cli import build_parser
from broker.config import BrokerConfig, parse_properties
from gregor_operator.objects import CONFIG_HASH, Role
from gregor_operator.planner import (
    BrokerFacts,
    ConditionState,
    Observed,
    Plan,
    PodState,
    Restart,
    ServiceState,
    StatefulSetState,
    Verdict,
    merge_conditions,
    plan,
)

ROOT = Path(__file__).resolve().parents[3]
NAMESPACE = "team-a"
CLUSTER_ID = "-kU3OEVBNTcwNTJENDM2Qk"  # ids made before new_cluster_id avoided "-"
IMAGE = "gregor-broker:1.0.0"
NODE_IP = "192.0.2.7"


def example(name: str = "kafkacluster.yaml") -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    document["metadata"] |= {"namespace": NAMESPACE, "uid": "0b6e-uid", "generation": 1}
    return document


def planned(
    resource: dict[str, Any],
    observed: Observed | None = None,
    facts: BrokerFacts | None = None,
) -> Plan:
    return plan(
        resource,
        namespace=NAMESPACE,
        cluster_id=CLUSTER_ID,
        observed=observed or Observed(),
        facts=facts,
        image=IMAGE,
    )


def objects(found: Plan, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in found.objects if o["kind"] == kind}


def condition(found: Plan, kind: str) -> ConditionState:
    return next(c for c in found.conditions if c.type == kind)


def restarted(found: Plan) -> str | None:
    return None if found.restart is None else found.restart.pod


def template_hash(found: Plan, statefulset: str) -> str:
    annotations = objects(found, "StatefulSet")[statefulset]["spec"]["template"]["metadata"]
    return str(annotations["annotations"][CONFIG_HASH])


def clear(*nodes: int) -> dict[tuple[int, ...], Verdict]:
    """Every node's restart verdict, each saying it may stop."""
    return {(node,): Verdict((node,), safe=True) for node in nodes}


NODE_IDS = (0, 1, 2, 1000, 1001, 1002)

HEALTHY = BrokerFacts(
    brokers={0: "Unfenced", 1: "Unfenced", 2: "Unfenced"},
    under_replicated=0,
    active_controller="gregor-controller-1",
    verdicts=clear(*NODE_IDS),
)


def running(
    revisions: dict[str, str],
    *,
    pod_revisions: dict[str, str] | None = None,
    not_ready: Iterable[str] = (),
    stuck: dict[str, str] | None = None,
    deleting: Iterable[str] = (),
    replicas: dict[str, int] | None = None,
    claims: dict[str, tuple[str, str | None] | None] | None = None,
    ready_for: dict[str, float] | None = None,
) -> Observed:
    """A cluster of the example's shape as Kubernetes shows it: every pod of a pool at its
    StatefulSet's update revision unless `pod_revisions` says otherwise."""
    replicas = {"controller": 3, "broker": 3} | (replicas or {})
    roles: dict[str, Role] = {"controller": "controller", "broker": "broker"}
    default_claims = {"controller": ("1Gi", None), "broker": ("10Gi", None)}
    statefulsets: dict[Role, StatefulSetState] = {
        roles[role]: StatefulSetState(count, revisions[role], (claims or default_claims).get(role))
        for role, count in replicas.items()
    }
    pods = []
    for role, count in replicas.items():
        for ordinal in range(count):
            name = f"gregor-{role}-{ordinal}"
            pods.append(
                PodState(
                    name,
                    roles[role],
                    ordinal,
                    ready=name not in set(not_ready),
                    revision=(pod_revisions or {}).get(name, revisions[role]),
                    deleting=name in set(deleting),
                    stuck=(stuck or {}).get(name),
                    ready_for_s=(ready_for or {}).get(name, 3600.0),
                )
            )
    return Observed(statefulsets, pods)


CURRENT = {"controller": "rev-c1", "broker": "rev-b1"}
ROLLED = {"controller": "rev-c2", "broker": "rev-b2"}


# -- a fresh cluster --------------------------------------------------------------------------


def test_a_fresh_cluster_gets_every_object_it_is_made_of() -> None:
    found = planned(example())
    kinds = [(o["kind"], o["metadata"]["name"]) for o in found.objects]
    assert kinds == [
        ("ServiceAccount", "gregor-node"),
        ("Secret", "gregor-cluster-id"),
        ("Service", "gregor-nodes"),
        ("Service", "gregor-bootstrap"),
        ("ConfigMap", "gregor-controller-config"),
        ("ConfigMap", "gregor-broker-config"),
        ("PodDisruptionBudget", "gregor-controller"),
        ("StatefulSet", "gregor-controller"),
        ("PodDisruptionBudget", "gregor-broker"),
        ("StatefulSet", "gregor-broker"),
    ]
    for found_object in found.objects:
        metadata = found_object["metadata"]
        assert metadata["namespace"] == NAMESPACE
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "gregor-operator"
        (owner,) = metadata["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "KafkaCluster",
            "gregor",
            "0b6e-uid",
            True,
        )
    assert found.restart is None
    ready = condition(found, "Ready")
    assert (ready.status, ready.reason) == ("False", "NodesNotReady")
    assert "0/6 nodes ready; waiting for 6 not created yet" in ready.message
    assert condition(found, "Reconciling").status == "True"
    assert found.requeue_after is not None


def test_the_statefulsets_leave_restarts_to_the_operator_and_probe_what_matters() -> None:
    brokers = objects(planned(example()), "StatefulSet")["gregor-broker"]["spec"]
    assert brokers["updateStrategy"] == {"type": "OnDelete"}
    assert brokers["podManagementPolicy"] == "Parallel"
    assert brokers["serviceName"] == "gregor-nodes"
    assert brokers["volumeClaimTemplates"][0]["spec"]["resources"] == {
        "requests": {"storage": "10Gi"}
    }
    pod = brokers["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9404}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": 9404}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["terminationGracePeriodSeconds"] >= 60


def test_the_headless_service_publishes_nodes_before_they_are_ready() -> None:
    service = objects(planned(example()), "Service")["gregor-nodes"]["spec"]
    assert service["clusterIP"] == "None"
    assert service["publishNotReadyAddresses"] is True
    bootstrap = objects(planned(example()), "Service")["gregor-bootstrap"]["spec"]
    assert bootstrap["selector"] == {"gregor.dev/cluster": "gregor", "gregor.dev/broker": "true"}


def _pod_commands(
    found: Plan,
    statefulset: str,
    ordinal: int,
    host_ip: str = NODE_IP,
    annotations: dict[str, str] | None = None,
) -> list[list[str]]:
    """The `gregor` commands a pod runs, each as its arguments: its command run under /bin/sh
    with a stand-in `gregor`, its ConfigMap mounted where the command reads it, and its
    `annotations` where the downward API puts them."""
    config_map = objects(found, "ConfigMap")[f"{statefulset}-config"]
    mounted = Path(tempfile.mkdtemp())
    for key, text in config_map["data"].items():
        (mounted / key).write_text(text)
    (mounted / "pod").mkdir()
    (mounted / "pod" / "annotations").write_text(
        "".join(f'{key}="{value}"\n' for key, value in (annotations or {}).items())
    )
    (container,) = objects(found, "StatefulSet")[statefulset]["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    env |= {
        "POD_NAME": f"{statefulset}-{ordinal}",
        "GREGOR_CLUSTER_ID": CLUSTER_ID,
        "HOST_IP": host_ip,  # the downward API's status.hostIP
    }
    stand_in = 'gregor() { for a in "$@"; do printf \'%s\\n\' "$a"; done; echo --; }; '
    script = container["command"][2].replace("exec gregor", "gregor", 1)
    script = script.replace("/etc/gregor/", f"{mounted}/")
    try:
        said = subprocess.run(
            [container["command"][0], "-c", stand_in + script],
            env={"PATH": os.environ["PATH"], **env},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        shutil.rmtree(mounted)
    return [command.strip("\n").split("\n") for command in said.split("--\n") if command]


def _pod_properties(
    found: Plan,
    statefulset: str,
    ordinal: int,
    host_ip: str = NODE_IP,
    annotations: dict[str, str] | None = None,
) -> dict[str, str]:
    """What a pod's node reads: its pool's server.properties and the overrides its command
    computes."""
    config_map = objects(found, "ConfigMap")[f"{statefulset}-config"]
    properties = parse_properties(config_map["data"]["server.properties"])
    *_, last = _pod_commands(found, statefulset, ordinal, host_ip, annotations)
    args = build_parser().parse_args(last)  # as `gregor` itself reads them
    assert (args.command, args.cluster_id) == ("broker", CLUSTER_ID)
    return properties | dict(o.split("=", 1) for o in args.override)


@pytest.mark.parametrize(
    ("name", "statefulset", "ordinal", "node_id"),
    [
        ("kafkacluster.yaml", "gregor-controller", 2, 1002),
        ("kafkacluster.yaml", "gregor-broker", 1, 1),
        ("kafkacluster-combined.yaml", "gregor-dev-combined", 0, 0),
    ],
)
def test_every_node_gets_a_configuration_the_broker_accepts(
    name: str, statefulset: str, ordinal: int, node_id: int
) -> None:
    found = planned(example(name))
    properties = _pod_properties(found, statefulset, ordinal)
    config = BrokerConfig.from_properties(properties)
    assert config.node_id == node_id
    if "broker" in config.process_roles:
        host = f"{statefulset}-{ordinal}.{statefulset.rsplit('-', 1)[0]}-nodes.{NAMESPACE}.svc"
        assert all(host in str(listener) for listener in config.advertised_listeners), properties[
            "advertised.listeners"
        ]
    voters = properties["controller.quorum.voters"]
    assert voters.count("@") == 3 if name == "kafkacluster.yaml" else 1


ZONE = "topology.kubernetes.io/zone"


def with_rack(constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    resource = example()
    resource["spec"]["rack"] = {"topologyKey": ZONE}
    if constraints is not None:
        resource["spec"]["template"] = {"topologySpreadConstraints": constraints}
    return resource


def test_with_rack_awareness_every_pool_spreads_over_the_racks_beside_the_users_rules() -> None:
    by_host = {
        "maxSkew": 2,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
    }
    sets = objects(planned(with_rack([by_host])), "StatefulSet")
    for name, pool in (("gregor-broker", "broker"), ("gregor-controller", "controller")):
        spread = sets[name]["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert spread[0] == by_host
        assert spread[1] == {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {
                "matchLabels": {"gregor.dev/cluster": "gregor", "gregor.dev/pool": pool}
            },
        }
    theirs = {"maxSkew": 3, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway"}
    kept = objects(planned(with_rack([theirs])), "StatefulSet")["gregor-broker"]
    assert kept["spec"]["template"]["spec"]["topologySpreadConstraints"] == [theirs]
    plain = objects(planned(example()), "StatefulSet")["gregor-broker"]
    assert "topologySpreadConstraints" not in plain["spec"]["template"]["spec"]


def test_a_broker_starts_with_the_rack_the_operator_put_on_its_pod() -> None:
    found = planned(with_rack())
    properties = _pod_properties(
        found, "gregor-broker", 1, annotations={"gregor.dev/rack": "zone-b"}
    )
    assert BrokerConfig.from_properties(properties).broker_rack == "zone-b"
    controller = _pod_properties(found, "gregor-controller", 0)
    assert "broker.rack" not in controller  # a controller holds no replicas


def test_the_operator_tells_each_scheduled_broker_its_nodes_label_once() -> None:
    pods = [dataclasses.replace(pod, node=f"worker-{pod.ordinal}") for pod in running(CURRENT).pods]
    told = dataclasses.replace(pods[4], rack="zone-b")  # gregor-broker-1, told already
    pods = [told if pod.name == told.name else pod for pod in pods]
    unscheduled = dataclasses.replace(pods[5], node=None)  # gregor-broker-2
    pods[5] = unscheduled
    labels = {"worker-0": {ZONE: "zone-a"}, "worker-1": {ZONE: "zone-b"}, "worker-2": {}}
    observed = Observed(running(CURRENT).statefulsets, pods, node_labels=labels)
    found = planned(with_rack(), observed, HEALTHY)
    assert found.pod_annotations == {"gregor-broker-0": {"gregor.dev/rack": "zone-a"}}
    assert found.requeue_after == pytest.approx(2.0)  # the pod waits for it to start
    assert [n.get("rack") for n in found.status["nodes"][3:]] == [None, "zone-b", None]
    pods[5] = dataclasses.replace(unscheduled, node="worker-2")
    missing = planned(with_rack(), Observed(observed.statefulsets, pods, node_labels=labels))
    assert ("Warning", "RackLabelMissing") in [event[:2] for event in missing.events]
    assert planned(example(), observed, HEALTHY).pod_annotations == {}


def test_the_users_config_reaches_every_node() -> None:
    found = planned(example())
    for statefulset in ("gregor-controller", "gregor-broker"):
        assert _pod_properties(found, statefulset, 0)["min.insync.replicas"] == "2"


# -- external listeners -----------------------------------------------------------------------


def with_external(kind: str) -> dict[str, Any]:
    resource = example()
    resource["spec"]["listeners"] = [
        {"name": "plain", "port": 9092},
        {"name": "outside", "port": 9094, "type": kind},
    ]
    return resource


BROKER_SERVICES = [f"gregor-broker-{i}-outside" for i in range(3)]


def _services(
    node_ports: dict[str, int],
    ingress: dict[str, str] | None = None,
    observed: Observed | None = None,
) -> Observed:
    """The example cluster running (or `observed`), its outside listener's Services as
    Kubernetes shows them."""
    observed = observed or running(CURRENT)
    pods = [
        dataclasses.replace(pod, host_ip=NODE_IP, uid=f"uid-{pod.name}") for pod in observed.pods
    ]
    services = {
        name: ServiceState(
            "outside",
            port,
            owner="0b6e-uid",
            ingress=tuple(filter(None, [(ingress or {}).get(name)])),
        )
        for name, port in node_ports.items()
    }
    return Observed(observed.statefulsets, pods, services)


@pytest.mark.parametrize(
    ("kind", "service_type"), [("nodeport", "NodePort"), ("loadbalancer", "LoadBalancer")]
)
def test_an_external_listener_gets_a_service_per_broker_and_one_to_bootstrap_from(
    kind: str, service_type: str
) -> None:
    found = planned(with_external(kind))
    services = objects(found, "Service")
    assert {name for name, s in services.items() if s["spec"].get("type") == service_type} == {
        "gregor-bootstrap-outside",
        *BROKER_SERVICES,
    }
    assert services["gregor-bootstrap-outside"]["spec"]["selector"] == {
        "gregor.dev/cluster": "gregor",
        "gregor.dev/broker": "true",
    }
    assert services["gregor-broker-1-outside"]["spec"]["selector"] == {
        "statefulset.kubernetes.io/pod-name": "gregor-broker-1"
    }
    assert services["gregor-broker-1-outside"]["metadata"]["labels"]["gregor.dev/listener"] == (
        "outside"
    )
    # Until Kubernetes gives each broker's Service an address, the brokers are not started:
    # they would have nothing to advertise.
    assert set(objects(found, "StatefulSet")) == {"gregor-controller"}
    ready = condition(found, "Ready")
    assert (ready.status, ready.reason) == ("False", "ExternalAddressesPending")
    assert ready.message.endswith(", ".join(BROKER_SERVICES))
    assert "gregor-broker-config" not in objects(found, "ConfigMap")
    # A node port comes with its Service; a cloud's load balancer takes its time.
    assert found.requeue_after == (2.0 if kind == "nodeport" else 10.0)


@pytest.mark.parametrize(("host_ip", "host"), [(NODE_IP, NODE_IP), ("fd00::7", "[fd00::7]")])
def test_brokers_advertise_their_nodes_address_and_their_own_node_port(
    host_ip: str, host: str
) -> None:
    ports = {"gregor-bootstrap-outside": 31000} | {
        name: 31001 + i for i, name in enumerate(BROKER_SERVICES)
    }
    found = planned(with_external("nodeport"), _services(ports), HEALTHY)
    assert set(objects(found, "StatefulSet")) == {"gregor-controller", "gregor-broker"}
    for ordinal in range(3):
        properties = _pod_properties(found, "gregor-broker", ordinal, host_ip)
        advertised = dict(
            item.split("://") for item in properties["advertised.listeners"].split(",")
        )
        assert advertised["OUTSIDE"] == f"{host}:{31001 + ordinal}"
        assert advertised["PLAIN"].startswith(f"gregor-broker-{ordinal}.gregor-nodes.")
        assert "OUTSIDE://:9094" in properties["listeners"]
        BrokerConfig.from_properties(properties)
    assert found.status["listeners"][1] == {
        "name": "outside",
        "type": "nodeport",
        "bootstrapServers": f"{NODE_IP}:31000",
    }
    assert condition(found, "Ready").status == "True"


def test_a_broker_behind_a_load_balancer_advertises_its_address_once_it_has_one() -> None:
    ports = {"gregor-bootstrap-outside": 31000} | {
        n: 31001 + i for i, n in enumerate(BROKER_SERVICES)
    }
    ingress = {"gregor-bootstrap-outside": "203.0.113.9", BROKER_SERVICES[0]: "203.0.113.10"}
    waiting = planned(with_external("loadbalancer"), _services(ports, ingress), HEALTHY)
    assert "gregor-broker" not in objects(waiting, "StatefulSet")
    assert condition(waiting, "Ready").message.endswith(
        "gregor-broker-1-outside, gregor-broker-2-outside"
    )
    ingress |= {BROKER_SERVICES[1]: "203.0.113.11", BROKER_SERVICES[2]: "lb-2.example.com"}
    found = planned(with_external("loadbalancer"), _services(ports, ingress), HEALTHY)
    addresses = [
        _pod_properties(found, "gregor-broker", i)["advertised.listeners"] for i in range(3)
    ]
    assert [a.split("OUTSIDE://")[1] for a in addresses] == [
        "203.0.113.10:9094",
        "203.0.113.11:9094",
        "lb-2.example.com:9094",
    ]
    assert found.status["listeners"][1]["bootstrapServers"] == "203.0.113.9:9094"
    assert found.restart is None
    # The status records what each broker pod started with; when its load balancer moves,
    # that broker alone is restarted to advertise the new address.
    resource = with_external("loadbalancer") | {"status": found.status}
    assert found.status["nodes"][5]["addresses"] == {"outside": "lb-2.example.com:9094"}
    moved = planned(
        resource, _services(ports, ingress | {BROKER_SERVICES[2]: "203.0.113.12"}), HEALTHY
    )
    assert moved.restart == Restart(
        "gregor-broker-2",
        "its external address changed: outside (lb-2.example.com:9094 → 203.0.113.12:9094)",
    )
    assert template_hash(moved, "gregor-broker") == template_hash(found, "gregor-broker")
    assert (
        "OUTSIDE.2=203.0.113.12:9094"
        in objects(moved, "ConfigMap")["gregor-broker-config"]["data"]["addresses"]
    )
    # Its successor (a new pod uid) starts with the new address: nothing more to restart.
    successor = _services(ports, ingress | {BROKER_SERVICES[2]: "203.0.113.12"})
    pods = [
        dataclasses.replace(p, uid="uid-new") if p.name == "gregor-broker-2" else p
        for p in successor.pods
    ]
    after = planned(
        resource | {"status": moved.status},
        Observed(successor.statefulsets, pods, successor.services),
        HEALTHY,
    )
    assert after.restart is None
    assert after.status["nodes"][5]["addresses"] == {"outside": "203.0.113.12:9094"}


def test_scaling_up_brokers_with_an_external_listener_restarts_none() -> None:
    ports = {"gregor-bootstrap-outside": 31000} | {
        f"gregor-broker-{i}-outside": 31001 + i for i in range(3)
    }
    before = planned(with_external("nodeport"), _services(ports), HEALTHY)
    resource = with_external("nodeport")
    resource["spec"]["brokers"]["replicas"] = 5
    waiting = planned(resource, _services(ports), HEALTHY)
    # The new brokers' Services are made first; the pool waits for their ports.
    assert {"gregor-broker-3-outside", "gregor-broker-4-outside"} <= set(
        objects(waiting, "Service")
    )
    assert "gregor-broker" not in objects(waiting, "StatefulSet")
    assert "gregor-broker-config" not in objects(waiting, "ConfigMap")
    ports |= {"gregor-broker-3-outside": 31004, "gregor-broker-4-outside": 31005}
    grown = planned(resource, _services(ports), HEALTHY)
    assert objects(grown, "StatefulSet")["gregor-broker"]["spec"]["replicas"] == 5
    assert template_hash(grown, "gregor-broker") == template_hash(before, "gregor-broker")
    assert grown.restart is None
    assert _pod_properties(grown, "gregor-broker", 4)["advertised.listeners"].endswith(
        f"OUTSIDE://{NODE_IP}:31005"
    )


def test_names_kubernetes_cannot_take_are_refused_before_anything_is_applied() -> None:
    resource = with_external("nodeport")
    resource["metadata"]["name"] = "payments-eu-west-1-production-cluster-a-primary"  # 47
    found = planned(resource)
    assert found.objects == []
    ready = condition(found, "Ready")
    assert ready.reason == "NameTooLong"
    name = "payments-eu-west-1-production-cluster-a-primary"
    assert f"Service {name}-broker-0-outside (64 characters, at most 63)" in ready.message
    assert f"StatefulSet {name}-controller (58 characters, at most 52)" in ready.message


def test_a_listener_may_not_be_named_like_the_clusters_objects() -> None:
    resource = example()
    resource["spec"]["listeners"] = [{"name": "nodes", "port": 9092}]
    ready = condition(planned(resource), "Ready")
    assert (ready.reason, "are reserved" in ready.message) == ("InvalidSpec", True)


def test_the_services_of_a_listener_taken_out_of_the_spec_are_deleted() -> None:
    ports = {"gregor-bootstrap-outside": 31000} | {
        n: 31001 + i for i, n in enumerate(BROKER_SERVICES)
    }
    observed = _services(ports)
    kept = planned(with_external("nodeport"), observed, HEALTHY)
    assert kept.deletions == []
    gone = planned(example(), observed, HEALTHY)
    assert gone.deletions == [("Service", name) for name in sorted(ports)]
    assert "HOST_IP" not in str(objects(gone, "StatefulSet")["gregor-broker"])


def test_a_cluster_without_an_internal_listener_is_refused() -> None:
    resource = with_external("nodeport")
    resource["spec"]["listeners"] = resource["spec"]["listeners"][1:]
    found = planned(resource)
    assert found.objects == []
    assert "a cluster needs an internal listener" in condition(found, "Ready").message


# -- changes ----------------------------------------------------------------------------------


def test_scaling_brokers_up_adds_nodes_without_restarting_any() -> None:
    resource = example()
    before = planned(resource, running(CURRENT), HEALTHY)
    resource["spec"]["brokers"]["replicas"] = 5
    after = planned(resource, running(CURRENT), HEALTHY)
    assert objects(after, "StatefulSet")["gregor-broker"]["spec"]["replicas"] == 5
    for statefulset in ("gregor-controller", "gregor-broker"):
        assert template_hash(before, statefulset) == template_hash(after, statefulset)
    assert after.restart is None
    assert not any(c.type == "ChangeRefused" for c in after.conditions)


@pytest.mark.parametrize(
    ("pool", "replicas", "reason"),
    [
        ("brokers", 2, "ScaleDownNotSupported"),
        ("controllers", 5, "ControllerScalingNotSupported"),
        ("controllers", 1, "ControllerScalingNotSupported"),
    ],
)
def test_an_unsafe_scaling_is_refused_and_the_current_size_kept(
    pool: str, replicas: int, reason: str
) -> None:
    resource = example()
    resource["spec"][pool]["replicas"] = replicas
    found = planned(resource, running(CURRENT), HEALTHY)
    role = pool.removesuffix("s")
    assert objects(found, "StatefulSet")[f"gregor-{role}"]["spec"]["replicas"] == 3
    refused = condition(found, "ChangeRefused")
    assert (refused.status, refused.reason) == ("True", reason)
    assert "stay 3" in refused.message
    assert f"asked: {replicas}" in refused.message
    assert ("Warning", reason, refused.message) in found.events
    # Nothing of the refused size reaches the pods: the voters stay the three that run.
    before = planned(example(), running(CURRENT), HEALTHY)
    for statefulset in ("gregor-controller", "gregor-broker"):
        assert template_hash(before, statefulset) == template_hash(found, statefulset)
    properties = objects(found, "ConfigMap")["gregor-broker-config"]["data"]["server.properties"]
    assert properties.count("@gregor-controller-") == 3


def test_a_storage_change_is_refused_and_the_current_claims_kept() -> None:
    resource = example()
    resource["spec"]["brokers"]["storage"]["size"] = "20Gi"
    found = planned(resource, running(CURRENT), HEALTHY)
    claims = objects(found, "StatefulSet")["gregor-broker"]["spec"]["volumeClaimTemplates"]
    assert claims[0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    refused = condition(found, "ChangeRefused")
    assert refused.reason == "StorageChangeNotSupported"
    assert "stays 10Gi" in refused.message
    assert "asked: 20Gi" in refused.message


def test_a_config_change_changes_the_revision_of_the_pools_it_reaches() -> None:
    """A config a running broker cannot take (auto.create.topics.enable) rolls every pool; one
    it takes (log.retention.ms) rolls none, and still reaches each pool's file."""
    resource = example()
    before = planned(resource)
    changed = copy.deepcopy(resource)
    changed["spec"]["config"]["auto.create.topics.enable"] = False
    after = planned(changed)
    for statefulset in ("gregor-controller", "gregor-broker"):
        assert template_hash(before, statefulset) != template_hash(after, statefulset)
    live = copy.deepcopy(resource)
    live["spec"]["config"]["log.retention.ms"] = 3_600_000
    after = planned(live)
    for statefulset in ("gregor-controller", "gregor-broker"):
        assert template_hash(before, statefulset) == template_hash(after, statefulset)
    properties = objects(after, "ConfigMap")["gregor-broker-config"]["data"]["server.properties"]
    assert "log.retention.ms=3600000\n" in properties
    resized = copy.deepcopy(resource)
    resized["spec"]["brokers"]["resources"] = {"limits": {"memory": "2Gi"}}
    after = planned(resized)
    assert template_hash(before, "gregor-controller") == template_hash(after, "gregor-controller")
    brokers = objects(after, "StatefulSet")["gregor-broker"]["spec"]["template"]["spec"]
    assert brokers["containers"][0]["resources"] == {"limits": {"memory": "2Gi"}}


def test_an_image_change_changes_every_pools_template() -> None:
    resource = example()
    resource["spec"]["image"] = "gregor-broker:1.0.1"
    found = planned(resource)
    for statefulset in objects(found, "StatefulSet").values():
        assert statefulset["spec"]["template"]["spec"]["containers"][0]["image"] == (
            "gregor-broker:1.0.1"
        )


@pytest.mark.parametrize(("delete_claims", "policy"), [(False, "Retain"), (True, "Delete")])
def test_claims_outlive_the_cluster_unless_asked(delete_claims: bool, policy: str) -> None:
    resource = example()
    resource["spec"]["deleteClaims"] = delete_claims
    for statefulset in objects(planned(resource), "StatefulSet").values():
        assert statefulset["spec"]["persistentVolumeClaimRetentionPolicy"] == {
            "whenDeleted": policy,
            "whenScaled": "Retain",
        }


def test_drift_is_put_back_because_the_plan_never_depends_on_the_objects_it_owns() -> None:
    """What a user edits in an owned object is not an input: the plan is the same, and the
    adapter applies it over the edit (server-side apply under the operator's field manager)."""
    resource = example()
    assert (
        planned(resource, running(CURRENT), HEALTHY).objects
        == planned(resource, running(CURRENT, not_ready=["gregor-broker-1"]), HEALTHY).objects
    )


# -- invalid specs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"combined": {"replicas": 1}}, "give either combined, or controllers and brokers"),
        ({"brokers": {"replicas": 0}}, "spec.brokers.replicas"),
        ({"config": {"node.id": 3}}, "node.id, which the operator sets itself"),
        ({"config": {"log.retention.hour": 3}}, "spec.config.log.retention.hour"),
        (
            {"listeners": [{"name": "ext", "port": 9094, "type": "nodeport"}]},
            "an internal listener",
        ),
        ({"brokers": "three"}, "spec.brokers"),
        (
            {"controllers": {"replicas": 3, "storage": {"type": "ephemeral"}}},
            "spec.controllers: Value error, ephemeral storage is for brokers only: a voter's "
            "metadata log is lost with its pod",
        ),
        (
            {"config": {"log.retention.ms": -5}},
            "controller configuration: invalid value '-5' for configuration log.retention.ms",
        ),
    ],
)
def test_an_invalid_spec_gives_a_condition_and_applies_nothing(
    change: dict[str, Any], message: str
) -> None:
    resource = example()
    resource["spec"] |= change
    found = planned(resource, running(CURRENT), HEALTHY)
    assert found.objects == []
    assert found.restart is None
    ready = condition(found, "Ready")
    assert ready.status == "False"
    assert ready.reason in ("InvalidSpec", "NotSupportedYet")
    assert message in ready.message


# -- rolling restarts -------------------------------------------------------------------------


def test_a_healthy_cluster_at_its_revisions_is_ready_and_restarts_nothing() -> None:
    found = planned(example(), running(CURRENT), HEALTHY)
    assert found.restart is None
    assert condition(found, "Ready") == ConditionState(
        "Ready", "True", "Ready", "6/6 nodes ready, every broker in sync"
    )
    assert condition(found, "Reconciling").status == "False"
    assert found.requeue_after is None


def test_a_roll_starts_with_the_controllers_and_leaves_the_active_one_last() -> None:
    found = planned(example(), running(ROLLED, pod_revisions=_all_at(CURRENT)), HEALTHY)
    assert restarted(found) == "gregor-controller-0"
    done = _all_at(CURRENT) | {"gregor-controller-0": "rev-c2"}
    found = planned(example(), running(ROLLED, pod_revisions=done), HEALTHY)
    assert restarted(found) == "gregor-controller-2"  # 1 leads
    done |= {"gregor-controller-2": "rev-c2"}
    found = planned(example(), running(ROLLED, pod_revisions=done), HEALTHY)
    assert restarted(found) == "gregor-controller-1"
    done = _all_at(CURRENT) | {f"gregor-controller-{i}": "rev-c2" for i in range(3)}
    found = planned(example(), running(ROLLED, pod_revisions=done), HEALTHY)
    assert restarted(found) == "gregor-broker-0"
    assert condition(found, "Ready").reason == "RollingRestart"
    assert found.events[-1][:2] == ("Normal", "RollingRestart")


def _all_at(revisions: dict[str, str]) -> dict[str, str]:
    return {f"gregor-{role}-{i}": rev for role, rev in revisions.items() for i in range(3)}


def test_a_voter_waits_until_the_dns_has_every_other_voters_new_address() -> None:
    done = _all_at(CURRENT) | {"gregor-controller-0": "rev-c2"}
    observed = running(ROLLED, pod_revisions=done, ready_for={"gregor-controller-0": 5.0})
    found = planned(example(), observed, HEALTHY)
    assert found.restart is None
    assert found.requeue_after == pytest.approx(10.0)  # the usual wait, under the 25 s left
    reconciling = condition(found, "Reconciling")
    assert reconciling.reason == "RollingRestart"
    assert reconciling.message.startswith("restarting gregor-controller-2 in 25 s: ")
    assert "gregor-controller-0 was restarted 5 s ago" in reconciling.message
    nearly = running(ROLLED, pod_revisions=done, ready_for={"gregor-controller-0": 27.5})
    assert planned(example(), nearly, HEALTHY).requeue_after == pytest.approx(2.5)
    settled = running(ROLLED, pod_revisions=done, ready_for={"gregor-controller-0": 30.0})
    assert restarted(planned(example(), settled, HEALTHY)) == "gregor-controller-2"


def test_brokers_do_not_wait_for_the_dns_but_for_their_partitions() -> None:
    done = _all_at(ROLLED) | {"gregor-broker-1": "rev-b1", "gregor-broker-2": "rev-b1"}
    observed = running(ROLLED, pod_revisions=done, ready_for={"gregor-broker-0": 1.0})
    assert restarted(planned(example(), observed, HEALTHY)) == "gregor-broker-1"


def test_a_combined_node_is_a_voter_and_waits_for_the_dns_too() -> None:
    resource = example("kafkacluster-combined.yaml")
    resource["spec"]["combined"]["replicas"] = 3
    pods = [
        PodState(
            f"gregor-dev-combined-{i}",
            "combined",
            i,
            True,
            "rev-2" if i == 0 else "rev-1",
            ready_for_s=4.0 if i == 0 else 3600.0,
        )
        for i in range(3)
    ]
    observed = Observed({"combined": StatefulSetState(3, "rev-2", None)}, pods)
    facts = BrokerFacts({0: "Unfenced", 1: "Unfenced", 2: "Unfenced"}, verdicts=clear(0, 1, 2))
    assert planned(resource, observed, facts).restart is None
    pods[0] = dataclasses.replace(pods[0], ready_for_s=40.0)
    found = planned(resource, Observed(observed.statefulsets, pods), facts)
    assert restarted(found) == "gregor-dev-combined-1"


def test_a_roll_waits_for_the_restarted_pod_to_be_ready_again() -> None:
    pods = _all_at(CURRENT) | {"gregor-controller-0": "rev-c2"}
    found = planned(
        example(), running(ROLLED, pod_revisions=pods, not_ready=["gregor-controller-0"]), HEALTHY
    )
    assert found.restart is None
    assert condition(found, "Ready").reason == "NodesNotReady"


def test_a_roll_never_deletes_a_second_pod_while_one_is_going() -> None:
    observed = running(ROLLED, pod_revisions=_all_at(CURRENT), deleting=["gregor-controller-0"])
    assert planned(example(), observed, HEALTHY).restart is None


def test_a_broker_is_restarted_only_when_its_verdict_clears_it() -> None:
    """An under-replicated partition holds the brokers that have a replica of it, not the
    roll: broker 0 is passed over for broker 1, and nothing moves without verdicts."""
    pods = _all_at(CURRENT) | {f"gregor-controller-{i}": "rev-c2" for i in range(3)}
    observed = running(ROLLED, pod_revisions=pods)
    blocked = Verdict((0,), safe=False, blocking=("orders-3 (P3: 1 in-sync replica(s) …)",))
    lagging = dataclasses.replace(
        HEALTHY, under_replicated=1, verdicts=clear(*NODE_IDS) | {(0,): blocked}
    )
    found = planned(example(), observed, lagging)
    assert restarted(found) == "gregor-broker-1"
    every_broker_blocked: dict[tuple[int, ...], Verdict] = {
        (n,): dataclasses.replace(blocked, nodes=(n,)) for n in (0, 1, 2)
    }
    held = planned(example(), observed, dataclasses.replace(lagging, verdicts=every_broker_blocked))
    assert held.restart is None
    assert "gregor-broker-0: orders-3 (P3: 1 in-sync replica(s) …)" in (
        condition(held, "Reconciling").message
    )
    assert planned(example(), observed, None).restart is None
    unasked = dataclasses.replace(HEALTHY, verdicts={})
    assert planned(example(), observed, unasked).restart is None
    assert restarted(planned(example(), observed, HEALTHY)) == "gregor-broker-0"


def test_brokers_of_one_rack_restart_together_once_a_verdict_clears_them_as_a_batch() -> None:
    """`spec.rollout.maxParallel: 2`, brokers 0 and 2 in zone-a: broker 0 is cleared alone,
    the plan asks of 0 and 2 together and, cleared, restarts both (an Event each); broker 1
    (zone-b) never joins them. Without an answer, broker 0 goes alone."""
    resource = example()
    resource["spec"]["rollout"] = {"maxParallel": 2}
    pods = _all_at(CURRENT) | {f"gregor-controller-{i}": "rev-c2" for i in range(3)}
    observed = running(ROLLED, pod_revisions=pods)
    zones = {"gregor-broker-0": "zone-a", "gregor-broker-1": "zone-b", "gregor-broker-2": "zone-a"}
    observed = dataclasses.replace(
        observed,
        pods=[dataclasses.replace(pod, rack=zones.get(pod.name)) for pod in observed.pods],
    )
    first = planned(resource, observed, HEALTHY)
    assert [r.pod for r in first.restarts] == ["gregor-broker-0"]
    assert [(ask.nodes, ask.pods) for ask in first.asks] == [
        ((0, 2), ("gregor-broker-0", "gregor-broker-2"))
    ]
    together = dataclasses.replace(
        HEALTHY, verdicts={**HEALTHY.verdicts, (0, 2): Verdict((0, 2), safe=True)}
    )
    batch = planned(resource, observed, together)
    assert [r.pod for r in batch.restarts] == ["gregor-broker-0", "gregor-broker-2"]
    assert batch.asks == []
    assert [e[2] for e in batch.events if e[1] == "RollingRestart"] == [
        "restarting gregor-broker-0: its configuration or image changed",
        "restarting gregor-broker-2: its configuration or image changed",
    ]
    rollout = batch.status["rollout"]
    assert [(e["pod"], e["state"]) for e in rollout["pods"]] == [
        ("gregor-broker-0", "Restarting"),
        ("gregor-broker-2", "Restarting"),
        ("gregor-broker-1", "Pending"),
    ]
    refused = dataclasses.replace(
        HEALTHY, verdicts={**HEALTHY.verdicts, (0, 2): Verdict((0, 2), safe=False)}
    )
    assert [r.pod for r in planned(resource, observed, refused).restarts] == ["gregor-broker-0"]
    resource["spec"]["rollout"] = {"maxParallel": 0}
    assert condition(planned(resource, observed, HEALTHY), "Ready").reason == "InvalidSpec"


def test_a_drain_waits_for_the_roll_to_move_brokers_and_may_evict_one_controller() -> None:
    """Evictions: the controllers' budget allows one, the brokers' none. A broker on a
    cordoned node is restarted by the roll instead, once its verdict clears it; a controller
    there is left to the drain's eviction. A broker pod already gone from it is not due."""
    found = planned(example())
    budgets = {
        o["metadata"]["name"]: o["spec"]
        for o in found.objects
        if o["kind"] == "PodDisruptionBudget"
    }
    assert budgets == {
        "gregor-controller": {
            "maxUnavailable": 1,
            "selector": {
                "matchLabels": {"gregor.dev/cluster": "gregor", "gregor.dev/pool": "controller"}
            },
        },
        "gregor-broker": {
            "maxUnavailable": 0,
            "selector": {
                "matchLabels": {"gregor.dev/cluster": "gregor", "gregor.dev/pool": "broker"}
            },
        },
    }
    nodes = {"gregor-controller-2": "worker-a", "gregor-broker-1": "worker-a"}
    observed = running(CURRENT)
    observed = dataclasses.replace(
        observed,
        pods=[
            dataclasses.replace(pod, node=nodes.get(pod.name, "worker-b")) for pod in observed.pods
        ],
        cordoned=frozenset({"worker-a"}),
    )
    drained = planned(example(), observed, HEALTHY)
    assert restarted(drained) == "gregor-broker-1"
    assert drained.restart is not None
    assert drained.restart.reason == "its node worker-a is cordoned (drained)"
    assert [e["pod"] for e in drained.status["rollout"]["pods"]] == ["gregor-broker-1"]
    blocked = Verdict((1,), safe=False, blocking=("orders-0 (P3: …)",))
    held = planned(
        example(),
        observed,
        dataclasses.replace(HEALTHY, verdicts={**HEALTHY.verdicts, (1,): blocked}),
    )
    assert held.restart is None
    assert "gregor-broker-1: orders-0 (P3: …)" in condition(held, "Reconciling").message
    moved = dataclasses.replace(
        observed,
        pods=[
            dataclasses.replace(pod, node="worker-b" if pod.name == "gregor-broker-1" else pod.node)
            for pod in observed.pods
        ],
    )
    assert planned(example(), moved, HEALTHY).restart is None


def test_a_drained_broker_goes_while_the_drain_keeps_its_evicted_controller_away() -> None:
    """The drain evicted the node's controller, whose volume keeps it unscheduled until the
    node is back: the node's two brokers (one zone) still go together when their verdict
    says so, or the drain would wait for ever; nothing else restarts meanwhile."""
    resource = example()
    resource["spec"]["rollout"] = {"maxParallel": 2}
    observed = running(CURRENT, not_ready=["gregor-controller-2"])
    on_a = {"gregor-broker-0", "gregor-broker-2"}
    observed = dataclasses.replace(
        observed,
        pods=[
            dataclasses.replace(
                pod,
                node="worker-a" if pod.name in on_a else None if pod.ready is False else "worker-b",
                rack="zone-a" if pod.name in on_a else "zone-b",
                stuck="Unschedulable" if not pod.ready else None,
            )
            for pod in observed.pods
        ],
        cordoned=frozenset({"worker-a"}),
    )
    facts = dataclasses.replace(
        HEALTHY, verdicts={**HEALTHY.verdicts, (0, 2): Verdict((0, 2), safe=True)}
    )
    found = planned(resource, observed, facts)
    assert [r.pod for r in found.restarts] == ["gregor-broker-0", "gregor-broker-2"]
    assert {r.reason for r in found.restarts} == {"its node worker-a is cordoned (drained)"}
    blocked = dataclasses.replace(
        HEALTHY,
        verdicts={
            **HEALTHY.verdicts,
            (0,): Verdict((0,), safe=False),
            (2,): Verdict((2,), safe=False),
        },
    )
    assert planned(resource, observed, blocked).restarts == ()
    uncordoned = dataclasses.replace(observed, cordoned=frozenset())
    held = planned(resource, uncordoned, facts)
    assert held.restarts == ()


def test_a_voter_whose_quorum_verdict_blocks_holds_the_whole_roll() -> None:
    """Voters are not passed over: the brokers wait for the quorum's roll."""
    observed = running(ROLLED, pod_revisions=_all_at(CURRENT))
    lagging = Verdict((1000,), safe=False, quorum_risk="1 caught-up voter(s) would stay")
    facts = dataclasses.replace(HEALTHY, verdicts=clear(*NODE_IDS) | {(1000,): lagging})
    found = planned(example(), observed, facts)
    assert found.restart is None
    assert "the metadata quorum: 1 caught-up voter(s) would stay" in (
        condition(found, "Reconciling").message
    )


def test_a_missing_pod_holds_every_restart() -> None:
    """A controller the StatefulSet has not recreated yet: restarting another would leave one
    voter of three."""
    observed = running(ROLLED, pod_revisions=_all_at(CURRENT))
    gone = Observed(
        observed.statefulsets, [p for p in observed.pods if p.name != "gregor-controller-0"]
    )
    found = planned(example(), gone, HEALTHY)
    assert found.restart is None
    assert condition(found, "Ready").message == ("5/6 nodes ready; waiting for 1 not created yet")


def test_controllers_that_run_but_are_none_ready_are_a_quorum_not_formed() -> None:
    controllers = [f"gregor-controller-{i}" for i in range(3)]
    found = planned(example(), running(CURRENT, not_ready=controllers))
    ready = condition(found, "Ready")
    assert (ready.status, ready.reason) == ("False", "QuorumNotFormed")
    assert "have not elected a leader" in ready.message
    # One controller restarting while the others lead is an ordinary wait.
    one = condition(planned(example(), running(CURRENT, not_ready=controllers[:1])), "Ready")
    assert one.reason == "NodesNotReady"
    # Controllers that started seconds ago may simply not have elected one yet.
    starting = running(CURRENT, not_ready=controllers)
    starting = Observed(
        starting.statefulsets,
        [
            dataclasses.replace(p, running_for_s=10.0 if p.pool == "controller" else 1e9)
            for p in starting.pods
        ],
    )
    assert condition(planned(example(), starting), "Ready").reason == "NodesNotReady"


def test_a_stuck_pod_on_an_old_revision_is_restarted_first() -> None:
    observed = running(
        ROLLED,
        pod_revisions=_all_at(CURRENT),
        not_ready=["gregor-broker-2"],
        stuck={"gregor-broker-2": "CrashLoopBackOff"},
    )
    found = planned(example(), observed, None)
    assert found.restart == Restart(
        "gregor-broker-2", "it is stuck (CrashLoopBackOff) on an old revision"
    )
    assert condition(found, "Ready").reason == "NodesStuck"


# -- volumes ----------------------------------------------------------------------------------

EVERY_NODE = [0, 1, 2, 1000, 1001, 1002]
LOST = (
    "the metadata log dir /var/lib/gregor/log is not formatted: it has no meta.properties. A "
    "new node's dirs are formatted once, before its first start: …"
)


def _changed(observed: Observed, pod: str, **changes: Any) -> Observed:
    pods = [dataclasses.replace(p, **changes) if p.name == pod else p for p in observed.pods]
    return Observed(observed.statefulsets, pods, observed.services)


def _seen(resource: dict[str, Any], found: Plan) -> dict[str, Any]:
    """The resource as the next reconciliation reads it: with the status `found` wrote."""
    return resource | {"status": found.status}


def _listed(found: Plan, statefulset: str) -> list[int]:
    text = objects(found, "ConfigMap")[f"{statefulset}-config"]["data"]["formatted"]
    return [int(line) for line in text.splitlines()]


def _gregor_commands(found: Plan, statefulset: str, ordinal: int) -> list[str]:
    return [command[0] for command in _pod_commands(found, statefulset, ordinal)]


def test_a_new_node_formats_its_volume_and_a_node_that_ran_does_not() -> None:
    resource = example()
    fresh = planned(resource)
    assert _listed(fresh, "gregor-broker") == []
    assert _gregor_commands(fresh, "gregor-broker", 1) == ["format", "broker"]
    format_command, _ = _pod_commands(fresh, "gregor-controller", 2)
    args = build_parser().parse_args(format_command)
    assert (args.cluster_id, args.ignore_formatted) == (CLUSTER_ID, True)
    assert args.override == ["node.id=1002"]
    # Seen ready, each node is formatted for good: its pods format nothing.
    found = planned(resource, running(CURRENT), HEALTHY)
    assert _listed(found, "gregor-controller") == [1000, 1001, 1002]
    assert _listed(found, "gregor-broker") == [0, 1, 2]
    assert [n["formatted"] for n in found.status["nodes"]] == [True] * 6
    assert _gregor_commands(found, "gregor-broker", 1) == ["broker"]
    gone = planned(_seen(resource, found), Observed(running(CURRENT).statefulsets), None)
    assert _listed(gone, "gregor-broker") == [0, 1, 2], "the status remembers"
    # A new broker of a scale-up formats its own volume; no running pod restarts for it.
    resource["spec"]["brokers"]["replicas"] = 4
    grown = planned(_seen(resource, found), running(CURRENT), HEALTHY)
    assert _listed(grown, "gregor-broker") == [0, 1, 2]
    assert _gregor_commands(grown, "gregor-broker", 3) == ["format", "broker"]
    assert template_hash(grown, "gregor-broker") == template_hash(fresh, "gregor-broker")


def test_a_node_counts_as_formatted_once_ready_or_running_for_a_while() -> None:
    starting = _changed(
        running(CURRENT, not_ready=["gregor-broker-2"]), "gregor-broker-2", running_for_s=5.0
    )
    assert 2 not in _listed(planned(example(), starting), "gregor-broker")
    settled = _changed(starting, "gregor-broker-2", running_for_s=30.0)
    assert 2 in _listed(planned(example(), settled), "gregor-broker")


def test_an_ephemeral_broker_pool_formats_at_every_start() -> None:
    resource = example()
    resource["spec"]["brokers"]["storage"] = {"type": "ephemeral"}
    found = planned(resource, running(CURRENT, claims={"controller": ("1Gi", None)}), HEALTHY)
    assert "formatted" not in objects(found, "ConfigMap")["gregor-broker-config"]["data"]
    assert _gregor_commands(found, "gregor-broker", 1) == ["format", "broker"]
    assert _gregor_commands(found, "gregor-controller", 1) == ["broker"]


def test_a_node_that_finds_its_volume_empty_says_what_to_do() -> None:
    observed = running(CURRENT, not_ready=["gregor-broker-1", "gregor-controller-0"])
    for pod in ("gregor-broker-1", "gregor-controller-0"):
        observed = _changed(observed, pod, stuck="CrashLoopBackOff", last_error=LOST)
    found = planned(example(), observed, None)
    ready = condition(found, "Ready")
    assert (ready.status, ready.reason) == ("False", "VolumeNotFormatted")
    assert ready.message.startswith("4/6 nodes ready; ")
    assert (
        "gregor-broker-1 (node 1) finds its volume empty, lost or replaced: to take a new one, "
        "`kubectl annotate kafkacluster gregor gregor.dev/format-volumes=1`"
    ) in ready.message
    assert "gregor-controller-0 (node 1000, a voter) finds its volume empty" in ready.message
    assert "restore the volume from a backup" in ready.message
    assert found.restart is None
    assert _listed(found, "gregor-broker") == [0, 1, 2]


def test_a_stuck_node_says_why_in_the_status() -> None:
    observed = _changed(
        running(CURRENT, not_ready=["gregor-broker-1"]),
        "gregor-broker-1",
        stuck="CrashLoopBackOff",
        last_error="x" * 400,
    )
    ready = condition(planned(example(), observed, None), "Ready")
    assert ready.reason == "NodesStuck"
    assert f"gregor-broker-1 (CrashLoopBackOff): {'x' * 299}…" in ready.message


def test_a_brokers_new_volume_is_formatted_once_asked_and_the_request_then_goes() -> None:
    resource = example()
    resource["metadata"]["annotations"] = {"gregor.dev/format-volumes": "1"}
    before = planned(example(), running(CURRENT), HEALTHY)
    lost = _changed(
        running(CURRENT, not_ready=["gregor-broker-1"]),
        "gregor-broker-1",
        stuck="CrashLoopBackOff",
        last_error=LOST,
        running_for_s=0.0,
    )
    found = planned(_seen(resource, before), lost, None)
    assert _listed(found, "gregor-broker") == [0, 2]
    assert found.restart == Restart(
        "gregor-broker-1", "its new volume is to be formatted (gregor.dev/format-volumes)"
    )
    assert found.annotations == {}
    assert "its new volume is being formatted" in condition(found, "Ready").message
    assert template_hash(found, "gregor-broker") == template_hash(before, "gregor-broker")
    # Its new pod formats the volume and starts; the request is then done.
    restarted = _changed(lost, "gregor-broker-1", stuck=None, last_error=None)
    assert planned(_seen(resource, found), restarted, None).restart is None
    back = planned(_seen(resource, found), running(CURRENT), HEALTHY)
    assert _listed(back, "gregor-broker") == [0, 1, 2]
    assert back.annotations == {"gregor.dev/format-volumes": None}
    resource["metadata"]["annotations"] = {"gregor.dev/format-volumes": "1, 2,x"}
    some = planned(_seen(resource, found), lost, None)
    assert some.annotations == {"gregor.dev/format-volumes": "1,x"}


def test_a_voters_new_volume_is_refused_with_a_reason() -> None:
    resource = example()
    resource["metadata"]["annotations"] = {"gregor.dev/format-volumes": "1000,7"}
    observed = _changed(
        running(CURRENT, not_ready=["gregor-controller-0"]),
        "gregor-controller-0",
        stuck="CrashLoopBackOff",
        last_error=LOST,
    )
    found = planned(resource, observed, None)
    refused = condition(found, "ChangeRefused")
    assert refused.reason == "FormatRefused"
    assert "node 1000 is a voter of the metadata quorum" in refused.message
    assert "vote as a voter that lost its log" in refused.message
    assert "no node 7 here" in refused.message
    warned = [
        m for kind, reason, m in found.events if (kind, reason) == ("Warning", "FormatRefused")
    ]
    assert len(warned) == 2
    assert warned[0] in refused.message
    assert _listed(found, "gregor-controller") == [1000, 1001, 1002]
    assert found.restart is None
    assert found.annotations == {}


# -- status -----------------------------------------------------------------------------------


def test_the_status_says_where_to_connect_and_how_each_node_is() -> None:
    found = planned(
        example(),
        running(CURRENT, not_ready=["gregor-broker-2"]),
        BrokerFacts(
            {0: "Unfenced", 1: "Unfenced", 2: "Fenced"},
            0,
            "gregor-controller-0",
            clear(*NODE_IDS),
        ),
    )
    assert found.status["listeners"] == [
        {
            "name": "plain",
            "type": "internal",
            "bootstrapServers": "gregor-bootstrap.team-a.svc.cluster.local:9092",
        }
    ]
    assert found.status["readyNodes"] == "5/6"
    assert found.status["clusterId"] == CLUSTER_ID
    broker = next(n for n in found.status["nodes"] if n["pod"] == "gregor-broker-2")
    assert broker == {
        "nodeId": 2,
        "roles": ["broker"],
        "pod": "gregor-broker-2",
        "ready": False,
        "formatted": True,  # it has run (for an hour)
        "brokerState": "Fenced",
    }
    controller = next(n for n in found.status["nodes"] if n["pod"] == "gregor-controller-0")
    assert controller["nodeId"] == 1000
    assert "brokerState" not in controller


def test_a_ready_cluster_whose_brokers_cannot_be_asked_is_not_called_ready() -> None:
    ready = condition(planned(example(), running(CURRENT), None), "Ready")
    assert (ready.status, ready.reason) == ("False", "BrokersUnreachable")
    fenced = BrokerFacts({0: "Unfenced", 1: "Fenced"}, 0, "gregor-controller-0")
    ready = condition(planned(example(), running(CURRENT), fenced), "Ready")
    assert (ready.reason, ready.message) == (
        "BrokersNotRegistered",
        "brokers not registered and unfenced yet: 1, 2",
    )


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    first = merge_conditions(
        [], [ConditionState("Ready", "False", "NodesNotReady", "1/6")], now="t1", generation=1
    )
    second = merge_conditions(
        first, [ConditionState("Ready", "False", "NodesNotReady", "4/6")], now="t2", generation=1
    )
    third = merge_conditions(
        second, [ConditionState("Ready", "True", "Ready", "6/6")], now="t3", generation=2
    )
    assert [c["lastTransitionTime"] for c in (first[0], second[0], third[0])] == ["t1", "t1", "t3"]
    assert second[0]["message"] == "4/6"
    assert third[0]["observedGeneration"] == 2


# -- status.rollout, pausing, asking for a restart --------------------------------------------


def test_a_paused_roll_restarts_nothing_and_lists_what_is_due() -> None:
    resource = example()
    resource["spec"]["rollout"] = {"paused": True}
    observed = running(ROLLED, pod_revisions=_all_at(CURRENT))
    found = planned(resource, observed, HEALTHY)
    assert found.restart is None
    rollout = found.status["rollout"]
    assert rollout["paused"] is True
    assert rollout["held"] == "paused (spec.rollout.paused)"
    assert [p["pod"] for p in rollout["pods"]][:3] == [
        "gregor-controller-0",
        "gregor-controller-2",
        "gregor-controller-1",  # the active controller last
    ]
    assert {p["state"] for p in rollout["pods"]} == {"Pending"}
    assert "paused" in condition(found, "Reconciling").message
    resource["spec"]["rollout"] = {"paused": False}
    assert restarted(planned(resource, observed, HEALTHY)) == "gregor-controller-0"


def test_a_pod_annotated_for_a_restart_is_restarted_in_its_turn() -> None:
    observed = running(CURRENT)
    pods = [
        dataclasses.replace(pod, restart_requested=pod.name == "gregor-broker-2")
        for pod in observed.pods
    ]
    found = planned(example(), Observed(observed.statefulsets, pods), HEALTHY)
    assert found.restart == Restart("gregor-broker-2", "asked by the gregor.dev/restart annotation")
    assert found.events[-1] == (
        "Normal",
        "RollingRestart",
        "restarting gregor-broker-2: asked by the gregor.dev/restart annotation",
    )


def test_status_rollout_names_the_restarting_pod_until_it_is_back_and_ready() -> None:
    resource = example()
    before = running(ROLLED, pod_revisions=_all_at(ROLLED) | {"gregor-broker-0": "rev-b1"})
    found = planned(resource, before, HEALTHY)
    assert found.status["rollout"]["pods"] == [
        {
            "pod": "gregor-broker-0",
            "reason": "its configuration or image changed",
            "state": "Restarting",
            "attempts": 1,
        }
    ]
    # The operator restarts: the pod is gone, and only the record says which one it was.
    resource["status"] = {"rollout": found.status["rollout"]}
    gone = Observed(before.statefulsets, [p for p in before.pods if p.name != "gregor-broker-0"])
    again = planned(resource, gone, HEALTHY)
    assert again.restart is None
    assert again.status["rollout"]["pods"][0]["state"] == "Restarting"
    assert again.status["rollout"]["pods"][0]["attempts"] == 1
    starting = running(ROLLED, not_ready=["gregor-broker-0"])
    assert planned(resource, starting, HEALTHY).status["rollout"]["pods"][0]["pod"] == (
        "gregor-broker-0"
    )
    back = planned(resource, running(ROLLED), HEALTHY)
    assert back.status["rollout"] is None  # nothing due: the roll is over


def test_rack_awareness_says_why_a_broker_waits_and_never_changes_a_running_brokers_rack() -> None:
    pods = [dataclasses.replace(pod, node="worker-0") for pod in running(CURRENT).pods]
    pods[3] = dataclasses.replace(pods[3], rack="zone-old")  # told before its node moved zone
    empty = Observed(running(CURRENT).statefulsets, pods, node_labels={"worker-0": {ZONE: ""}})
    found = planned(with_rack(), empty, HEALTHY)
    assert found.pod_annotations == {}
    assert ("Warning", "RackLabelMissing") in [event[:2] for event in found.events]
    moved = Observed(empty.statefulsets, pods, node_labels={"worker-0": {ZONE: "zone-new"}})
    told = planned(with_rack(), moved, HEALTHY).pod_annotations
    assert "gregor-broker-0" not in told  # it runs with the rack it was told
    assert told["gregor-broker-1"] == {"gregor.dev/rack": "zone-new"}
    refused = Observed(empty.statefulsets, pods, nodes_refused="403 Forbidden: cannot get node")
    unread = planned(with_rack(), refused, HEALTHY)
    assert ("Warning", "NodesUnreadable") in [event[:2] for event in unread.events]


def test_the_operators_own_pod_annotations_cannot_come_from_the_template() -> None:
    resource = example()
    resource["spec"]["template"] = {
        "annotations": {"gregor.dev/restart": "always", "gregor.dev/rack": "x", "team": "a"}
    }
    template = objects(planned(resource), "StatefulSet")["gregor-broker"]["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["team"] == "a"
    assert "gregor.dev/restart" not in annotations
    assert "gregor.dev/rack" not in annotations
