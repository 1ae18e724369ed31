"""The kind cluster's images, built here because no registry is reachable (ADR 0027).

Owns: `gregor/kind-base` (systemd, containerd 2, runc, crictl, the CNI plugins, our entrypoint
and units, on gregor/debian), the images a node preloads (the control plane's, kube-proxy's,
etcd's, CoreDNS's, pause, local-path-provisioner and its helper, the pod network agent), and
the node image `gregor/kind-node:<kubernetes version>-<fingerprint>`, made the way kind's
`build node-image` makes one: a container of the base image gets kubeadm, the kubelet and
kubectl in /usr/bin, /kind/version and /kind/manifests/default-storage.yaml; a containerd
started inside it imports every image under the name kubeadm asks for; the container is
committed with the base image's entrypoint. Only kind's pulls are left out.

Never pulls an image, and never builds a node image whose inputs have not changed.
"""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import kind, versions
from .build import Binaries, KindBinaries
from .docker import (
    ImageError,
    docker_build,
    docker_cli,
    docker_reference,
    ensure_docker,
    image_exists,
    image_id,
)
from .images import (
    LOCAL_PATH_HELPER,
    build_cluster_images,
    cluster_image_dir,
    ensure_debian_image,
    image_tag_for,
)

__all__ = ["NodeImages", "ensure_node_image", "sandbox_image"]

log = logging.getLogger(__name__)

Log = Callable[[str], None]

BASE_IMAGE = f"gregor/kind-base:{versions.KIND_VERSION}"
NET_TOOLS_IMAGE = "gregor/net-tools:bookworm"
BUILDER_REVISION = 1
"""Part of every node image's fingerprint: bump it when the way a node image is assembled here
changes, so the next `up` builds a new one."""
_BASE_FILES = (
    "entrypoint",
    "containerd.toml",
    "crictl.yaml",
    "sysctl.conf",
    "containerd.service",
    "kubelet.service",
    "kubelet.slice",
    "kubelet-kubeadm.conf",
    "kubelet.default",
)


@dataclass(frozen=True)
class NodeImages:
    """What `ensure_node_image` made: the node image, and the images the cluster's own
    manifests name (preloaded in every node under these names)."""

    node: str
    cni: str
    local_path_provisioner: str
    local_path_helper: str


def sandbox_image(containerd_toml: str) -> str:
    """The `sandbox_image` a containerd config names (the pause image the CRI asks for)."""
    found = re.search(r'^\s*sandbox_image\s*=\s*"([^"]+)"', containerd_toml, re.MULTILINE)
    if found is None:
        raise ImageError("the node's containerd config names no sandbox_image")
    return found.group(1)


