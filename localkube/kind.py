"""The kind cluster's documents, as pure functions: the kind config (nodes, zones, containerd
patches), the pod network (a CNI conflist and the agent that writes it on every node), the
default StorageClass, which image goes under which name in a node, and the node image's tag.

Nothing here runs a command or touches Docker: `kind_images` builds the images, `kind_cluster`
runs kind and kubectl (docs/adr/0027-kind-nodes.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import addons

__all__ = [
    "CLUSTER_NAME",
    "POD_SUBNET",
    "ZONES",
    "ZONE_LABEL",
    "cni_conflist",
    "cni_manifests",
    "kind_config",
    "node_image_tag",
    "node_names",
    "preload_names",
    "storage_manifests",
]

Manifest = dict[str, Any]

CLUSTER_NAME = "gregor"
"""The kind cluster's name: its nodes are the containers gregor-control-plane, gregor-worker,
gregor-worker2, …"""
NODE_IMAGE_REPOSITORY = "gregor/kind-node"
ZONE_LABEL = "topology.kubernetes.io/zone"
ZONES = ("zone-a", "zone-b", "zone-c")
"""Workers are labelled with these in turn, so three workers make three zones."""
POD_SUBNET = "10.244.0.0/16"
SERVICE_SUBNET = "10.96.0.0/16"
LOCAL_PATH_DIR = "/var/local-path-provisioner"
"""Where each node keeps its local volumes: under /var, the node container's own volume."""
CNI_NAMESPACE = "kube-system"
CNI_NAME = "gregor-cni"
CNI_CONF = "/etc/cni/net.d/10-gregor.conflist"
CNI_BRIDGE = "gregor-cni0"

_ROLES_BY_REPOSITORY = {
    "kube-apiserver": "kube-apiserver",
    "kube-controller-manager": "kube-controller-manager",
    "kube-scheduler": "kube-scheduler",
    "kube-proxy": "kube-proxy",
    "etcd": "etcd",
    "coredns": "coredns",
    "pause": "pause",
}


def kind_config(
    node_image: str, workers: int, *, restrict_oom_score_adj: bool, name: str = CLUSTER_NAME
) -> Manifest:
    """kind's Cluster config: one control-plane node and `workers` workers labelled with ZONES
    in turn (none: the control-plane node also runs workloads). kind's own CNI is off (its image
    cannot be pulled; `cni_manifests` is ours). `restrict_oom_score_adj` is for hosts whose root
    lacks CAP_SYS_RESOURCE (ADR 0005): containerd then keeps each container's oom_score_adj at
    or above its own instead of failing every pod. JSON is YAML: kind reads it as it is."""
    if workers < 0:
        raise ValueError(f"workers must be 0 or more, not {workers}")
    nodes: list[Manifest] = [{"role": "control-plane", "image": node_image}]
    for index in range(workers):
        nodes.append(
            {
                "role": "worker",
                "image": node_image,
                "labels": {ZONE_LABEL: ZONES[index % len(ZONES)]},
            }
        )
    config: Manifest = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": name,
        "networking": {
            "disableDefaultCNI": True,
            "podSubnet": POD_SUBNET,
            "serviceSubnet": SERVICE_SUBNET,
        },
        "nodes": nodes,
    }
    if restrict_oom_score_adj:
        config["containerdConfigPatches"] = [
            '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n'
        ]
    return config


def node_names(workers: int, name: str = CLUSTER_NAME) -> list[str]:
    """The node (and container) names kind gives a cluster of one control plane and `workers`
    workers: `<name>-control-plane`, `<name>-worker`, `<name>-worker2`, …"""
    return [f"{name}-control-plane"] + [
        f"{name}-worker" + ("" if index == 0 else str(index + 1)) for index in range(workers)
    ]


