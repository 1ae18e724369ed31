"""`make cluster`: a real Kubernetes on this machine, and `make cluster-down`.

By default `up` makes a multi-node kind cluster on our own node image (`kind_cluster`, ADR
0027). With `--mode host` (or LOCALKUBE_MODE=host) it makes the single-node cluster of host
processes instead (ADR 0005), kept for machines whose Docker cannot run kind's privileged
nodes: it uses a kind on PATH when it and Docker work and it can create its cluster; failing
that it starts
the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), containerd
(Debian's), the kubelet and kube-proxy as host processes built from the pinned Kubernetes
release (`localkube.build`), with a bridge pod network, CoreDNS and a default StorageClass.
Everything it starts is found again by pid file, so `down` stops it from any shell, and `up`
after `down` starts a fresh cluster (etcd and volumes are wiped; loaded images are kept).

What it owns: the order of things and the waiting. Command lines and config files are in
`components`, manifests in `addons`, certificates in `pki`, what it changes on the host outside
its own directories (packages, sysctls, iptables, mounts) in `host`.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from . import addons, components, host, kind_cluster, processes
from .build import Binaries, built_binaries, ensure_binaries
from .config import API_SERVICE_IP, ClusterLayout, default_layout
from .docker import ensure_docker, load_into_containerd, load_into_kind
from .images import LOCAL_PATH_HELPER, build_cluster_images
from .pki import Pki, ensure_pki

__all__ = ["KIND_KUBECONFIG", "MODES", "PROCESSES", "down", "load_images", "mode", "status", "up"]

Log = Callable[[str], None]

PROCESSES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
)
"""Every process `up` starts, in the order it starts them; `down` stops them in reverse."""


class ClusterError(RuntimeError):
    """The local cluster cannot start here; the message says why and what to do."""


KIND_CLUSTER = "gregor"
KIND_KUBECONFIG = kind_cluster.KUBECONFIG
MODES = ("kind", "host")
"""`kind`: the multi-node kind cluster on our own node image (ADR 0027), the default; `host`:
the single-node cluster of host processes (ADR 0005), for machines where kind cannot run."""


def mode(requested: str | None = None) -> str:
    """The cluster `up` and `down` act on: `requested`, else $LOCALKUBE_MODE, else kind."""
    chosen = requested or os.environ.get("LOCALKUBE_MODE") or "kind"
    if chosen not in MODES:
        raise ClusterError(f"LOCALKUBE_MODE={chosen!r}: one of {', '.join(MODES)}")
    return chosen


def up(log: Log = print, *, chosen: str | None = None, nodes: int | None = None) -> Path:
    """Start the cluster of `mode(chosen)` (or find it running); return the kubeconfig's path.
    The kind cluster has a control plane and `nodes` workers (default $NODES, else 3; 1 means
    the control plane alone)."""
    if mode(chosen) == "kind":
        if os.geteuid() != 0:
            raise ClusterError(
                "the kind cluster installs the Debian packages it uses and sets Docker's runtime"
                " up for privileged nodes, and so needs root: run `sudo make cluster`"
            )
        if nodes is None and os.environ.get("NODES"):
            nodes = int(os.environ["NODES"])
        return kind_cluster.up(nodes, log)
    if _kind_works():
        kubeconfig = _kind_up(log)
        if kubeconfig is not None:
            return kubeconfig
        log("kind could not create its cluster (no node image?): building a local one instead")
    if os.geteuid() != 0:
        raise ClusterError(
            "the local cluster runs containerd, the kubelet and iptables on this machine and so"
            " needs root: run `sudo make cluster` (or install kind and Docker)"
        )
    layout = default_layout()
    started = time.monotonic()
    host.ensure_packages(log)
    binaries = ensure_binaries(log=log)
    log(f"binaries ready ({time.monotonic() - started:.0f} s)")
    for directory in (layout.state, layout.run, layout.logs, layout.images):
        directory.mkdir(parents=True, exist_ok=True)
    pki = ensure_pki(
        layout.pki,
        node_name=layout.node_name,
        node_ip=layout.node_ip,
        service_ip=API_SERVICE_IP,
        clients=[*components.CLIENTS, components.kubelet_identity(layout.node_name)],
    )
    _write_configs(layout, pki)
    host.open_pod_network()
    _control_plane(layout, pki, binaries)
    log(f"control plane ready ({time.monotonic() - started:.0f} s)")
    images = _node(layout, binaries)
    log(f"node started ({time.monotonic() - started:.0f} s)")
    _addons(layout, binaries, images)
    _wait_ready(layout, binaries)
    _offer_tools(binaries, log)
    log(f"cluster ready in {time.monotonic() - started:.0f} s; kubeconfig: {layout.kubeconfig}")
    return layout.kubeconfig


def down(log: Log = print, *, chosen: str | None = None) -> None:
    """Delete the kind cluster; in host mode, stop everything `up` started and remove the
    cluster's state (the image store stays)."""
    if mode(chosen) == "kind":
        kind_cluster.delete(log)
        return
    if shutil.which("kind") and KIND_CLUSTER in _kind_clusters():
        subprocess.run(["kind", "delete", "cluster", "--name", KIND_CLUSTER], check=True)
        return
    layout = default_layout()
    for name in reversed(PROCESSES):
        if name == "containerd":
            _remove_containers(layout)  # through containerd, so before it stops
        processes.stop(name, layout.pids)
    built = built_binaries()
    if built is not None:
        subprocess.run([built.kube_proxy, "--cleanup"], capture_output=True, check=False)
    host.unmount_under(layout.state)
    host.unmount_under(layout.run)
    host.remove_pod_network()
    shutil.rmtree(layout.state, ignore_errors=True)
    shutil.rmtree(layout.run, ignore_errors=True)
    log("local cluster stopped and its state removed")


