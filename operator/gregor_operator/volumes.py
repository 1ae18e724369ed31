"""Volumes: which nodes have run on a formatted volume, and which new volumes the operator may
format.

What it owns: from the resource and what the planner observed, the node ids whose pods format
no new volume (their pool's ConfigMap lists them, `objects.FORMATTED_FILE`), the brokers whose
new volume the user accepted (`gregor.dev/format-volumes`), the refusals of that annotation,
and what the status says of a node that finds its volume empty. What it must never do: make
the ConfigMaps (`objects` does), decide when a pod restarts (`planner` does), or call
Kubernetes. Design: ADR 0023.

A node id is *formatted* once its pod has been ready, or has run for `SETTLED_S` (its start
script formats before it starts the node); the status records it (`status.nodes[].formatted`)
for good. A pod of a formatted node formats nothing, so a node whose volume is lost or
replaced afterwards does not start: it says its metadata log dir is not formatted. For a
broker that is safe to accept: the annotation names the node ids whose new volume may be
formatted; each is left out of the ConfigMap's list until its pod is ready again, then taken
out of the annotation. For a voter it is refused: formatted anew, it would vote as a voter
that lost its log, and a majority counted with it could elect a leader without records the
quorum committed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.storage.meta_properties import NOT_FORMATTED

from .models import KafkaCluster
from .objects import Pool, Role, pools

if TYPE_CHECKING:
    from .observed import Observed, PodState

__all__ = [
    "FORMAT_ANNOTATION",
    "SETTLED_S",
    "Volumes",
    "lost_volume",
    "says_not_formatted",
    "volumes",
]

FORMAT_ANNOTATION = "gregor.dev/format-volumes"
"""On a `KafkaCluster`: node ids (comma-separated) of brokers whose new, empty volume the
operator may format; each is taken out once its broker runs on the new volume."""

SETTLED_S = 30.0
"""How long a pod's node must have run for its volume to count as formatted, when it has not
been ready yet (`gregor format` takes a second)."""


@dataclass(frozen=True, slots=True)
class Volumes:
    formatted: frozenset[int]
    """Node ids seen running on a formatted volume (the status records them)."""
    listed: frozenset[int]
    """What the ConfigMaps list: the formatted node ids but those to format again."""
    to_format: frozenset[int]
    """Brokers whose new volume the user accepted, not running on it yet."""
    refused: tuple[tuple[str, str], ...] = ()
    """(reason, message) for each node id of the annotation that is refused."""
    annotation: str | None = None
    """The annotation's value once the brokers it names run on their new volumes: what is
    left (empty: remove it); None when it stays as it is."""


def _node_pools(cluster: KafkaCluster, replicas: Mapping[Role, int]) -> dict[int, Pool]:
    return {
        pool.node_id_base + ordinal: pool
        for pool in pools(cluster.spec)
        for ordinal in range(replicas.get(pool.role, pool.spec.replicas))
    }


def _pod_node_ids(cluster: KafkaCluster, observed: Observed) -> dict[str, int]:
    bases = {pool.role: pool.node_id_base for pool in pools(cluster.spec)}
    return {pod.name: bases[pod.pool] + pod.ordinal for pod in observed.pods if pod.pool in bases}


def _running(pod: PodState) -> bool:
    return not pod.deleting and (pod.ready or pod.running_for_s >= SETTLED_S)


def volumes(
    resource: Mapping[str, Any],
    cluster: KafkaCluster,
    observed: Observed,
    replicas: Mapping[Role, int],
) -> Volumes:
    """The module's rules, from the status the last reconciliation wrote, the pods as they
    are now and the resource's `gregor.dev/format-volumes`."""
    nodes = _node_pools(cluster, replicas)
    status = resource.get("status") or {}
    recorded = {
        node.get("nodeId") for node in status.get("nodes") or [] if node.get("formatted") is True
    }
    by_pod = _pod_node_ids(cluster, observed)
    running = {by_pod[pod.name] for pod in observed.pods if pod.name in by_pod and _running(pod)}
    ready = {
        by_pod[pod.name]
        for pod in observed.pods
        if pod.name in by_pod and pod.ready and not pod.deleting
    }
    formatted = frozenset(node_id for node_id in nodes if node_id in recorded | running)
    annotations = (resource.get("metadata") or {}).get("annotations") or {}
    written = annotations.get(FORMAT_ANNOTATION)
    if written is None:
        return Volumes(formatted, formatted, frozenset())
    asked, refused = _requests(str(written), nodes)
    done = {node_id for node_id in asked if node_id in ready}
    to_format = frozenset(asked - done)
    left = None
    if done:
        tokens = (t.strip() for t in str(written).split(","))
        left = ",".join(t for t in tokens if t and not (t.isdigit() and int(t) in done))
    return Volumes(formatted, formatted - to_format, to_format, tuple(refused), left)


def _requests(written: str, nodes: Mapping[int, Pool]) -> tuple[set[int], list[tuple[str, str]]]:
    """The brokers whose new volume may be formatted, and the refusals of the rest."""
    asked: set[int] = set()
    refused: list[tuple[str, str]] = []
    for token in (t.strip() for t in written.split(",")):
        if not token:
            continue
        if not token.isdigit():
            refused.append(("FormatRefused", f"{FORMAT_ANNOTATION}: {token!r} is not a node id"))
            continue
        node_id = int(token)
        pool = nodes.get(node_id)
        if pool is None:
            refused.append(("FormatRefused", f"{FORMAT_ANNOTATION}: no node {node_id} here"))
        elif pool.is_controller:
            refused.append(
                (
                    "FormatRefused",
                    f"{FORMAT_ANNOTATION}: node {node_id} is a voter of the metadata quorum: "
                    "formatting its new volume would let it vote as a voter that lost its log, "
                    "and a majority counted with it could elect a leader without records the "
                    "quorum committed; restore its volume from a backup (voters cannot be "
                    "replaced yet)",
                )
            )
        else:
            asked.add(node_id)
    return asked, refused


def says_not_formatted(pod: PodState) -> bool:
    """Whether the pod's node last exited because its metadata log dir is not formatted."""
    return pod.last_error is not None and NOT_FORMATTED in pod.last_error


def lost_volume(
    cluster: str, pool: Pool, node_id: int, pod: str, to_format: Collection[int]
) -> str:
    """What the status says of a node that finds its volume empty, and what to do."""
    if node_id in to_format:
        return f"{pod} (node {node_id}): its new volume is being formatted ({FORMAT_ANNOTATION})"
    if pool.is_controller:
        return (
            f"{pod} (node {node_id}, a voter) finds its volume empty, lost or replaced: "
            "formatting a new one would let it vote as a voter that lost its log; restore "
            "the volume from a backup (voters cannot be replaced yet)"
        )
    return (
        f"{pod} (node {node_id}) finds its volume empty, lost or replaced: to take a new one, "
        f"`kubectl annotate kafkacluster {cluster} {FORMAT_ANNOTATION}={node_id}` (the broker "
        "comes back as a new directory and fetches its replicas again)"
    )
