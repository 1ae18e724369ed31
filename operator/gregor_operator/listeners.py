"""External listeners: the addresses Kubernetes gives a cluster's brokers on its `nodeport`
and `loadbalancer` listeners, read from the Services the operator made for them.

What it owns: from what the planner observed, the address each broker advertises on each
external listener (a node port as soon as its Service exists, a load balancer's address when
the cloud has made one), which Services are still waited for, which broker pods started with
an address that has changed since (they are restarted one by one), and where a client
bootstraps from on each listener. What it must never do: make the Services (`objects` does),
decide when a pod restarts (`planner` does), or call Kubernetes. Design: ADR 0022.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .models import KafkaCluster, Listener
from .objects import (
    BROKER_ROLES,
    NODE_HOST,
    External,
    Role,
    Target,
    bootstrap_servers,
    bracketed,
    external_bootstrap_name,
    external_listeners,
    external_service_name,
    pools,
)

if TYPE_CHECKING:
    from .observed import Observed, ServiceState

__all__ = [
    "Started",
    "bootstrap_servers_of",
    "external_addresses",
    "started_with",
]


def external_addresses(
    target: Target, cluster: KafkaCluster, observed: Observed, replicas: Mapping[Role, int]
) -> tuple[dict[Role, External], list[tuple[str, str]]]:
    """What each broker pool's brokers advertise on the external listeners, for the pools
    whose every address is known; and the Services still without one (name, type)."""
    found: dict[Role, External] = {}
    pending: list[tuple[str, str]] = []
    outside = external_listeners(cluster.spec)
    for pool in pools(cluster.spec):
        if not pool.is_broker or not outside:
            continue
        addresses: dict[str, dict[int, str]] = {}
        complete = True
        for listener in outside:
            for ordinal in range(replicas.get(pool.role, pool.spec.replicas)):
                name = external_service_name(target, pool, ordinal, listener)
                address = advertised(listener, observed.services.get(name))
                if address is None:
                    pending.append((name, listener.type))
                    complete = False
                else:
                    addresses.setdefault(listener.name, {})[ordinal] = address
        if complete:
            found[pool.role] = addresses
    return found, pending


def advertised(listener: Listener, service: ServiceState | None) -> str | None:
    """`host:port` for a broker's own Service: the node the pod runs on (`NODE_HOST`, which
    its shell expands) and the node port, or the load balancer's address and the port."""
    if service is None:
        return None
    if listener.type == "nodeport":
        return None if service.node_port is None else f"{NODE_HOST}:{service.node_port}"
    return f"{bracketed(service.ingress[0])}:{listener.port}" if service.ingress else None


Started = Mapping[str, tuple[str, Mapping[str, str]]]
"""Broker pod → (its uid, the external address it started with, by listener)."""


def started_with(
    resource: Mapping[str, Any],
    cluster: KafkaCluster,
    observed: Observed,
    external: Mapping[Role, External],
) -> tuple[dict[str, tuple[str, dict[str, str]]], dict[str, str]]:
    """The external addresses each broker pod started with, and the pods whose address has
    changed since (pod → why). The status records them with the pod's uid; a pod not seen
    before started with the addresses the ConfigMap has now. The addresses are not in the
    pods' template, so this is how a broker whose load balancer moved gets restarted."""
    previous = {
        node.get("pod"): node for node in ((resource.get("status") or {}).get("nodes") or [])
    }
    started: dict[str, tuple[str, dict[str, str]]] = {}
    moved: dict[str, str] = {}
    for pool in pools(cluster.spec):
        addresses = external.get(pool.role)
        if not pool.is_broker or addresses is None:
            continue
        for pod in observed.pods:
            if pod.pool != pool.role or pod.uid is None or pod.host_ip is None:
                continue
            wanted = {
                listener: by_ordinal[pod.ordinal].replace(NODE_HOST, bracketed(pod.host_ip))
                for listener, by_ordinal in addresses.items()
                if pod.ordinal in by_ordinal
            }
            before = previous.get(pod.name) or {}
            recorded = before.get("addresses") if before.get("podUid") == pod.uid else None
            had = dict(recorded) if isinstance(recorded, Mapping) else wanted
            started[pod.name] = (pod.uid, had)
            changed = [f"{n} ({had.get(n)} → {a})" for n, a in wanted.items() if had.get(n) != a]
            if changed:
                moved[pod.name] = "its external address changed: " + ", ".join(changed)
    return started, moved


def bootstrap_servers_of(target: Target, listener: Listener, observed: Observed) -> str:
    """Where a client bootstraps from on the listener; for a node port, every node a broker
    runs on; empty while an external address is not known."""
    if listener.type == "internal":
        return bootstrap_servers(target, listener)
    service = observed.services.get(external_bootstrap_name(target, listener))
    if service is None:
        return ""
    if listener.type == "loadbalancer":
        return ",".join(f"{bracketed(host)}:{listener.port}" for host in service.ingress)
    if service.node_port is None:
        return ""
    hosts = sorted({p.host_ip for p in observed.pods if p.host_ip and p.pool in BROKER_ROLES})
    return ",".join(f"{bracketed(host)}:{service.node_port}" for host in hosts)
