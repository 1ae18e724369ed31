"""The operator against the real API server: `gregor operator` runs on this machine, watching
one namespace of the local cluster, and this checks the objects it creates for a
`KafkaCluster` (labels, owner references, the server-side apply field manager, probes), the
status it writes, that it puts back what a user changes in an owned object while keeping what
other tools add, that an invalid spec gets a condition and changes nothing, that a voter whose
volume is lost does not come back on a new one, and that clients outside the cluster reach
the brokers through NodePort and LoadBalancer listeners.

The operator cannot reach the brokers from outside the cluster (their DNS names resolve only
inside it), so here a cluster is never called Ready: `BrokersUnreachable` is the honest answer.
The whole stack, with the operator in a pod, is the Helm e2e test's."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from e2e.conftest import ARTIFACTS, Kubectl
from e2e.resources import condition, eventually, get
from tests.integration.clients import QUIET, create_topic, read_all
from tests.support.nodes import free_port

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "gregor-dev"


@pytest.fixture
def operator(
    kubeconfig: Path, namespace: str, crds: None, broker_image: str, tmp_path: Path
) -> Iterator[str]:
    """`gregor operator` for the test's namespace; yields its metrics URL."""
    metrics = free_port()
    log = (tmp_path / "operator.log").open("w")
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("gregor")),
            "operator",
            "--namespace",
            namespace,
            "--liveness",
            f"http://127.0.0.1:{free_port()}/healthz",
            "--metrics-port",
            str(metrics),
        ],
        env=os.environ
        | {
            "KUBECONFIG": str(kubeconfig),
            "GREGOR_BROKER_IMAGE": broker_image,
            "GREGOR_RECONCILE_INTERVAL_S": "2",
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{metrics}/metrics"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        kept = ARTIFACTS / namespace
        kept.mkdir(parents=True, exist_ok=True)
        (kept / "operator.log").write_text((tmp_path / "operator.log").read_text())


def apply_example(kubectl: Kubectl, namespace: str, change: dict[str, Any] | None = None) -> None:
    document = yaml.safe_load((ROOT / "examples" / "kafkacluster-combined.yaml").read_text())
    document["spec"] |= change or {}
    kubectl(
        "apply",
        "--server-side",
        "--field-manager=gitops",
        "-f",
        "-",
        namespace=namespace,
        stdin=json.dumps(document),
    )


def test_the_operator_creates_a_clusters_objects_and_keeps_them_as_the_spec_says(
    operator: str, kubectl: Kubectl, namespace: str
) -> None:
    apply_example(kubectl, namespace)
    cluster = get(kubectl, namespace, "kafkacluster", CLUSTER)
    assert cluster is not None
    uid = cluster["metadata"]["uid"]
    owned = {
        "statefulset": f"{CLUSTER}-combined",
        "configmap": f"{CLUSTER}-combined-config",
        "service": f"{CLUSTER}-bootstrap",
        "poddisruptionbudget": f"{CLUSTER}-combined",
        "secret": f"{CLUSTER}-cluster-id",
        "serviceaccount": f"{CLUSTER}-node",
    }
    for kind, name in owned.items():
        found = eventually(f"{kind}/{name}", functools.partial(get, kubectl, namespace, kind, name))
        metadata = found["metadata"]
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "gregor-operator", kind
        assert [(o["kind"], o["uid"]) for o in metadata["ownerReferences"]] == [
            ("KafkaCluster", uid)
        ], kind
        managers = {(m["manager"], m["operation"]) for m in metadata["managedFields"]}
        assert ("gregor-operator", "Apply") in managers, (kind, managers)
    statefulset = get(kubectl, namespace, "statefulset", f"{CLUSTER}-combined")
    assert statefulset is not None
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert statefulset["spec"]["updateStrategy"]["type"] == "OnDelete"

    # The status: written with the generation it was computed from; the node becomes ready.
    def node_ready() -> dict[str, Any] | None:
        found = get(kubectl, namespace, "kafkacluster", CLUSTER)
        status = (found or {}).get("status") or {}
        return found if status.get("readyNodes") == "1/1" else None

    cluster = eventually("the node to be ready", node_ready, timeout=180)
    status = cluster["status"]
    assert status["observedGeneration"] == cluster["metadata"]["generation"]
    assert status["listeners"][0]["bootstrapServers"].startswith(f"{CLUSTER}-bootstrap.")
    assert status["nodes"] == [
        {
            "nodeId": 0,
            "roles": ["broker", "controller"],
            "pod": f"{CLUSTER}-combined-0",
            "ready": True,
            "formatted": True,
        }
    ]
    ready = condition(cluster, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "BrokersUnreachable")
    listed = kubectl("get", "kc", namespace=namespace)
    assert "1/1" in listed, listed
    assert f"{CLUSTER}-bootstrap.{namespace}.svc" in listed, listed

    # Drift: a deleted ConfigMap comes back, an edited selector is put back, and a label
    # another tool adds survives.
    kubectl("delete", "configmap", f"{CLUSTER}-combined-config", namespace=namespace)
    kubectl(
        "patch",
        "service",
        f"{CLUSTER}-bootstrap",
        "--type=merge",
        "-p",
        '{"spec": {"selector": {"gregor.dev/broker": "false"}}}',
        namespace=namespace,
    )
    kubectl("label", "statefulset", f"{CLUSTER}-combined", "team=payments", namespace=namespace)
    eventually(
        "the ConfigMap to come back",
        lambda: get(kubectl, namespace, "configmap", f"{CLUSTER}-combined-config"),
    )

    def selector_restored() -> bool:
        service = get(kubectl, namespace, "service", f"{CLUSTER}-bootstrap") or {}
        return bool(service.get("spec", {}).get("selector", {}).get("gregor.dev/broker") == "true")

    eventually("the Service's selector to be put back", selector_restored)
    statefulset = get(kubectl, namespace, "statefulset", f"{CLUSTER}-combined")
    assert statefulset is not None
    assert statefulset["metadata"]["labels"]["team"] == "payments"

    with urllib.request.urlopen(operator, timeout=10) as response:
        metrics = response.read().decode()
    assert 'gregor_operator_reconciliations_total{resource="kafkacluster",result="ok"}' in metrics
    assert "gregor_operator_oldest_reconciliation_seconds" in metrics


def test_an_invalid_spec_gets_a_condition_and_changes_nothing(
    operator: str, kubectl: Kubectl, namespace: str
) -> None:
    apply_example(kubectl, namespace)
    statefulset = eventually(
        "the StatefulSet",
        lambda: get(kubectl, namespace, "statefulset", f"{CLUSTER}-combined"),
    )
    template = statefulset["spec"]["template"]
    # The schema allows it (an integer); the broker would refuse it at start.
    apply_example(kubectl, namespace, {"config": {"log.retention.ms": -5}})

    def refused() -> dict[str, Any] | None:
        found = get(kubectl, namespace, "kafkacluster", CLUSTER) or {}
        ready = condition(found, "Ready")
        return ready if ready is not None and ready["reason"] == "InvalidSpec" else None

    ready = eventually("an InvalidSpec condition", refused)
    assert "log.retention.ms" in ready["message"]
    assert "must be at least -1" in ready["message"]
    statefulset = get(kubectl, namespace, "statefulset", f"{CLUSTER}-combined")
    assert statefulset is not None
    assert statefulset["spec"]["template"] == template
    events = kubectl(
        "get",
        "events",
        "--field-selector",
        "reason=InvalidSpec",
        "-o",
        "json",
        namespace=namespace,
    )
    assert any("log.retention.ms" in e["message"] for e in json.loads(events)["items"])


def test_a_voter_that_lost_its_volume_does_not_start_on_a_new_one(
    operator: str, kubectl: Kubectl, namespace: str
) -> None:
    """The operator formats a new node's volume only. The combined node, a voter, runs on a
    formatted volume; emptied (as a replaced volume is), its next pod formats nothing, its
    node refuses to start, and the status says why and what to do; asked to format it
    anyway, the operator refuses with a reason."""
    apply_example(kubectl, namespace)
    pod = f"{CLUSTER}-combined-0"

    def formatted() -> bool:
        status = (get(kubectl, namespace, "kafkacluster", CLUSTER) or {}).get("status") or {}
        return status.get("readyNodes") == "1/1" and status["nodes"][0].get("formatted") is True

    eventually("the node to run on its formatted volume", formatted, timeout=180)
    kubectl("exec", pod, "--", "sh", "-c", "rm -rf /var/lib/gregor/log", namespace=namespace)
    kubectl("delete", "pod", pod, "--wait=true", namespace=namespace)

    def lost() -> dict[str, Any] | None:
        found = condition(get(kubectl, namespace, "kafkacluster", CLUSTER) or {}, "Ready")
        return found if found and found["reason"] == "VolumeNotFormatted" else None

    message = eventually("the status to say the volume is lost", lost, timeout=180)["message"]
    assert f"{pod} (node 0, a voter) finds its volume empty" in message, message
    assert "restore the volume from a backup" in message, message

    def said() -> str | None:
        for previous in ((), ("--previous",)):  # the last run's output, while it waits or runs
            try:
                text = kubectl("logs", pod, *previous, namespace=namespace)
            except AssertionError:
                continue
            if "/var/lib/gregor/log is not formatted" in text:
                return text
        return None

    assert "Node 0 is a voter of the metadata quorum" in eventually("the node's refusal", said)
    kubectl("annotate", "kafkacluster", CLUSTER, "gregor.dev/format-volumes=0", namespace=namespace)

    def refused() -> dict[str, Any] | None:
        found = condition(get(kubectl, namespace, "kafkacluster", CLUSTER) or {}, "ChangeRefused")
        return found if found and found["reason"] == "FormatRefused" else None

    refusal = eventually("the request to be refused", refused)["message"]
    assert "node 0 is a voter of the metadata quorum" in refusal, refusal


def test_topics_wait_for_their_cluster_and_an_invalid_one_says_why(
    operator: str, kubectl: Kubectl, namespace: str
) -> None:
    """Seen from outside the cluster, no KafkaCluster here is ready: each Topic waits with a
    condition of its own, an invalid one says what is wrong, and neither holds up the other;
    a Topic whose cluster does not exist is deleted at once (nothing to delete in Kafka)."""
    topics: list[dict[str, Any]] = [
        {"metadata": {"name": "orders"}, "spec": {"cluster": CLUSTER, "partitions": 3}},
        {
            "metadata": {"name": "bad"},
            "spec": {"cluster": CLUSTER, "config": {"cleanup.policy": "shred"}},
        },
        {"metadata": {"name": "orphan"}, "spec": {"cluster": "nowhere"}},
    ]
    for topic in topics:
        document = {"apiVersion": "gregor.dev/v1alpha1", "kind": "Topic"} | topic
        kubectl(
            "apply", "--server-side", "-f", "-", namespace=namespace, stdin=json.dumps(document)
        )

    def reason(name: str) -> str | None:
        found = condition(get(kubectl, namespace, "topic", name) or {}, "Ready")
        return None if found is None else str(found["reason"])

    eventually("orders to wait", lambda: reason("orders") == "ClusterNotFound")
    eventually("bad to be refused", lambda: reason("bad") == "InvalidSpec")
    bad = condition(get(kubectl, namespace, "topic", "bad") or {}, "Ready")
    assert bad is not None
    assert "cleanup.policy" in bad["message"]
    apply_example(kubectl, namespace)
    eventually("orders to wait for its cluster", lambda: reason("orders") == "ClusterNotReady")
    orphan = get(kubectl, namespace, "topic", "orphan")
    assert orphan is not None
    assert "gregor.dev/finalizer" in orphan["metadata"]["finalizers"]
    kubectl("delete", "topic", "orphan", "--timeout=60s", namespace=namespace)
    assert get(kubectl, namespace, "topic", "orphan") is None


def _pretend_to_be_the_clouds_load_balancer_controller(kubectl: Kubectl, namespace: str) -> int:
    """A FAKE, named as such: nothing here gives a LoadBalancer Service an address, which a
    cloud's controller does. This writes one into each such Service's status, as that
    controller would; kube-proxy then routes the address to the Service's pods on this
    machine, as the cloud's load balancer would. Returns how many Services have one."""
    found = json.loads(
        kubectl("get", "services", "-l", f"gregor.dev/cluster={CLUSTER}", "-o", "json",
                namespace=namespace)
    )  # fmt: skip
    balanced = sorted(
        (s for s in found["items"] if s["spec"]["type"] == "LoadBalancer"),
        key=lambda s: str(s["metadata"]["name"]),
    )
    for number, service in enumerate(balanced):
        if (service.get("status") or {}).get("loadBalancer", {}).get("ingress"):
            continue
        address = {"status": {"loadBalancer": {"ingress": [{"ip": f"203.0.113.{10 + number}"}]}}}
        kubectl(
            "patch", "service", service["metadata"]["name"], "--subresource=status",
            "--type=merge", "-p", json.dumps(address), namespace=namespace,
        )  # fmt: skip
    return len(balanced)


def test_external_listeners_take_clients_from_outside_the_cluster(
    operator: str, kubectl: Kubectl, namespace: str
) -> None:
    """A NodePort and a LoadBalancer listener: the broker waits for its addresses, then
    advertises them, and a client on this machine (outside the cluster) produces and reads
    back through each."""
    listeners = [
        {"name": "plain", "port": 9092},
        {"name": "direct", "port": 9094, "type": "nodeport"},
        {"name": "cloud", "port": 9095, "type": "loadbalancer"},
    ]
    apply_example(kubectl, namespace, {"listeners": listeners})

    def pending() -> str | None:
        found = condition(get(kubectl, namespace, "kafkacluster", CLUSTER) or {}, "Ready")
        return found["message"] if found and found["reason"] == "ExternalAddressesPending" else None

    message = eventually("the cluster to wait for its load balancer", pending)
    assert message.endswith(f"{CLUSTER}-combined-0-cloud"), message
    assert get(kubectl, namespace, "statefulset", f"{CLUSTER}-combined") is None
    eventually(
        "both LoadBalancer Services",
        lambda: _pretend_to_be_the_clouds_load_balancer_controller(kubectl, namespace) == 2,
    )

    def addresses() -> dict[str, str] | None:
        status = (get(kubectl, namespace, "kafkacluster", CLUSTER) or {}).get("status") or {}
        found = {item["name"]: item["bootstrapServers"] for item in status.get("listeners", [])}
        return found if status.get("readyNodes") == "1/1" and all(found.values()) else None

    bootstrap = eventually("the node to be ready, reachable from outside", addresses, timeout=180)
    pod = get(kubectl, namespace, "pod", f"{CLUSTER}-combined-0")
    assert pod is not None
    node = get(kubectl, namespace, "node", pod["spec"]["nodeName"])  # the broker's own node
    assert node is not None
    node_ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    assert bootstrap["direct"].startswith(f"{node_ip}:"), bootstrap
    assert bootstrap["cloud"] == "203.0.113.10:9095", bootstrap  # the bootstrap Service's
    status = (get(kubectl, namespace, "kafkacluster", CLUSTER) or {})["status"]
    advertised = status["nodes"][0]["addresses"]
    assert advertised["cloud"] == "203.0.113.11:9095", advertised  # its own Service's
    assert advertised["direct"].startswith(f"{node_ip}:"), advertised
    with _routed_to_a_node(LOAD_BALANCED, node_ip):
        for listener in ("direct", "cloud"):
            topic = f"from-{listener}"
            create_topic(bootstrap[listener], topic, 2)
            producer = Producer({"bootstrap.servers": bootstrap[listener], "acks": "all", **QUIET})
            for value in range(200):
                producer.produce(topic, str(value).encode(), partition=value % 2)
            assert producer.flush(30) == 0, listener
            got = read_all(bootstrap[listener], topic, 2, 200)
            assert sorted(int(m.value() or b"-1") for m in got) == list(range(200)), listener


LOAD_BALANCED = "203.0.113.10/31"
"""The addresses the fake load balancer controller hands out (TEST-NET-3)."""


@contextlib.contextmanager
def _routed_to_a_node(network: str, node_ip: str) -> Iterator[None]:
    """Part of the FAKE load balancer: a cloud's balancer carries its address to a node,
    whose kube-proxy takes it to the pods. On the host cluster kube-proxy runs on this
    machine and catches it already; on kind it runs inside the node containers, so this
    machine is told to send the addresses to one (and forgets it after)."""
    local = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True)
    if f" {node_ip}/" in local.stdout:
        yield
        return
    subprocess.run(["ip", "route", "replace", network, "via", node_ip], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "route", "del", network], check=False)