def cni_conflist(pod_cidr: str) -> str:
    """The node's CNI network: its pods on one bridge with addresses from the node's podCIDR
    (host-local), a default route through the bridge, and port mappings (hostPort). No ipMasq:
    the agent masquerades only traffic that leaves the cluster's pod subnet, so pods on other
    nodes see each other's own addresses. (containerd adds loopback itself.)"""
    document = {
        "cniVersion": "1.0.0",
        "name": "gregor",
        "plugins": [
            {
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isDefaultGateway": True,
                "hairpinMode": True,
                "ipMasq": False,
                # isDefaultGateway gives each pod its default route: no `routes` here too.
                "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidr}]]},
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(document, indent=2)


def cni_manifests(image: str, pod_subnet: str = POD_SUBNET, period: int = 5) -> list[Manifest]:
    """The pod network agent (images/cluster/kind-cni/agent) as a DaemonSet on every node, with
    the right to read nodes and the conflist template it fills in with the node's podCIDR."""
    labels = {"k8s-app": CNI_NAME}
    template = cni_conflist("@POD_CIDR@")
    container = {
        "name": "agent",
        "image": image,
        "imagePullPolicy": "Never",
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_SUBNET", "value": pod_subnet},
            {"name": "CONFLIST_TEMPLATE", "value": "/etc/gregor-cni/conflist"},
            {"name": "CNI_CONF", "value": CNI_CONF},
            {"name": "PERIOD", "value": str(period)},
        ],
        "securityContext": {"privileged": True},
        "resources": {"requests": {"cpu": "10m", "memory": "20Mi"}},
        "volumeMounts": [
            {"name": "cni-conf", "mountPath": "/etc/cni/net.d"},
            {"name": "template", "mountPath": "/etc/gregor-cni", "readOnly": True},
            {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
        ],
    }
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": CNI_NAME, "namespace": CNI_NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 3}},
            "template": {
                # A new template restarts the agents, which write the new conflist at once.
                "metadata": {
                    "labels": labels,
                    "annotations": {"gregor.dev/conflist-sha256": _sha256(template)},
                },
                "spec": {
                    "hostNetwork": True,
                    "serviceAccountName": CNI_NAME,
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [container],
                    "volumes": [
                        _host_path("cni-conf", "/etc/cni/net.d", "DirectoryOrCreate"),
                        {"name": "template", "configMap": {"name": CNI_NAME}},
                        _host_path("xtables-lock", "/run/xtables.lock", "FileOrCreate"),
                    ],
                },
            },
        },
    }
    nodes = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    return [
        *addons.service_account(CNI_NAMESPACE, CNI_NAME, nodes),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CNI_NAME, "namespace": CNI_NAMESPACE},
            "data": {"conflist": template},
        },
        daemonset,
    ]


def _host_path(name: str, path: str, kind: str) -> Manifest:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def storage_manifests(provisioner_image: str, helper_image: str) -> list[Manifest]:
    """local-path-provisioner behind the default StorageClass `standard` (WaitForFirstConsumer,
    so a volume is made on the node its pod is scheduled to), with our images: what kind applies
    from the node image's /kind/manifests/default-storage.yaml."""
    return addons.local_path_provisioner(provisioner_image, helper_image, LOCAL_PATH_DIR)


def manifest_list(manifests: Sequence[Manifest]) -> str:
    """One `kind: List` document (JSON, which kubectl and kind read as YAML)."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(manifests)}, indent=1)


def preload_names(kubeadm_images: Sequence[str], sandbox_image: str) -> dict[str, str]:
    """Under which name each of our images goes into a node, by role: the names `kubeadm config
    images list` prints, with the pause image replaced by the containerd config's sandbox image
    (the one the runtime really asks for). Raises ValueError for an image we do not build."""
    names: dict[str, str] = {}
    for reference in [*kubeadm_images, sandbox_image]:
        repository = reference.rsplit(":", 1)[0].rsplit("/", 1)[-1]
        role = _ROLES_BY_REPOSITORY.get(repository)
        if role is None:
            raise ValueError(f"kubeadm asks for {reference}, which localkube does not build")
        names[role] = reference  # the sandbox image comes last and wins for pause
    missing = sorted(set(_ROLES_BY_REPOSITORY.values()) - set(names))
    if missing:
        raise ValueError(f"kubeadm's image list names no {', '.join(missing)}")
    return names


def node_image_tag(kubernetes_version: str, inputs: Mapping[str, str]) -> str:
    """`gregor/kind-node:<kubernetes version>-<fingerprint>`: the fingerprint is the first 12 hex
    digits of a SHA-256 over every input (name → image id, binary digest or document text), so
    a node image is rebuilt exactly when one of them changes."""
    digest = hashlib.sha256(json.dumps(dict(inputs), sort_keys=True).encode()).hexdigest()
    return f"{NODE_IMAGE_REPOSITORY}:{kubernetes_version}-{digest[:12]}"
