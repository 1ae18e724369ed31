"""What the local cluster changes on this machine outside its own directories, and how
`cluster-down` undoes it.

Owns: the Debian packages the project uses (the node's, the image build's, the test clients'),
the sysctls and FORWARD rules that let pod traffic through, the bridge and the iptables chains
the kubelet and the CNI bridge plugin leave behind, mounts under a directory about to be
deleted, whether root may lower oom scores here, and the runtime Docker needs to start
privileged containers (kind's nodes) where root's bounding set is incomplete.
Never starts a cluster process or writes a config file: that is `cluster` and `components`.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .config import BRIDGE

__all__ = [
    "drop_chains",
    "ensure_packages",
    "ensure_privileged_containers",
    "may_lower_oom_scores",
    "missing_packages",
    "mounts_under",
    "open_pod_network",
    "remove_pod_network",
    "unmount_under",
]

DEBIAN_PACKAGES = {
    # The local cluster's node.
    "containerd": "containerd",
    "runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "iptables": "iptables",
    # `ip`: the node's bridge, and the e2e fake load balancer's route to a kind node.
    "ip": "iproute2",
    "conntrack": "conntrack",
    "ebtables": "ebtables",
    # A kind node's runc is built here with cgo and libseccomp (localkube.build, ADR 0027).
    "/usr/include/seccomp.h": "libseccomp-dev",
    "pkg-config": "pkg-config",
    # The images: a Debian base made with debootstrap, built by a Docker daemon.
    "debootstrap": "debootstrap",
    "dockerd": "docker.io",
    # A client the integration tests drive.
    "kcat": "kcat",
    # Apache Kafka's broker and tools, the integration tests' and benchmarks' peer: Maven
    # fetches their jars from Maven Central, Java 17 runs them.
    "mvn": "maven",
    "java": "openjdk-17-jre-headless",
}
"""What the project uses that Debian ships, by the command (or file) that shows it is installed.
A fresh machine has none of these: `make test` installs the missing ones (`python -m localkube
packages`), and `make cluster` and `make images` do too."""

CAP_SYS_RESOURCE = 24


def ensure_packages(log: Callable[[str], None]) -> None:
    """Install with apt whichever of `DEBIAN_PACKAGES` is missing; RuntimeError naming them if
    that needs root and this is not root."""
    missing = missing_packages()
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(
            f"Debian packages missing: {' '.join(missing)}; installing them needs root "
            f"(sudo apt-get install {' '.join(missing)})"
        )
    log(f"installing Debian packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # A fresh machine's package lists are empty or stale: without an update nothing resolves.
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", *missing], check=True, env=env, stdout=subprocess.DEVNULL
    )
    still = missing_packages()
    if still:
        raise RuntimeError(f"apt-get installed {' '.join(missing)} but {still} still missing")


def missing_packages() -> list[str]:
    """The Debian packages of `DEBIAN_PACKAGES` this machine lacks, sorted."""
    return sorted({package for tool, package in DEBIAN_PACKAGES.items() if not _have(tool)})


def _have(tool: str) -> bool:
    return Path(tool).exists() if tool.startswith("/") else shutil.which(tool) is not None


def may_lower_oom_scores(status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process holds CAP_SYS_RESOURCE, which lowering an oom_score_adj needs.
    Some sandboxed VMs withhold it even from root."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


# -- the pod network ----------------------------------------------------------------------------


def open_pod_network() -> None:
    """Forwarding on, bridged pod traffic through iptables (Services), and pod traffic allowed
    through a FORWARD chain that Docker may have set to DROP."""
    for key, value in (
        ("net/ipv4/ip_forward", "1"),
        ("net/bridge/bridge-nf-call-iptables", "1"),
        ("net/bridge/bridge-nf-call-ip6tables", "1"),
    ):
        Path("/proc/sys", key).write_text(value)
    for direction in ("-i", "-o"):
        rule = ["FORWARD", direction, BRIDGE, "-j", "ACCEPT"]
        if subprocess.run(["iptables", "-C", *rule], capture_output=True, check=False).returncode:
            subprocess.run(["iptables", "-I", *rule], check=True)


def remove_pod_network() -> None:
    """The bridge, the FORWARD rules `open_pod_network` added, the chains the bridge plugin and
    the kubelet made, and the bridge plugin's address records. Run after `kube-proxy --cleanup`,
    which takes the proxy's own chains."""
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
    for direction in ("-i", "-o"):
        subprocess.run(
            ["iptables", "-D", "FORWARD", direction, BRIDGE, "-j", "ACCEPT"],
            capture_output=True,
            check=False,
        )
    # The bridge plugin's masquerade chains (CNI-…) and the kubelet's own (KUBE-FIREWALL,
    # KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT); `kube-proxy --cleanup` took the proxy's.
    for command in ("iptables", "ip6tables"):
        if shutil.which(command):
            drop_chains(command, ("CNI-", "KUBE-"))
    shutil.rmtree(Path("/var/lib/cni/networks/gregor-local"), ignore_errors=True)


