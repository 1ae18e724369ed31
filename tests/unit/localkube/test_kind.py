"""The kind cluster's documents (ADR 0027): the kind config's nodes, zones and containerd patch,
the pod network's conflist and agent, the storage manifest, the names images get in a node,
the node image's fingerprint, the runc wrapper that lets Docker start privileged containers
here, and the kind-only components' recipes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from localkube import (
    build,
    cluster,
    host,
    kind,
    kind_cluster,
    kind_images,
    runc_within_bounds,
    versions,
)
from localkube.images import cluster_image_dir

NODE_IMAGE = "gregor/kind-node:v1.34.4-0123456789ab"

KUBEADM_IMAGES = [
    "registry.k8s.io/kube-apiserver:v1.34.4",
    "registry.k8s.io/kube-controller-manager:v1.34.4",
    "registry.k8s.io/kube-scheduler:v1.34.4",
    "registry.k8s.io/kube-proxy:v1.34.4",
    "registry.k8s.io/coredns/coredns:v1.12.1",
    "registry.k8s.io/pause:3.10.1",
    "registry.k8s.io/etcd:3.6.5-0",
]
"""What `kubeadm config images list --kubernetes-version v1.34.4` prints."""


# -- the kind config --------------------------------------------------------------------------


def test_three_workers_make_three_zones_beside_one_control_plane() -> None:
    config = kind.kind_config(NODE_IMAGE, 3, restrict_oom_score_adj=False)
    nodes = config["nodes"]
    assert [n["role"] for n in nodes] == ["control-plane", "worker", "worker", "worker"]
    assert "labels" not in nodes[0]
    assert [n["labels"][kind.ZONE_LABEL] for n in nodes[1:]] == ["zone-a", "zone-b", "zone-c"]
    assert {n["image"] for n in nodes} == {NODE_IMAGE}
    assert config["name"] == "gregor"


def test_zones_go_round_robin_past_three_workers() -> None:
    nodes = kind.kind_config(NODE_IMAGE, 5, restrict_oom_score_adj=False)["nodes"]
    zones = [n["labels"][kind.ZONE_LABEL] for n in nodes[1:]]
    assert zones == ["zone-a", "zone-b", "zone-c", "zone-a", "zone-b"]


def test_no_workers_is_a_lone_control_plane() -> None:
    nodes = kind.kind_config(NODE_IMAGE, 0, restrict_oom_score_adj=False)["nodes"]
    assert nodes == [{"role": "control-plane", "image": NODE_IMAGE}]
    with pytest.raises(ValueError, match="workers"):
        kind.kind_config(NODE_IMAGE, -1, restrict_oom_score_adj=False)


def test_kinds_own_cni_is_off_and_the_subnets_are_the_host_clusters() -> None:
    networking = kind.kind_config(NODE_IMAGE, 1, restrict_oom_score_adj=False)["networking"]
    assert networking == {
        "disableDefaultCNI": True,
        "podSubnet": "10.244.0.0/16",
        "serviceSubnet": "10.96.0.0/16",
    }


def test_containerd_is_told_to_restrict_oom_scores_only_when_the_host_needs_it() -> None:
    plain = kind.kind_config(NODE_IMAGE, 1, restrict_oom_score_adj=False)
    assert "containerdConfigPatches" not in plain
    patched = kind.kind_config(NODE_IMAGE, 1, restrict_oom_score_adj=True)
    (patch,) = patched["containerdConfigPatches"]
    cri = tomllib.loads(patch)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri == {"restrict_oom_score_adj": True}


def test_the_config_is_json_kind_reads_as_yaml() -> None:
    config = kind.kind_config(NODE_IMAGE, 3, restrict_oom_score_adj=True)
    assert json.loads(json.dumps(config)) == config
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"


def test_node_names_follow_kinds_numbering() -> None:
    assert kind.node_names(3) == [
        "gregor-control-plane",
        "gregor-worker",
        "gregor-worker2",
        "gregor-worker3",
    ]
    assert kind.node_names(0) == ["gregor-control-plane"]


# -- the pod network ---------------------------------------------------------------------------


def test_conflist_bridges_the_nodes_pod_cidr_with_one_default_route() -> None:
    conflist = json.loads(kind.cni_conflist("10.244.3.0/24"))
    bridge, portmap = conflist["plugins"]
    assert conflist["cniVersion"] == "1.0.0"
    assert bridge["type"] == "bridge"
    assert bridge["isDefaultGateway"] is True
    assert bridge["ipMasq"] is False  # the agent masquerades only what leaves the pod subnet
    assert bridge["ipam"] == {"type": "host-local", "ranges": [[{"subnet": "10.244.3.0/24"}]]}
    # isDefaultGateway adds the default route: a second one from IPAM fails every pod.
    assert "routes" not in bridge["ipam"]
    assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}}


def _by_kind(manifests: list[kind.Manifest]) -> dict[str, kind.Manifest]:
    return {m["kind"]: m for m in manifests}


def test_agent_runs_on_every_node_with_our_image_and_never_pulls() -> None:
    manifests = _by_kind(kind.cni_manifests("gregor/kind-cni:abc"))
    pod = manifests["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "gregor/kind-cni:abc"
    assert container["imagePullPolicy"] == "Never"
    assert pod["hostNetwork"] is True
    assert pod["tolerations"] == [{"operator": "Exists"}]  # NotReady nodes most of all
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["POD_SUBNET"] == kind.POD_SUBNET
    assert env["CNI_CONF"] == "/etc/cni/net.d/10-gregor.conflist"


def test_agent_template_is_the_conflist_with_a_placeholder_and_restarts_agents_on_change() -> None:
    manifests = _by_kind(kind.cni_manifests("gregor/kind-cni:abc"))
    template = manifests["ConfigMap"]["data"]["conflist"]
    assert template == kind.cni_conflist("@POD_CIDR@")
    annotations = manifests["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]
    assert len(annotations["gregor.dev/conflist-sha256"]) == 64


def test_agent_may_read_nodes_and_nothing_else() -> None:
    role = _by_kind(kind.cni_manifests("x"))["ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]


def test_storage_is_the_default_class_standard_waiting_for_its_consumer() -> None:
    manifests = kind.storage_manifests("gregor/local-path-provisioner:abc", "gregor/debian:x")
    storage_class = _by_kind(manifests)["StorageClass"]
    assert storage_class["metadata"]["name"] == "standard"
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"
    annotations = storage_class["metadata"]["annotations"]
    assert annotations["storageclass.kubernetes.io/is-default-class"] == "true"
    document = json.loads(kind.manifest_list(manifests))
    assert document["kind"] == "List"
    images = {
        c["image"]
        for m in document["items"]
        if m["kind"] == "Deployment"
        for c in m["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"gregor/local-path-provisioner:abc"}
    assert kind.LOCAL_PATH_DIR in json.dumps(document)


# -- the node image ------------------------------------------------------------------------------


def test_each_image_goes_under_the_name_kubeadm_asks_for_and_pause_under_containerds() -> None:
    names = kind.preload_names(KUBEADM_IMAGES, "registry.k8s.io/pause:3.10.1")
    assert names == {
        "kube-apiserver": "registry.k8s.io/kube-apiserver:v1.34.4",
        "kube-controller-manager": "registry.k8s.io/kube-controller-manager:v1.34.4",
        "kube-scheduler": "registry.k8s.io/kube-scheduler:v1.34.4",
        "kube-proxy": "registry.k8s.io/kube-proxy:v1.34.4",
        "coredns": "registry.k8s.io/coredns/coredns:v1.12.1",
        "pause": "registry.k8s.io/pause:3.10.1",
        "etcd": "registry.k8s.io/etcd:3.6.5-0",
    }
    other = kind.preload_names(KUBEADM_IMAGES, "example.org/pause:9")
    assert other["pause"] == "example.org/pause:9"


def test_an_image_we_do_not_build_or_one_missing_is_an_error() -> None:
    with pytest.raises(ValueError, match="does not build"):
        kind.preload_names([*KUBEADM_IMAGES, "registry.k8s.io/kindnetd:v1"], "p/pause:1")
    with pytest.raises(ValueError, match="etcd"):
        kind.preload_names(KUBEADM_IMAGES[:-1], "registry.k8s.io/pause:3.10.1")


def test_the_base_images_containerd_config_names_the_pause_kubeadm_expects() -> None:
    text = (cluster_image_dir() / "kind-base" / "containerd.toml").read_text()
    assert kind_images.sandbox_image(text) in KUBEADM_IMAGES
    cri = tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True


def test_node_image_tag_changes_exactly_when_an_input_does() -> None:
    inputs = {"base": "sha256:1", "bin:kubelet": "abc", "image:gregor/etcd:x": "sha256:2"}
    tag = kind.node_image_tag("v1.34.4", inputs)
    assert tag.startswith("gregor/kind-node:v1.34.4-")
    assert len(tag.rsplit("-", 1)[1]) == 12
    assert kind.node_image_tag("v1.34.4", dict(reversed(inputs.items()))) == tag
    assert kind.node_image_tag("v1.34.4", {**inputs, "bin:kubelet": "abd"}) != tag


# -- privileged containers on a host without CAP_SYS_RESOURCE -----------------------------------


def test_missing_bounding_capabilities(tmp_path: Path) -> None:
    status, last = tmp_path / "status", tmp_path / "cap_last_cap"
    last.write_text("40\n")
    status.write_text("CapBnd:\t000001fffeffffff\n")  # this VM: all but CAP_SYS_RESOURCE
    assert host.missing_bounding_capabilities(status, last) == [24]
    status.write_text("CapBnd:\t000001ffffffffff\n")
    assert host.missing_bounding_capabilities(status, last) == []


def test_dockers_config_gains_our_runtime_as_default_and_keeps_the_rest() -> None:
    config = host.bounded_runtime_config({"log-level": "warn", "runtimes": {"x": {"path": "/x"}}})
    assert config["log-level"] == "warn"
    assert config["default-runtime"] == host.BOUNDED_RUNTIME
    assert config["runtimes"] == {
        "x": {"path": "/x"},
        host.BOUNDED_RUNTIME: {"path": str(host.BOUNDED_RUNTIME_PATH)},
    }


def test_runc_wrapper_finds_the_spec_of_create_run_and_exec() -> None:
    find = runc_within_bounds.spec_file
    assert find(["--root", "/r", "create", "--bundle", "/b", "id"]) == ("/b/config.json", True)
    assert find(["run", "--bundle=/b", "id"]) == ("/b/config.json", True)
    assert find(["exec", "--process", "/tmp/p.json", "--detach", "id"]) == ("/tmp/p.json", False)
    assert find(["--root", "/r", "state", "id"]) is None
    assert find(["kill", "id", "9"]) is None


def test_runc_wrapper_drops_only_what_the_host_lacks(tmp_path: Path) -> None:
    bundle = tmp_path / "config.json"
    caps = ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_NET_ADMIN"]
    bundle.write_text(
        json.dumps({"process": {"capabilities": {"bounding": caps, "effective": caps}}})
    )
    runc_within_bounds.drop_unavailable(str(bundle), True, {"CAP_SYS_RESOURCE"})
    capabilities = json.loads(bundle.read_text())["process"]["capabilities"]
    assert capabilities["bounding"] == ["CAP_CHOWN", "CAP_NET_ADMIN"]
    assert capabilities["effective"] == ["CAP_CHOWN", "CAP_NET_ADMIN"]
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"capabilities": {"permitted": caps}, "args": ["sh"]}))
    runc_within_bounds.drop_unavailable(str(process), False, {"CAP_SYS_RESOURCE"})
    assert json.loads(process.read_text()) == {
        "capabilities": {"permitted": ["CAP_CHOWN", "CAP_NET_ADMIN"]},
        "args": ["sh"],
    }


def test_capability_numbers_match_linux() -> None:
    names = runc_within_bounds.CAPABILITY_NAMES
    assert names[24] == "SYS_RESOURCE"
    assert names[21] == "SYS_ADMIN"
    assert names[40] == "CHECKPOINT_RESTORE"


# -- the kind-only components -----------------------------------------------------------------


def test_kind_components_are_pinned_and_runc_alone_uses_cgo_with_seccomp() -> None:
    components = {c.name: c for c in build.kind_components()}
    assert set(components) == {"kind", "cri-tools", "cni-plugins", "runc", "containerd"}
    assert components["kind"].version == versions.KIND_VERSION == "v0.30.0"
    runc = components["runc"]
    assert isinstance(runc, build.GoComponent)
    assert runc.cgo
    assert "seccomp" in runc.tags
    assert not any(
        c.cgo for c in components.values() if isinstance(c, build.GoComponent) and c is not runc
    )
    plugins = {b.name for b in components["cni-plugins"].binaries}
    assert plugins == {"bridge", "host-local", "loopback", "portmap", "ptp"}


def test_kubeadm_is_part_of_the_kubernetes_component() -> None:
    kubernetes = next(c for c in build.components() if c.name == "kubernetes")
    assert "kubeadm" in {b.name for b in kubernetes.binaries}


def test_new_recipe_fields_at_their_defaults_leave_old_stamps_valid() -> None:
    etcd = next(c for c in build.components() if c.name == "etcd")
    assert '"cgo"' not in build.fingerprint(etcd)
    assert '"tags"' not in build.fingerprint(etcd)
    runc = next(c for c in build.kind_components() if c.name == "runc")
    assert '"cgo": true' in build.fingerprint(runc)


# -- choosing the cluster -----------------------------------------------------------------------


def test_kind_is_the_default_and_the_host_cluster_is_chosen_explicitly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOCALKUBE_MODE", raising=False)
    assert cluster.mode() == "kind"
    assert cluster.mode("host") == "host"
    monkeypatch.setenv("LOCALKUBE_MODE", "host")
    assert cluster.mode() == "host"
    assert cluster.mode("kind") == "kind"
    monkeypatch.setenv("LOCALKUBE_MODE", "minikube")
    with pytest.raises(cluster.ClusterError, match="LOCALKUBE_MODE"):
        cluster.mode()


def test_images_for_kind_go_only_to_the_kind_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[list[str]] = []
    monkeypatch.setattr(kind_cluster, "exists", lambda: True)
    monkeypatch.setattr(kind_cluster, "load", loaded.append)
    monkeypatch.setattr(
        cluster, "load_into_containerd", lambda *_, **__: pytest.fail("host containerd used")
    )
    where = cluster.load_images(["gregor-broker:dev"], log=lambda _: None, chosen="kind")
    assert where is not None
    assert "kind" in where
    assert loaded == [["gregor-broker:dev"]]
    monkeypatch.setattr(kind_cluster, "exists", lambda: False)
    assert cluster.load_images(["gregor-broker:dev"], log=lambda _: None, chosen="kind") is None


def test_nodes_counts_workers_and_one_means_the_control_plane_alone() -> None:
    assert kind_cluster.workers_for(None) == 3
    assert kind_cluster.workers_for(3) == 3
    assert kind_cluster.workers_for(5) == 5
    assert kind_cluster.workers_for(1) == 0
    assert kind_cluster.workers_for(0) == 0
