"""The cluster add-ons every test relies on, as manifests: CoreDNS behind the `kube-dns`
Service (so headless-Service per-pod names resolve) and the local-path provisioner behind the
default StorageClass `standard` (so StatefulSet volume claims bind).

Both run images built on this machine (`localkube.images`) with `imagePullPolicy: Never`: a
missing image is an error to see at once, not a pull that can never succeed.
"""

from __future__ import annotations

import json
from typing import Any

from .config import CLUSTER_DOMAIN, DNS_SERVICE_IP

__all__ = ["coredns", "local_path_provisioner", "service_account"]

Manifest = dict[str, Any]

LOCAL_PATH_ACCOUNT = "local-path-provisioner"


def _deployment(
    namespace: str, name: str, account: str, container: Manifest, volumes: list[Manifest]
) -> Manifest:
    labels = {"k8s-app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": account,
                    "priorityClassName": "system-cluster-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def service_account(namespace: str, name: str, rules: list[Manifest]) -> list[Manifest]:
    """A ServiceAccount with a ClusterRole of `rules` bound to it (`gregor-local:<name>`)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"gregor-local:{name}"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"gregor-local:{name}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"gregor-local:{name}",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


def coredns(image: str) -> list[Manifest]:
    corefile = f""".:53 {{
    errors
    health {{
        lameduck 5s
    }}
    ready
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
}}
"""
    container = {
        "name": "coredns",
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
        },
    }
    deployment = _deployment(
        "kube-system",
        "coredns",
        "coredns",
        container,
        [{"name": "config", "configMap": {"name": "coredns"}}],
    )
    deployment["spec"]["template"]["spec"]["dnsPolicy"] = "Default"
    rules = [
        {
            "apiGroups": [""],
            "resources": ["endpoints", "services", "pods", "namespaces"],
            "verbs": ["list", "watch"],
        },
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["list", "watch"],
        },
    ]
    return [
        *service_account("kube-system", "coredns", rules),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": corefile},
        },
        deployment,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "kube-dns",
                "namespace": "kube-system",
                "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"},
            },
            "spec": {
                "selector": {"k8s-app": "coredns"},
                "clusterIP": DNS_SERVICE_IP,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                ],
            },
        },
    ]


def local_path_provisioner(image: str, helper_image: str, volumes: str) -> list[Manifest]:
    namespace = "local-path-storage"
    config = {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [volumes]}]}
    helper_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "helper-pod", "image": helper_image, "imagePullPolicy": "Never"}
            ],
        },
    }
    container = {
        "name": "local-path-provisioner",
        "image": image,
        "imagePullPolicy": "Never",
        "command": [
            "local-path-provisioner",
            "--debug",
            "start",
            "--config",
            "/etc/config/config.json",
            "--helper-image",
            helper_image,
            # Its helper pods (mkdir / rm of each volume) run under this account too.
            "--service-account-name",
            LOCAL_PATH_ACCOUNT,
        ],
        "env": [
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "CONFIG_MOUNT_PATH", "value": "/etc/config/"},
        ],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/config/"}],
    }
    rules = [
        {
            "apiGroups": [""],
            "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["persistentvolumes", "pods"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {
            "apiGroups": ["storage.k8s.io"],
            "resources": ["storageclasses"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        *service_account(namespace, LOCAL_PATH_ACCOUNT, rules),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "local-path-config", "namespace": namespace},
            "data": {
                "config.json": json.dumps(config),
                "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n',
                "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
                "helperPod.yaml": json.dumps(helper_pod),
            },
        },
        _deployment(
            namespace,
            "local-path-provisioner",
            LOCAL_PATH_ACCOUNT,
            container,
            [{"name": "config", "configMap": {"name": "local-path-config"}}],
        ),
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": "standard",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "rancher.io/local-path",
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        },
    ]
