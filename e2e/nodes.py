"""Node faults for e2e tests on the kind cluster (`make cluster`; ADR 0027): which
node is in which zone, stopping and starting a node's container, cordon and drain, and cutting
one zone off from the rest of the cluster and joining it again.

Plain functions over the `kubectl` fixture (`kubectl(*args) -> stdout`) and Docker: each kind
node is a container named after the node (`gregor-worker2`). A cut zone keeps its pods running:
only packets between its nodes (and their pods) and every other node (and its pods) are
dropped, inside the zone's node containers, and healing removes exactly those rules.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Kubectl = Callable[..., str]

ZONE_LABEL = "topology.kubernetes.io/zone"
IPTABLES = ("iptables", "ip6tables")
PARTITION_CHAIN = "GREGOR-PARTITION"
"""The iptables chain (filter table) in each cut-off node that drops the other nodes' traffic."""


@dataclass(frozen=True)
class Node:
    """A node as the tests see it: its name (= its container's), zone, address and pod range."""

    name: str
    zone: str | None
    address: str
    pod_cidr: str | None
    ready: bool


def nodes(kubectl: Kubectl) -> list[Node]:
    """Every node, sorted by name, with its zone label (None for the control plane)."""
    items = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
    found = []
    for item in items:
        addresses = {a["type"]: a["address"] for a in item["status"].get("addresses", [])}
        conditions = {c["type"]: c["status"] for c in item["status"].get("conditions", [])}
        found.append(
            Node(
                name=item["metadata"]["name"],
                zone=item["metadata"].get("labels", {}).get(ZONE_LABEL),
                address=addresses.get("InternalIP", ""),
                pod_cidr=item["spec"].get("podCIDR"),
                ready=conditions.get("Ready") == "True",
            )
        )
    return sorted(found, key=lambda node: node.name)


def zones(kubectl: Kubectl) -> dict[str, list[str]]:
    """The zones and the names of their nodes: {"zone-a": ["gregor-worker"], …}."""
    by_zone: dict[str, list[str]] = {}
    for node in nodes(kubectl):
        if node.zone is not None:
            by_zone.setdefault(node.zone, []).append(node.name)
    return by_zone


def wait_ready(kubectl: Kubectl, name: str, *, ready: bool = True, timeout: float = 180) -> None:
    """Wait until the node's Ready condition is True (or, with ready=False, no longer True:
    the node controller marks a silent node Unknown after about 40 s)."""
    deadline = time.monotonic() + timeout
    while True:
        current = next((n.ready for n in nodes(kubectl) if n.name == name), None)
        if current is ready:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"node {name} not {'Ready' if ready else 'NotReady'} in {timeout}s"
            )
        time.sleep(2)


def stop_node(kubectl: Kubectl, name: str, *, wait: bool = True) -> None:
    """`docker stop` the node's container (systemd shuts the kubelet and containers down), then
    wait until the cluster sees the node NotReady."""
    _docker("stop", name)
    if wait:
        wait_ready(kubectl, name, ready=False)


def start_node(kubectl: Kubectl, name: str, *, wait: bool = True) -> None:
    """`docker start` a stopped node's container and wait until it is Ready again (the pod
    network agent restores its routes within seconds of the kubelet's return)."""
    _docker("start", name)
    if wait:
        wait_ready(kubectl, name, ready=True)


def cordon(kubectl: Kubectl, name: str) -> None:
    kubectl("cordon", name)


def uncordon(kubectl: Kubectl, name: str) -> None:
    kubectl("uncordon", name)


def drain(kubectl: Kubectl, name: str, *, timeout: str = "180s") -> None:
    """Cordon the node and evict its pods (DaemonSets stay; emptyDir data goes), honouring
    PodDisruptionBudgets: the way an operator takes a node out for maintenance."""
    kubectl("drain", name, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout}")


def cut_off_zone(kubectl: Kubectl, zone: str) -> list[str]:
    """Drop every packet between the zone's nodes (and their pods) and all other nodes (the
    control plane included, and their pods), in both directions, inside the zone's node
    containers. The zone's pods keep running; to the rest of the cluster its nodes go
    NotReady. Returns the zone's node names; `join_zone` undoes it."""
    every = nodes(kubectl)
    inside = [n for n in every if n.zone == zone]
    if not inside:
        raise AssertionError(f"no node is in zone {zone}")
    outside = [n for n in every if n.zone != zone]
    for node in inside:
        join_zone([node.name])  # a cut left over from a failed run
        for command in IPTABLES:
            _run(node.name, command, "-N", PARTITION_CHAIN)
        for other in outside:
            # The nodes also reach each other over IPv6 (kind's network has both, and the
            # kubelet finds the API server by name), which the Node object does not list.
            blocked = [("iptables", other.address), ("iptables", other.pod_cidr)]
            blocked += [("ip6tables", address) for address in _ipv6_addresses(other.name)]
            for command, network in blocked:
                if not network:
                    continue
                for direction in ("-s", "-d"):
                    _run(
                        node.name, command, "-A", PARTITION_CHAIN, direction, network, "-j", "DROP"
                    )
        for command in IPTABLES:
            for hook in ("INPUT", "OUTPUT", "FORWARD"):
                _run(node.name, command, "-I", hook, "1", "-j", PARTITION_CHAIN)
    return [n.name for n in inside]


def join_zone(names: list[str]) -> None:
    """Undo `cut_off_zone` on these nodes: unhook and delete the partition chain."""
    for name in names:
        for command in IPTABLES:
            for hook in ("INPUT", "OUTPUT", "FORWARD"):
                while _run(name, command, "-D", hook, "-j", PARTITION_CHAIN, check=False) == 0:
                    pass
            _run(name, command, "-F", PARTITION_CHAIN, check=False)
            _run(name, command, "-X", PARTITION_CHAIN, check=False)


@contextlib.contextmanager
def zone_cut_off(kubectl: Kubectl, zone: str) -> Iterator[list[str]]:
    """`with zone_cut_off(kubectl, "zone-a") as names:` the zone is cut off inside the block and
    joined again after it, also when the block fails."""
    names = [n.name for n in nodes(kubectl) if n.zone == zone]
    try:
        yield cut_off_zone(kubectl, zone)
    finally:
        join_zone(names)


def _ipv6_addresses(container: str) -> list[str]:
    done = subprocess.run(
        ["docker", "inspect", "--format",
         "{{range .NetworkSettings.Networks}}{{.GlobalIPv6Address}} {{end}}", container],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.split()


def _run(node: str, command: str, *args: str, check: bool = True) -> int:
    done = subprocess.run(
        ["docker", "exec", node, command, "-w", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{command} {' '.join(args)} in {node}: {done.stderr.strip()}")
    return done.returncode


def _docker(*args: str) -> None:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.stderr.strip()}")