ZONE = "topology.kubernetes.io/zone"


def test_with_rack_awareness_a_broker_starts_with_its_nodes_zone(
    operator: str, kubectl: Kubectl, namespace: str
) -> None:
    """`spec.rack`: the operator reads the label of the node the broker's pod landed on and
    puts it on the pod, which waits for it and starts with it as `broker.rack`; the status
    says it. The pod reads no node (it has no access to any). Nodes without a zone are given
    one for the test (and lose it after); the three-zone spread and placement are the kind
    e2e's."""
    nodes = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
    unzoned = [n["metadata"]["name"] for n in nodes if ZONE not in n["metadata"].get("labels", {})]
    for name in unzoned:
        kubectl("label", "node", name, f"{ZONE}=e2e-zone")
    try:
        apply_example(kubectl, namespace, {"rack": {"topologyKey": ZONE}})
        pod = f"{CLUSTER}-combined-0"

        def racked() -> str | None:
            found = get(kubectl, namespace, "kafkacluster", CLUSTER) or {}
            status_nodes = (found.get("status") or {}).get("nodes") or []
            return status_nodes[0].get("rack") if status_nodes else None

        rack = eventually("the status to give the broker's rack", racked, timeout=180)
        found = get(kubectl, namespace, "pod", pod)
        assert found is not None
        node = get(kubectl, namespace, "node", found["spec"]["nodeName"])  # cluster-wide
        assert node is not None
        assert rack == node["metadata"]["labels"][ZONE]
        assert found["metadata"]["annotations"]["gregor.dev/rack"] == rack
        eventually(
            "the broker to run with broker.rack",
            lambda: (
                f"broker.rack={rack}"
                in kubectl(
                    "exec",
                    pod,
                    "--",
                    "sh",
                    "-c",
                    "tr '\\0' ' ' < /proc/1/cmdline",
                    namespace=namespace,
                )
            ),
            timeout=180,
        )
    finally:
        for name in unzoned:
            kubectl("label", "node", name, f"{ZONE}-")