# -- steps of up ------------------------------------------------------------------------------


KUBECTL_LINK = Path("/usr/local/bin/kubectl")
HELM_LINK = Path("/usr/local/bin/helm")


def _offer_tools(binaries: Binaries, log: Log) -> None:
    """Put the built kubectl and helm on PATH when the machine has none, so `kubectl get
    nodes` and `helm install` work right after `make cluster`; one already there is left
    alone."""
    for built, link in ((binaries.kubectl, KUBECTL_LINK), (binaries.helm, HELM_LINK)):
        if shutil.which(link.name) is None and not link.is_symlink():
            link.symlink_to(built)
            log(f"{link.name}: {link} -> {built}")


def _write_configs(layout: ClusterLayout, pki: Pki) -> None:
    kubeconfigs = {
        "kubeconfig": ("admin", "kubernetes-admin"),
        "controller-manager.kubeconfig": ("controller-manager", "system:kube-controller-manager"),
        "scheduler.kubeconfig": ("scheduler", "system:kube-scheduler"),
        "kube-proxy.kubeconfig": ("kube-proxy", "system:kube-proxy"),
        "kubelet.kubeconfig": ("kubelet-client", f"system:node:{layout.node_name}"),
    }
    for file, (client, user) in kubeconfigs.items():
        path = layout.state / file
        path.write_text(components.kubeconfig(layout, pki, client, user))
        path.chmod(0o600)
    (layout.state / "kubelet.json").write_text(
        json.dumps(components.kubelet_config(layout, pki), indent=2)
    )
    cni = layout.state / "cni"
    cni.mkdir(exist_ok=True)
    (cni / "10-gregor-local.conflist").write_text(components.cni_config())


