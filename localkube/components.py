"""How each component of the local cluster is configured: command lines, config files and
kubeconfigs, as pure functions of the layout, the certificates and the binaries.

The settings are those of a kubeadm single-node cluster, with three deliberate departures for a
test machine: the kubelet never garbage-collects images (nothing can be pulled back), evicts only
when a disk is really full, and tolerates swap; and controllers run without leader election.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .config import (
    API_PORT,
    BRIDGE,
    CLUSTER_DOMAIN,
    DNS_SERVICE_IP,
    NODE_POD_CIDR,
    POD_CIDR,
    SERVICE_CIDR,
    ClusterLayout,
)
from .pki import ClientIdentity, Pki

__all__ = [
    "CLIENTS",
    "apiserver_args",
    "cni_config",
    "containerd_config",
    "controller_manager_args",
    "etcd_args",
    "kube_proxy_args",
    "kubeconfig",
    "kubelet_args",
    "kubelet_config",
    "scheduler_args",
]

CLIENTS = [
    ClientIdentity("admin", "kubernetes-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    ClientIdentity("kube-proxy", "system:kube-proxy"),
    ClientIdentity(
        "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
    ),
    ClientIdentity("apiserver-etcd-client", "kube-apiserver-etcd-client"),
]
"""Client certificates; the kubelet's own (`system:node:<name>`) is added per node."""


def kubelet_identity(node_name: str) -> ClientIdentity:
    return ClientIdentity("kubelet-client", f"system:node:{node_name}", ("system:nodes",))


def kubeconfig(layout: ClusterLayout, pki: Pki, client: str, user: str) -> str:
    """A kubeconfig (JSON is YAML) for `client`'s certificate against the API server."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gregor-local",
                "cluster": {"server": layout.api_server, "certificate-authority": str(pki.ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki.cert(client)),
                    "client-key": str(pki.key(client)),
                },
            }
        ],
        "contexts": [
            {"name": "gregor-local", "context": {"cluster": "gregor-local", "user": user}}
        ],
        "current-context": "gregor-local",
    }
    return json.dumps(document, indent=2)


def etcd_args(etcd: Path, layout: ClusterLayout, pki: Pki) -> list[str | Path]:
    return [
        etcd,
        "--name=default",
        f"--data-dir={layout.state / 'etcd'}",
        "--listen-client-urls=https://127.0.0.1:2379",
        "--advertise-client-urls=https://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380",
        "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=default=http://127.0.0.1:2380",
        "--listen-metrics-urls=http://127.0.0.1:2381",
        f"--cert-file={pki.cert('etcd-server')}",
        f"--key-file={pki.key('etcd-server')}",
        f"--trusted-ca-file={pki.ca}",
        "--client-cert-auth=true",
        "--snapshot-count=10000",
        "--quota-backend-bytes=2147483648",
    ]


def apiserver_args(apiserver: Path, layout: ClusterLayout, pki: Pki) -> list[str | Path]:
    return [
        apiserver,
        f"--advertise-address={layout.node_ip}",
        f"--secure-port={API_PORT}",
        "--etcd-servers=https://127.0.0.1:2379",
        f"--etcd-cafile={pki.ca}",
        f"--etcd-certfile={pki.cert('apiserver-etcd-client')}",
        f"--etcd-keyfile={pki.key('apiserver-etcd-client')}",
        f"--client-ca-file={pki.ca}",
        f"--tls-cert-file={pki.cert('apiserver')}",
        f"--tls-private-key-file={pki.key('apiserver')}",
        f"--kubelet-client-certificate={pki.cert('apiserver-kubelet-client')}",
        f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
        f"--kubelet-certificate-authority={pki.ca}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
        f"--service-account-key-file={pki.service_account_public_key}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def _identity_flags(kubeconfig: Path) -> list[str]:
    """A control-plane component's own kubeconfig, also for checking who calls its secure port
    (bound to loopback only)."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
    ]


def controller_manager_args(binary: Path, layout: ClusterLayout, pki: Pki) -> list[str | Path]:
    return [
        binary,
        *_identity_flags(layout.state / "controller-manager.kubeconfig"),
        f"--client-ca-file={pki.ca}",
        f"--cluster-signing-cert-file={pki.ca}",
        f"--cluster-signing-key-file={pki.key('ca')}",
        f"--root-ca-file={pki.ca}",
        f"--service-account-private-key-file={pki.service_account_key}",
        "--use-service-account-credentials=true",
        f"--cluster-cidr={POD_CIDR}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allocate-node-cidrs=false",
        "--controllers=*,bootstrapsigner,tokencleaner",
        "--leader-elect=false",
        "--v=1",
    ]


def scheduler_args(binary: Path, layout: ClusterLayout) -> list[str | Path]:
    return [
        binary,
        *_identity_flags(layout.state / "scheduler.kubeconfig"),
        "--leader-elect=false",
        "--v=1",
    ]


def kubelet_config(layout: ClusterLayout, pki: Pki) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [DNS_SERVICE_IP],
        "podCIDR": NODE_POD_CIDR,
        "tlsCertFile": str(pki.cert("kubelet-server")),
        "tlsPrivateKeyFile": str(pki.key("kubelet-server")),
        "failSwapOn": False,
        "resolvConf": "/etc/resolv.conf",
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "healthzBindAddress": "127.0.0.1",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "staticPodPath": "",
        "maxPods": 110,
    }


def kubelet_args(binary: Path, layout: ClusterLayout) -> list[str | Path]:
    return [
        binary,
        f"--config={layout.state / 'kubelet.json'}",
        f"--kubeconfig={layout.state / 'kubelet.kubeconfig'}",
        f"--root-dir={layout.kubelet_root}",
        f"--hostname-override={layout.node_name}",
        f"--node-ip={layout.node_ip}",
        "--v=1",
    ]


def kube_proxy_args(binary: Path, layout: ClusterLayout) -> list[str | Path]:
    return [
        binary,
        f"--kubeconfig={layout.state / 'kube-proxy.kubeconfig'}",
        f"--hostname-override={layout.node_name}",
        f"--cluster-cidr={POD_CIDR}",
        "--proxy-mode=iptables",
        "--metrics-bind-address=127.0.0.1:10249",
        "--healthz-bind-address=127.0.0.1:10256",
        "--v=1",
    ]


def containerd_config(
    layout: ClusterLayout, sandbox_image: str, *, restrict_oom_score_adj: bool = False
) -> str:
    """containerd 1.6 (Debian 12), config version 2, its own root, socket and runc state so
    that it never meets the containerd Docker runs.

    `restrict_oom_score_adj` is for hosts that deny CAP_SYS_RESOURCE even to root (this VM):
    runc cannot lower a sandbox's oom_score_adj to -998 there, so containerd clamps every
    score to its own instead of failing each pod."""
    restrict = "true" if restrict_oom_score_adj else "false"
    return f"""version = 2
root = "{layout.images}"
state = "{layout.run / "containerd"}"

[grpc]
  address = "{layout.containerd_socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  restrict_oom_score_adj = {restrict}

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{layout.run / "runc"}"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{layout.state / "cni"}"
"""


def cni_config() -> str:
    """One bridge for the node's pods, with host-local addresses and masquerading out."""
    document = {
        "cniVersion": "1.0.0",
        "name": "gregor-local",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": NODE_POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(document, indent=2)
