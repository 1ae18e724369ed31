"""Where the local cluster lives and how it is addressed: paths, networks, names.

One place for what the harness, the e2e fixtures and the docs must agree on. The kubeconfig
path is the documented one (README, `make cluster-env`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ClusterLayout", "cache_dir", "default_layout"]

SERVICE_CIDR = "10.96.0.0/16"
API_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
POD_CIDR = "10.244.0.0/16"
NODE_POD_CIDR = "10.244.0.0/24"
CLUSTER_DOMAIN = "cluster.local"
API_PORT = 6443
BRIDGE = "gregor0"


def cache_dir() -> Path:
    """The project's cache root, `${GREGOR_CACHE:-~/.cache/gregor}`: builds and downloads, kept
    across `make clean` and `make cluster-down`."""
    return Path(os.environ.get("GREGOR_CACHE") or Path.home() / ".cache" / "gregor").expanduser()


@dataclass(frozen=True)
class ClusterLayout:
    state: Path
    """Everything a running cluster writes; `cluster-down` removes it (not the image store)."""
    images: Path
    """containerd's root: the images loaded into the cluster, kept across restarts."""
    run: Path
    """Sockets and pid files."""
    node_name: str
    node_ip: str

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def pids(self) -> Path:
        """One `<name>.pid` per cluster process (`localkube.processes`)."""
        return self.run / "pids"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.state / "kubelet"

    @property
    def local_volumes(self) -> Path:
        """Where the local-path provisioner makes each PersistentVolume's directory."""
        return self.state / "volumes"

    @property
    def api_server(self) -> str:
        return f"https://{self.node_ip}:{API_PORT}"


def default_layout() -> ClusterLayout:
    root = Path(os.environ.get("GREGOR_LOCALKUBE_DIR", "/var/lib/gregor-localkube"))
    return ClusterLayout(
        state=root / "state",
        images=root / "containerd",
        run=Path("/run/gregor-localkube"),
        node_name=socket.gethostname().lower(),
        node_ip=_primary_ip(),
    )


def _primary_ip() -> str:
    """The address of the interface the default route leaves by (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3: routed by default
            address: str = probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"
    return address