def _control_plane(layout: ClusterLayout, pki: Pki, binaries: Binaries) -> None:
    _start("etcd", components.etcd_args(binaries.etcd, layout, pki), layout)
    processes.wait_for(
        "health",
        lambda: _https_ok("https://127.0.0.1:2379/health", pki, "apiserver-etcd-client"),
        timeout=60,
        name="etcd",
        logs=layout.logs,
        pids=layout.pids,
    )
    _start("kube-apiserver", components.apiserver_args(binaries.apiserver, layout, pki), layout)
    processes.wait_for(
        "/readyz",
        lambda: _https_ok(f"{layout.api_server}/readyz", pki, "admin"),
        timeout=120,
        name="kube-apiserver",
        logs=layout.logs,
        pids=layout.pids,
    )
    _start(
        "kube-controller-manager",
        components.controller_manager_args(binaries.controller_manager, layout, pki),
        layout,
    )
    _start("kube-scheduler", components.scheduler_args(binaries.scheduler, layout), layout)


def _node(layout: ClusterLayout, binaries: Binaries) -> dict[str, str]:
    ensure_docker()
    images = build_cluster_images(
        {
            "pause": binaries.pause,
            "coredns": binaries.coredns,
            "local-path-provisioner": binaries.local_path_provisioner,
        }
    )
    config = layout.state / "containerd.toml"
    config.write_text(
        components.containerd_config(
            layout, images["pause"], restrict_oom_score_adj=not host.may_lower_oom_scores()
        )
    )
    _start("containerd", ["containerd", "--config", config], layout)
    processes.wait_for(
        "its socket",
        lambda: _ctr(layout, "version").returncode == 0,
        timeout=60,
        name="containerd",
        logs=layout.logs,
        pids=layout.pids,
    )
    load_into_containerd(sorted(set(images.values())), address=str(layout.containerd_socket))
    layout.kubelet_root.mkdir(parents=True, exist_ok=True)
    layout.local_volumes.mkdir(parents=True, exist_ok=True)
    _start("kubelet", components.kubelet_args(binaries.kubelet, layout), layout)
    _start("kube-proxy", components.kube_proxy_args(binaries.kube_proxy, layout), layout)
    return images


def _addons(layout: ClusterLayout, binaries: Binaries, images: dict[str, str]) -> None:
    manifests = [
        *addons.coredns(images["coredns"]),
        *addons.local_path_provisioner(
            images["local-path-provisioner"], images[LOCAL_PATH_HELPER], str(layout.local_volumes)
        ),
    ]
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    kubectl(binaries, layout, ["apply", "--server-side", "--force-conflicts", "-f", "-"], document)


def _wait_ready(layout: ClusterLayout, binaries: Binaries) -> None:
    registered_by = time.monotonic() + 60  # the kubelet registers the node a moment after start
    kubectl(
        binaries,
        layout,
        ["wait", "--for=condition=Ready", f"node/{layout.node_name}", "--timeout=180s"],
        retry_until=registered_by,
    )
    for namespace, name in (
        ("kube-system", "coredns"),
        ("local-path-storage", "local-path-provisioner"),
    ):
        kubectl(
            binaries,
            layout,
            ["-n", namespace, "rollout", "status", f"deployment/{name}", "--timeout=180s"],
        )


# -- helpers ------------------------------------------------------------------------------------


def kubectl(
    binaries: Binaries,
    layout: ClusterLayout,
    args: Sequence[str],
    stdin: str | None = None,
    *,
    retry_until: float | None = None,
) -> str:
    """Run kubectl against the local cluster; raise with its output if it fails."""
    return processes.run_kubectl(
        binaries.kubectl, layout.kubeconfig, args, stdin, retry_until=retry_until
    )


def _start(name: str, argv: Sequence[str | Path], layout: ClusterLayout) -> None:
    processes.start(name, argv, logs=layout.logs, pids=layout.pids)