def ensure_node_image(binaries: Binaries, node: KindBinaries, log: Log = print) -> NodeImages:
    """Build (or find) the kind node image and the images it preloads; return their names."""
    ensure_docker()
    started = time.monotonic()
    debian = ensure_debian_image()
    base = _base_image(debian, node)
    refs = _preloaded_images(binaries, debian)
    log(f"kind images ready ({time.monotonic() - started:.0f} s)")
    listed = subprocess.run(
        [str(binaries.kubeadm), "config", "images", "list",
         "--kubernetes-version", versions.KUBERNETES_VERSION],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    containerd_toml = (cluster_image_dir() / "kind-base" / "containerd.toml").read_text()
    names = kind.preload_names(listed, sandbox_image(containerd_toml))
    storage = kind.manifest_list(
        kind.storage_manifests(refs["local-path-provisioner"], refs[LOCAL_PATH_HELPER])
    )
    inputs = {
        "builder": str(BUILDER_REVISION),
        "base": _required_id(base),
        "storage-manifest": storage,
        **{f"bin:{p.name}": image_tag_for(p) for p in _node_binaries(binaries)},
        **{f"image:{ref}": _required_id(ref) for ref in sorted(set(refs.values()))},
        **{f"name:{role}": name for role, name in names.items()},
    }
    tag = kind.node_image_tag(versions.KUBERNETES_VERSION, inputs)
    if not image_exists(tag):
        log(f"building the kind node image {tag}")
        _build_node_image(
            tag, base, binaries=binaries, refs=refs, names=names, storage_manifest=storage
        )
        log(f"built {tag} ({time.monotonic() - started:.0f} s)")
        _remove_older_node_images(tag)
    return NodeImages(
        node=tag,
        cni=refs["kind-cni"],
        local_path_provisioner=refs["local-path-provisioner"],
        local_path_helper=refs[LOCAL_PATH_HELPER],
    )


# -- the images -----------------------------------------------------------------------------


def _base_image(debian: str, node: KindBinaries) -> str:
    context = cluster_image_dir() / "kind-base"
    files = [("Dockerfile", context / "Dockerfile")]
    files += [(name, context / name) for name in _BASE_FILES]
    binaries = [
        node.containerd,
        node.ctr,
        node.containerd_shim_runc_v2,
        node.runc,
        node.crictl,
        *node.cni_plugins,
    ]
    files += [(path.name, path) for path in binaries]
    executables = frozenset({"entrypoint", *(path.name for path in binaries)})
    docker_build(BASE_IMAGE, "Dockerfile", files, {"DEBIAN_IMAGE": debian}, executables)
    return BASE_IMAGE


def _preloaded_images(binaries: Binaries, debian: str) -> dict[str, str]:
    """Build every image a node preloads; their refs by role."""
    refs = build_cluster_images(
        {
            "pause": binaries.pause,
            "coredns": binaries.coredns,
            "local-path-provisioner": binaries.local_path_provisioner,
        }
    )
    for name, binary in (
        ("kube-apiserver", binaries.apiserver),
        ("kube-controller-manager", binaries.controller_manager),
        ("kube-scheduler", binaries.scheduler),
    ):
        ref = f"gregor/{name}:{image_tag_for(binary)}"
        dockerfile = cluster_image_dir() / "kube-component" / "Dockerfile"
        files = [("Dockerfile", dockerfile), ("component", binary.resolve())]
        args = {"DEBIAN_IMAGE": debian, "COMPONENT": name}
        docker_build(ref, "Dockerfile", files, args, executables=frozenset({"component"}))
        refs[name] = ref
    etcd = cluster_image_dir() / "etcd"
    refs["etcd"] = f"gregor/etcd:{image_tag_for(binaries.etcd)}"
    docker_build(
        refs["etcd"],
        "Dockerfile",
        [("Dockerfile", etcd / "Dockerfile"), ("etcd", binaries.etcd),
         ("etcdctl", binaries.etcdctl)],
        {"DEBIAN_IMAGE": debian},
        executables=frozenset({"etcd", "etcdctl"}),
    )  # fmt: skip
    tools = cluster_image_dir() / "net-tools"
    docker_build(
        NET_TOOLS_IMAGE,
        "Dockerfile",
        [("Dockerfile", tools / "Dockerfile"), ("select-iptables", tools / "select-iptables")],
        {"DEBIAN_IMAGE": debian},
        executables=frozenset({"select-iptables"}),
    )
    proxy = cluster_image_dir() / "kube-proxy"
    refs["kube-proxy"] = f"gregor/kube-proxy:{image_tag_for(binaries.kube_proxy)}"
    docker_build(
        refs["kube-proxy"],
        "Dockerfile",
        [("Dockerfile", proxy / "Dockerfile"), ("kube-proxy", binaries.kube_proxy),
         ("kube-proxy-wrapper", proxy / "kube-proxy-wrapper")],
        {"NET_TOOLS_IMAGE": NET_TOOLS_IMAGE},
        executables=frozenset({"kube-proxy", "kube-proxy-wrapper"}),
    )  # fmt: skip
    cni = cluster_image_dir() / "kind-cni"
    cni_files = [("Dockerfile", cni / "Dockerfile"), ("agent", cni / "agent"),
                 ("kubectl", binaries.kubectl)]  # fmt: skip
    refs["kind-cni"] = f"gregor/kind-cni:{_files_digest([p for _, p in cni_files])}"
    docker_build(
        refs["kind-cni"],
        "Dockerfile",
        cni_files,
        {"NET_TOOLS_IMAGE": NET_TOOLS_IMAGE},
        executables=frozenset({"agent", "kubectl"}),
    )
    return refs


def _node_binaries(binaries: Binaries) -> tuple[Path, ...]:
    return (binaries.kubeadm, binaries.kubelet, binaries.kubectl)


# -- the node image, as kind's builder makes one ----------------------------------------------


def _build_node_image(
    tag: str,
    base: str,
    *,
    binaries: Binaries,
    refs: Mapping[str, str],
    names: Mapping[str, str],
    storage_manifest: str,
) -> None:
    docker = docker_cli()
    container = f"gregor-kind-build-{int(time.time())}"
    subprocess.run(
        [docker, "run", "--detach", "--name", container, "--entrypoint", "sleep",
         "--security-opt", "seccomp=unconfined", base, "infinity"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for binary in _node_binaries(binaries):
            subprocess.run(
                [docker, "cp", str(binary.resolve()), f"{container}:/usr/bin/{binary.name}"],
                check=True,
            )
        installed = [f"/usr/bin/{binary.name}" for binary in _node_binaries(binaries)]
        _exec(container, ["chown", "root:root", *installed])
        _write(container, "/kind/version", versions.KUBERNETES_VERSION + "\n")
        _write(container, "/kind/manifests/default-storage.yaml", storage_manifest)
        _import_images(container, refs, names)
        subprocess.run(
            [docker, "commit",
             "--change", 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
             "--change", "CMD []",
             "--change", f"LABEL io.gregor.kind-node={tag}",
             container, tag],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        subprocess.run([docker, "rm", "--force", container], capture_output=True, check=False)


def _import_images(container: str, refs: Mapping[str, str], names: Mapping[str, str]) -> None:
    """Start containerd in the build container, import every image without unpacking it (the
    node's containerd unpacks on first use; a container this unprivileged cannot mount
    overlays), pinned so the kubelet never collects it, then name the kubeadm ones as kubeadm
    asks and stop containerd."""
    _exec(container, ["sh", "-c", "containerd >/var/log/containerd-build.log 2>&1 &"])
    deadline = time.monotonic() + 30
    while _exec(container, ["ctr", "version"], check=False).returncode != 0:
        if time.monotonic() > deadline:
            log_text = _exec(container, ["cat", "/var/log/containerd-build.log"], check=False)
            raise ImageError(f"containerd did not start in {container}:\n{log_text.stdout}")
        time.sleep(0.5)
    images = sorted(set(refs.values()))
    save = subprocess.Popen([docker_cli(), "save", *images], stdout=subprocess.PIPE)
    imported = subprocess.run(
        [docker_cli(), "exec", "-i", container, "ctr", "--namespace=k8s.io", "images", "import",
         "--no-unpack", "--digests", "--label=io.cri-containerd.pinned=pinned", "-"],
        stdin=save.stdout, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if save.stdout is not None:
        save.stdout.close()
    if save.wait() != 0 or imported.returncode != 0:
        raise ImageError(f"importing {images} into the node image failed: {imported.stderr}")
    for role, name in names.items():
        source = docker_reference(refs[role])
        _exec(container, ["ctr", "--namespace=k8s.io", "images", "tag", "--force", source, name])
        _exec(container, ["ctr", "--namespace=k8s.io", "images", "label", name,
                          "io.cri-containerd.pinned=pinned"])  # fmt: skip
    _exec(container, ["sh", "-c", _STOP_CONTAINERD])


_STOP_CONTAINERD = (
    # `sleep` is PID 1 here and reaps nothing: a stopped containerd stays a zombie.
    "pkill -x containerd; while ps -C containerd -o stat= | grep -qv Z; do sleep 0.2; done;"
    " rm -f /var/log/containerd-build.log"
)


def _exec(
    container: str, argv: Sequence[str], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [docker_cli(), "exec", container, *argv], capture_output=True, text=True, check=False
    )
    if check and done.returncode != 0:
        raise ImageError(
            f"`{' '.join(argv)}` in {container} exited {done.returncode}: {done.stderr.strip()}"
        )
    return done


def _write(container: str, path: str, text: str) -> None:
    subprocess.run(
        [docker_cli(), "exec", "-i", container, "sh", "-c",
         f'mkdir -p "$(dirname {path})" && cat >{path}'],
        input=text, text=True, check=True,
    )  # fmt: skip


def _required_id(ref: str) -> str:
    found = image_id(ref)
    if found is None:
        raise ImageError(f"{ref} was just built but Docker does not know it")
    return found


def _remove_older_node_images(current: str) -> None:
    """Every node image but `current` that no container uses: each is about a gigabyte."""
    repository = current.rsplit(":", 1)[0]
    listed = subprocess.run(
        [docker_cli(), "images", "--format", "{{.Repository}}:{{.Tag}}", repository],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    for ref in listed:
        if ref != current:  # `docker rmi` refuses an image a container (a node) still uses
            subprocess.run([docker_cli(), "rmi", ref], capture_output=True, check=False)


def _files_digest(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(image_tag_for(path).encode())
    return digest.hexdigest()[:12]