def drop_chains(command: str, prefixes: tuple[str, ...]) -> None:
    """Delete every rule that jumps to a chain named with one of `prefixes`, then those chains,
    in the filter, nat and mangle tables of `command` (iptables or ip6tables)."""
    for table in ("filter", "nat", "mangle"):
        listed = subprocess.run(
            [command, "-t", table, "-S"], capture_output=True, text=True, check=False
        ).stdout.splitlines()
        doomed = [line.split()[1] for line in listed if line.startswith("-N ")]
        doomed = [chain for chain in doomed if chain.startswith(prefixes)]
        for line in listed:
            rule = shlex.split(line)
            if rule[:1] == ["-A"] and rule[1] not in doomed and _jumps_to(rule, doomed):
                subprocess.run(
                    [command, "-t", table, "-D", *rule[1:]], capture_output=True, check=False
                )
        for chain in doomed:
            subprocess.run([command, "-t", table, "-F", chain], capture_output=True, check=False)
        for chain in doomed:
            subprocess.run([command, "-t", table, "-X", chain], capture_output=True, check=False)


def _jumps_to(rule: list[str], chains: list[str]) -> bool:
    return any(
        flag in ("-j", "-g") and target in chains for flag, target in itertools.pairwise(rule)
    )


# -- mounts -------------------------------------------------------------------------------------


def mounts_under(root: Path) -> list[str]:
    """The mount points below `root`, deepest first (the order to unmount them in)."""
    prefix = str(root.resolve()) + "/"
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        # The kernel writes a space in a path as \040 (and tab, newline, backslash likewise).
        point = line.split()[1].encode().decode("unicode_escape")
        if point.startswith(prefix):
            mounts.append(point)
    return sorted(mounts, reverse=True)


def unmount_under(root: Path) -> None:
    """Lazily unmount everything below `root`, so that deleting it cannot reach through a bind
    mount (a pod's volume, a chroot's /proc) into what it shows."""
    for mount in mounts_under(root):
        subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)


# -- privileged containers ------------------------------------------------------------------------

BOUNDED_RUNTIME = "gregor-runc-within-bounds"
BOUNDED_RUNTIME_PATH = Path("/usr/local/lib/gregor-localkube/runc-within-bounds")
DOCKER_DAEMON_CONFIG = Path("/etc/docker/daemon.json")


def missing_bounding_capabilities(
    status: Path = Path("/proc/self/status"), last: Path = Path("/proc/sys/kernel/cap_last_cap")
) -> list[int]:
    """The capabilities this kernel has that are missing from this process's bounding set."""
    highest = int(last.read_text())
    for line in status.read_text().splitlines():
        if line.startswith("CapBnd:"):
            bounding = int(line.split()[1], 16)
            return [bit for bit in range(highest + 1) if not bounding >> bit & 1]
    return []


def bounded_runtime_config(current: dict[str, object]) -> dict[str, object]:
    """Docker's daemon.json with our runc wrapper registered and made the default runtime,
    every other setting kept."""
    runtimes = dict(current.get("runtimes") or {})  # type: ignore[call-overload]
    runtimes[BOUNDED_RUNTIME] = {"path": str(BOUNDED_RUNTIME_PATH)}
    return {**current, "runtimes": runtimes, "default-runtime": BOUNDED_RUNTIME}


def ensure_privileged_containers(log: Callable[[str], None]) -> None:
    """Make `docker run --privileged` work on a host whose root lacks part of the bounding set
    (this VM: CAP_SYS_RESOURCE). Docker 20.10 grants a privileged container every capability it
    knows, and runc then fails it ("unable to apply caps"). kind runs every node privileged, so
    the daemon's default runtime becomes `localkube/runc_within_bounds.py`, which drops the
    capabilities nobody here can hold and runs runc. The daemon reloads its runtimes on SIGHUP:
    running containers are not touched. Nothing changes on a host with a full bounding set."""
    if not missing_bounding_capabilities():
        return
    source = Path(__file__).with_name("runc_within_bounds.py")
    BOUNDED_RUNTIME_PATH.parent.mkdir(parents=True, exist_ok=True)
    if not BOUNDED_RUNTIME_PATH.exists() or (
        BOUNDED_RUNTIME_PATH.read_bytes() != source.read_bytes()
    ):
        shutil.copyfile(source, BOUNDED_RUNTIME_PATH)
        BOUNDED_RUNTIME_PATH.chmod(0o755)
    current = json.loads(DOCKER_DAEMON_CONFIG.read_text()) if DOCKER_DAEMON_CONFIG.exists() else {}
    wanted = bounded_runtime_config(current)
    if wanted == current and _docker_default_runtime() == BOUNDED_RUNTIME:
        return
    log(
        f"root lacks capabilities {missing_bounding_capabilities()} here: Docker's default "
        f"runtime becomes {BOUNDED_RUNTIME_PATH}, so privileged containers (kind's nodes) start"
    )
    DOCKER_DAEMON_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    DOCKER_DAEMON_CONFIG.write_text(json.dumps(wanted, indent=2) + "\n")
    pid = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True, check=False)
    for process in pid.stdout.split():
        os.kill(int(process), signal.SIGHUP)
    deadline = time.monotonic() + 30
    while _docker_default_runtime() != BOUNDED_RUNTIME:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"dockerd did not take {DOCKER_DAEMON_CONFIG}'s default-runtime on SIGHUP; "
                "restart it"
            )
        time.sleep(0.5)


def _docker_default_runtime() -> str:
    done = subprocess.run(
        ["docker", "info", "--format", "{{.DefaultRuntime}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip()
