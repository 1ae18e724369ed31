"""The pinned versions of everything the local cluster runs, in one place.

This module owns the version pins and the facts that travel with them (release commits, checksums
the checksum database cannot vouch for). It must never compute anything or touch the network:
changing a pin here is the whole of an upgrade, and `localkube.build` rebuilds what changed.
"""

from __future__ import annotations

KUBERNETES_VERSION = "v1.34.4"
"""The last minor release whose kubelet still starts on cgroup v1 without being told to
(`failCgroupV1` defaults to false until 1.35) and still falls back to its own cgroup driver
setting when the runtime (containerd 1.6, as Debian 12 ships) lacks the RuntimeConfig call."""

KUBERNETES_STAGING_VERSION = "v0." + KUBERNETES_VERSION.removeprefix("v1.")
"""k8s.io/api, k8s.io/client-go, … are published as v0.<minor>.<patch> of the same release."""

KUBERNETES_GIT_COMMIT = ""
"""The release commit of KUBERNETES_VERSION; stamped empty (rather than left as the source's
`$Format:%H$` placeholder) because the module proxy does not record it for k8s.io/kubernetes and
nothing reachable from this machine states it."""

ETCD_VERSION = "v3.6.5"
"""The etcd that Kubernetes 1.34 is tested with (build/dependencies.yaml, hack/lib/etcd.sh) and
that kubeadm 1.34 deploys (3.6.5-0); Debian 12's 3.4.23 is older than the 3.5 floor."""

ETCD_GIT_COMMIT = "a0614505aff9b8ff469e9c59c2d979a5936d13f4"
"""The commit of etcd's v3.6.5 tag, as the module proxy records it."""

COREDNS_VERSION = "v1.12.1"
"""The CoreDNS that Kubernetes 1.34 pairs with (kubeadm's CoreDNSVersion, the kube-up addon)."""

COREDNS_GIT_COMMIT = "707c7c10acd52cb94e959e76ae233d9b76af0854"
"""The commit of CoreDNS's v1.12.1 tag, as the module proxy records it."""

LOCAL_PATH_PROVISIONER_VERSION = "v0.0.37"
"""The newest release of rancher/local-path-provisioner the module proxy serves."""

LOCAL_PATH_PROVISIONER_GIT_COMMIT = "49b2be8e26d6d34c9afaa21fa33108d2e82f8955"
"""The commit of local-path-provisioner's v0.0.37 tag, as the module proxy records it."""

LOCAL_PATH_PROVISIONER_GO_SUM = (
    "github.com/rancher/local-path-provisioner v0.0.37 "
    "h1:xRGhYXH31HtfbYWA9Qe8zAqCmHuw4dDRZNrDlWe0OQg=",
    "github.com/rancher/local-path-provisioner v0.0.37/go.mod "
    "h1:0HbWPjgPwrSumhQdlYvD6Day+FvR+0NXjGUJBl8McfA=",
)
"""go.sum lines for the provisioner's module: the checksum database reachable from here has no
record of this release, so its hashes are pinned here (taken from the proxy once) instead of
turning checksum verification off."""

HELM_VERSION = "v3.22.0"
"""Helm 3, the newest release the module proxy serves: it installs the operator's chart
(`charts/gregor-operator`) in the e2e tier and for users who run `make cluster`."""

SPARK_OPERATOR_VERSION = "v2.3.0"
"""The Kubeflow Spark Operator: its controller and webhook (one binary) and its chart, from its
Go module. The e2e tier installs it to cover the operator's `SparkApplication` launches; its
image is built on `gregor-spark`, whose spark-submit it runs."""

PAUSE_VERSION = "1.0.0"
"""Our own pause program (localkube/pause.c); bump it when the program's behaviour changes."""

# What a kind node needs that the host-process cluster does not (ADR 0027) -------------------

KIND_VERSION = "v0.30.0"
"""The last kind release that runs on cgroup v1 hosts: v0.31 dropped cgroup v1 support
(kubernetes-sigs/kind#4077), and this VM's Docker uses cgroup v1. Only its CLI is built: its
node image comes from `localkube.kind_node`, since no registry is reachable."""

CONTAINERD_VERSION = "v2.1.4"
"""The containerd kind v0.30's base image ships (images/base/Dockerfile), so the node behaves as
kind's own does; 2.x, unlike Debian's 1.6, has the CRI RuntimeConfig call the kubelet asks for."""

RUNC_VERSION = "v1.3.0"
"""The runc kind v0.30's base image ships; built with cgo and libseccomp (Debian's
libseccomp-dev) so that pods asking for the RuntimeDefault seccomp profile run."""

CRI_TOOLS_VERSION = "v1.34.0"
"""crictl of the Kubernetes minor we run (cri-tools versions follow Kubernetes'): kubeadm checks
for it and it is how one inspects a node's containers."""

CNI_PLUGINS_VERSION = "v1.7.1"
"""The CNI plugins kind v0.30's base image ships; we add `bridge`, which our own CNI uses instead
of kindnetd (not on the module proxy)."""
