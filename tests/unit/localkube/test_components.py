"""The files the local cluster's components read parse as those components expect: kubeconfigs
through the Kubernetes client's own loader, containerd's TOML, the CNI network list."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from kubernetes import config

from localkube import components
from localkube.config import BRIDGE, NODE_POD_CIDR, ClusterLayout
from localkube.pki import ensure_pki


def layout(tmp_path: Path) -> ClusterLayout:
    return ClusterLayout(
        state=tmp_path / "state",
        images=tmp_path / "containerd",
        run=tmp_path / "run",
        node_name="node-a",
        node_ip="192.0.2.2",
    )


def test_kubeconfigs_load_with_the_kubernetes_client(tmp_path: Path) -> None:
    where = layout(tmp_path)
    pki = ensure_pki(
        tmp_path / "pki",
        node_name="node-a",
        node_ip="192.0.2.2",
        service_ip="10.96.0.1",
        clients=components.CLIENTS,
    )
    path = tmp_path / "admin.kubeconfig"
    path.write_text(components.kubeconfig(where, pki, "admin", "kubernetes-admin"))
    client = config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
    assert client.configuration.host == "https://192.0.2.2:6443"
    assert client.configuration.cert_file == str(pki.cert("admin"))
    assert client.configuration.ssl_ca_cert == str(pki.ca)


def test_containerd_keeps_to_its_own_socket_root_and_sandbox_image(tmp_path: Path) -> None:
    where = layout(tmp_path)
    parsed = tomllib.loads(components.containerd_config(where, "gregor/pause:3.10"))
    assert parsed["grpc"]["address"] == str(where.containerd_socket)
    assert parsed["root"] == str(where.images)
    cri = parsed["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "gregor/pause:3.10"
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["SystemdCgroup"] is False
    assert runc["Root"] == str(where.run / "runc")
    assert cri["restrict_oom_score_adj"] is False


def test_containerd_clamps_oom_scores_where_root_may_not_lower_them(tmp_path: Path) -> None:
    text = components.containerd_config(
        layout(tmp_path), "gregor/pause:3.10", restrict_oom_score_adj=True
    )
    assert tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]["restrict_oom_score_adj"]


def test_the_pod_network_is_one_bridge_over_the_node_range() -> None:
    network = json.loads(components.cni_config())
    bridge = network["plugins"][0]
    assert bridge["type"] == "bridge"
    assert bridge["bridge"] == BRIDGE
    assert bridge["ipam"]["ranges"] == [[{"subnet": NODE_POD_CIDR}]]


def test_the_kubelet_never_collects_images_it_cannot_pull_back(tmp_path: Path) -> None:
    where = layout(tmp_path)
    pki = ensure_pki(
        tmp_path / "pki", node_name="n", node_ip="192.0.2.2", service_ip="10.96.0.1", clients=[]
    )
    settings = components.kubelet_config(where, pki)
    assert settings["imageGCHighThresholdPercent"] == 100
    assert settings["cgroupDriver"] == "cgroupfs"
    assert settings["failCgroupV1"] is False
    assert settings["containerRuntimeEndpoint"] == f"unix://{where.containerd_socket}"
