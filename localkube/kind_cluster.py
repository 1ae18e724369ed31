"""`python -m localkube up` (`make cluster`): a multi-node, multi-zone kind cluster on our own
node image (docs/adr/0027-kind-nodes.md), and its `down`.

Owns the order of things: the binaries (`build`), the images (`kind_images`), `kind create
cluster` from the generated config (`kind`), the pod network agent, and the waiting until every
node is Ready and CoreDNS and the provisioner run. It runs beside the host-process cluster
(`cluster`) and never touches it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import host, kind, processes
from .build import Binaries, ensure_binaries, ensure_kind_binaries, kind_components
from .build import component_home as _component_home
from .config import cache_dir
from .docker import ImageError, docker_cli, ensure_docker
from .kind_images import ensure_node_image

__all__ = ["DEFAULT_WORKERS", "KUBECONFIG", "delete", "exists", "kind_binary", "up", "workers_for"]

Log = Callable[[str], None]

KUBECONFIG = Path.home() / ".kube" / "gregor-kind"
DEFAULT_WORKERS = 3
"""Three workers, one per zone: what rack-aware placement and zone outages need."""


def workers_for(nodes: int | None) -> int:
    """How many workers `NODES` asks for: that many beside the control plane (default
    DEFAULT_WORKERS), except that 1 (or 0) means the control plane alone, which then runs
    workloads too (laptops)."""
    if nodes is None:
        return DEFAULT_WORKERS
    return 0 if nodes <= 1 else nodes


def kind_binary() -> Path | None:
    """The kind CLI built by `localkube.build`, None until it is built (never builds)."""
    component = next(c for c in kind_components() if c.name == "kind")
    path = _component_home(cache_dir() / "localkube", component) / "bin" / "kind"
    return path if path.is_file() else None


def exists(name: str = kind.CLUSTER_NAME) -> bool:
    """Whether a kind cluster of that name exists (its node containers, running or not)."""
    binary = kind_binary()
    if binary is None:
        return False
    listed = subprocess.run(
        [str(binary), "get", "clusters"], capture_output=True, text=True, check=False
    )
    return name in listed.stdout.split()


def up(nodes: int | None = None, log: Log = print) -> Path:
    """Create (or reuse) the kind cluster `gregor`: a control plane and `workers_for(nodes)`
    workers; return its kubeconfig. A cluster that exists is reused as it is."""
    started = time.monotonic()
    workers = workers_for(nodes)
    host.ensure_packages(log)
    ensure_docker()
    host.ensure_privileged_containers(log)
    binaries = ensure_binaries(log=log)
    node_binaries = ensure_kind_binaries(log=log)
    log(f"binaries ready ({time.monotonic() - started:.0f} s)")
    images = ensure_node_image(binaries, node_binaries, log)
    log(f"node image {images.node} ready ({time.monotonic() - started:.0f} s)")
    kind_cli = str(node_binaries.kind)
    if exists():
        log(f"reusing the kind cluster {kind.CLUSTER_NAME}")
        _export_kubeconfig(kind_cli)
        _start_stopped_nodes()
        load([images.cni])  # a newer agent than the node image holds
    else:
        config = kind.kind_config(
            images.node, workers, restrict_oom_score_adj=not host.may_lower_oom_scores()
        )
        path = cache_dir() / "localkube" / "kind-config.json"
        path.write_text(json.dumps(config, indent=2))
        log(f"creating the kind cluster {kind.CLUSTER_NAME} ({1 + workers} nodes; {path})")
        KUBECONFIG.parent.mkdir(parents=True, exist_ok=True)
        created = subprocess.run(
            [kind_cli, "create", "cluster", "--name", kind.CLUSTER_NAME,
             "--config", str(path), "--kubeconfig", str(KUBECONFIG), "--retain"],
            check=False,
        )  # fmt: skip
        if created.returncode != 0:
            raise RuntimeError(
                f"kind create cluster failed (exit {created.returncode}); the node containers are"
                f" kept for a look (`docker logs {kind.CLUSTER_NAME}-control-plane`, `docker exec"
                f" {kind.CLUSTER_NAME}-control-plane journalctl`); `make cluster-down`"
                " removes them"
            )
        log(f"kind cluster created ({time.monotonic() - started:.0f} s)")
    _apply(binaries, kind.cni_manifests(images.cni))
    _wait_ready(binaries)
    log(f"kind cluster ready in {time.monotonic() - started:.0f} s; kubeconfig: {KUBECONFIG}")
    return KUBECONFIG


def delete(log: Log = print) -> None:
    """Delete the kind cluster and its node containers (its node image stays)."""
    binary = kind_binary()
    if binary is None or not exists():
        log(f"no kind cluster {kind.CLUSTER_NAME}")
        return
    subprocess.run([str(binary), "delete", "cluster", "--name", kind.CLUSTER_NAME], check=True)
    KUBECONFIG.unlink(missing_ok=True)


def load(images: Sequence[str]) -> None:
    """`kind load docker-image`: each image into every node's containerd (`ctr import`)."""
    binary = kind_binary()
    if binary is None:
        raise ImageError("kind is not built: make cluster-build")
    subprocess.run(
        [str(binary), "load", "docker-image", "--name", kind.CLUSTER_NAME, *images],
        check=True,
        stdout=subprocess.DEVNULL,
    )


# -- steps ------------------------------------------------------------------------------------


def _export_kubeconfig(kind_cli: str) -> None:
    KUBECONFIG.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [kind_cli, "export", "kubeconfig", "--name", kind.CLUSTER_NAME,
         "--kubeconfig", str(KUBECONFIG)],
        check=True, capture_output=True,
    )  # fmt: skip


def _start_stopped_nodes() -> None:
    """A reused cluster whose node containers were stopped (a reboot, a test) is started."""
    listed = subprocess.run(
        [docker_cli(), "ps", "--all", "--quiet",
         "--filter", f"label=io.x-k8s.kind.cluster={kind.CLUSTER_NAME}",
         "--filter", "status=exited"],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    if listed:
        subprocess.run([docker_cli(), "start", *listed], check=True, stdout=subprocess.DEVNULL)


def _apply(binaries: Binaries, manifests: list[kind.Manifest]) -> None:
    kubectl(
        binaries,
        ["apply", "--server-side", "--force-conflicts", "-f", "-"],
        stdin=kind.manifest_list(manifests),
        retry_for=60,
    )


def _wait_ready(binaries: Binaries) -> None:
    kubectl(binaries, ["wait", "--for=condition=Ready", "nodes", "--all", "--timeout=300s"])
    for namespace, deployment in (
        ("kube-system", "coredns"),
        ("local-path-storage", "local-path-provisioner"),
    ):
        kubectl(
            binaries,
            ["-n", namespace, "rollout", "status", f"deployment/{deployment}", "--timeout=300s"],
            retry_for=60,
        )


def kubectl(
    binaries: Binaries, args: Sequence[str], stdin: str | None = None, retry_for: float = 0
) -> str:
    """kubectl against the kind cluster; retried for `retry_for` seconds, then raises with its
    output."""
    return processes.run_kubectl(
        binaries.kubectl,
        KUBECONFIG,
        args,
        stdin,
        retry_until=time.monotonic() + retry_for,
        pause_s=2.0,
    )