def _https_ok(url: str, pki: Pki, client: str) -> bool:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.cert(client)), str(pki.key(client)))
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _ctr(layout: ClusterLayout, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ctr", "--address", str(layout.containerd_socket), "--namespace", "k8s.io", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _remove_containers(layout: ClusterLayout) -> None:
    """Kill and remove every container and pod sandbox (containerd keeps its images), and the
    sandboxes' network namespaces with them: killed rather than stopped through the CRI, their
    pods never get CNI's teardown."""
    if processes.running("containerd", layout.pids) is None:
        return
    containers = _ctr(layout, "containers", "list", "--quiet").stdout.split()
    namespaces = {path for c in containers if (path := _network_namespace(layout, c))}
    for task in _ctr(layout, "tasks", "list", "--quiet").stdout.split():
        _ctr(layout, "tasks", "kill", "--signal", "SIGKILL", task)
    deadline = time.monotonic() + 20
    while _ctr(layout, "tasks", "list", "--quiet").stdout.split() and time.monotonic() < deadline:
        time.sleep(0.2)
    for task in _ctr(layout, "tasks", "list", "--quiet").stdout.split():
        _ctr(layout, "tasks", "delete", "--force", task)
    for container in containers:
        _ctr(layout, "containers", "delete", container)
    for path in sorted(namespaces):
        # Unmounting the pinned namespace frees it, and its veth pair goes with it.
        subprocess.run(["umount", path], capture_output=True, check=False)
        Path(path).unlink(missing_ok=True)


def _network_namespace(layout: ClusterLayout, container: str) -> str | None:
    """The named network namespace (/var/run/netns/cni-…) a pod sandbox was made with."""
    try:
        spec = json.loads(_ctr(layout, "containers", "info", container).stdout)["Spec"]
        namespaces = spec["linux"]["namespaces"]
    except (ValueError, KeyError, TypeError):
        return None
    for namespace in namespaces:
        path = namespace.get("path", "")
        if namespace.get("type") == "network" and "/netns/cni-" in path:
            return str(path)
    return None


# -- kind -----------------------------------------------------------------------------------------


def _kind_clusters() -> list[str]:
    result = subprocess.run(
        ["kind", "get", "clusters"], capture_output=True, text=True, check=False
    )
    return result.stdout.split() if result.returncode == 0 else []


def _kind_works() -> bool:
    if shutil.which("kind") is None or shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def _kind_up(log: Log) -> Path | None:
    """The kind cluster's kubeconfig, creating the cluster if needed; None if kind cannot."""
    kubeconfig = KIND_KUBECONFIG
    if KIND_CLUSTER not in _kind_clusters():
        log("creating a kind cluster")
        created = subprocess.run(
            [
                "kind",
                "create",
                "cluster",
                "--name",
                KIND_CLUSTER,
                "--kubeconfig",
                str(kubeconfig),
                "--wait",
                "120s",
            ],
            check=False,
        )
        if created.returncode != 0:
            return None
    return kubeconfig


def load_images(tags: Sequence[str], log: Log = print, *, chosen: str | None = None) -> str | None:
    """Load locally built images into the cluster `up` made: in kind mode into every node of
    our kind cluster (`kind load`, a `ctr import` in each); in host mode into the local node's
    containerd, or, when that does not run, into a kind cluster named gregor. Both clusters may
    run side by side; each gets only what is meant for it. Returns where they went, None when
    no cluster runs."""
    layout = default_layout()
    if mode(chosen) == "kind":
        if not kind_cluster.exists():
            return None
        kind_cluster.load(list(tags))
        where = f"kind cluster {KIND_CLUSTER}'s nodes"
    elif processes.running("containerd", layout.pids) is not None:
        load_into_containerd(list(tags), address=str(layout.containerd_socket))
        where = f"the local node's containerd ({layout.containerd_socket})"
    elif kind_cluster.exists():
        kind_cluster.load(list(tags))
        where = f"kind cluster {KIND_CLUSTER}'s nodes"
    elif shutil.which("kind") and KIND_CLUSTER in _kind_clusters():
        load_into_kind(list(tags), KIND_CLUSTER)
        where = f"kind cluster {KIND_CLUSTER}"
    else:
        return None
    log(f"loaded {', '.join(tags)} into {where}")
    return where


def status(layout: ClusterLayout | None = None) -> dict[str, int | None]:
    """The pid of each of the cluster's processes, None for those not running (for
    `python -m localkube status`)."""
    layout = layout or default_layout()
    return {name: processes.running(name, layout.pids) for name in PROCESSES}
