"""The Kubernetes objects a `KafkaCluster` is made of, generated from its spec.

What it owns: one generator per owned kind — the nodes' ConfigMaps (each pool's
server.properties), the headless Service that gives each pod its DNS name, the bootstrap
Service, the StatefulSets, their PodDisruptionBudgets, the pods' ServiceAccount and the
Secret that holds the cluster id — and how a pod becomes a node: its node id from its
ordinal, its advertised listeners from its DNS name. What it must never do: read the cluster
or decide when to apply or restart anything (`planner` does), or call Kubernetes.

Every node of a pool runs the same server.properties; the only per-pod properties,
`node.id` and `advertised.listeners`, come from the pod's own name when it starts. A pod
formats its volume (`gregor format`) only for a node id its pool's ConfigMap does not list as
formatted already (a new node), or always on an ephemeral volume; a known node whose volume
is empty then does not start (ADR 0023). An external
listener (`nodeport`, `loadbalancer`) gets a Service per broker and one to bootstrap from; the
address each broker advertises on it (its node's address and its Service's node port, or its
load balancer's address) is known only once Kubernetes has allocated it, and is written into
the pool's template, one line per ordinal. So a pod
runs its pool's current configuration exactly when it runs its StatefulSet's current
revision, and the template carries a hash of the configuration to make a new revision when
it changes. The StatefulSets update `OnDelete`: the operator picks when each pod restarts.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from broker.metadata.broker_configs import LIVE_PER_BROKER_CONFIGS

from .models import KafkaCluster, KafkaClusterSpec, Listener, NodePool, Storage

__all__ = [
    "BROKER_ROLES",
    "CONTROLLER_PORT",
    "DRY_RUN_ANNOTATION",
    "EXTERNAL_LABEL",
    "FORMATTED_FILE",
    "METRICS_PORT",
    "NODE_HOST",
    "RACK_ANNOTATION",
    "REPLICATION_PORT",
    "TEMPLATE_HASH",
    "VOTER_ROLES",
    "Claims",
    "External",
    "Pool",
    "Target",
    "bootstrap_address",
    "bootstrap_servers",
    "bracketed",
    "claims_of",
    "desired_objects",
    "external_bootstrap_name",
    "external_listeners",
    "external_service_name",
    "owned_metadata",
    "pools",
    "server_properties",
    "template_hash",
]

Role = Literal["controller", "broker", "combined"]
BROKER_ROLES: frozenset[Role] = frozenset({"broker", "combined"})
VOTER_ROLES: frozenset[Role] = frozenset({"controller", "combined"})
"""The pools whose nodes are brokers, and those whose nodes are the metadata quorum's voters."""

CONTROLLER_PORT = 9093
REPLICATION_PORT = 9091
METRICS_PORT = 9404
DATA_DIR = "/var/lib/gregor"
CONFIG_DIR = "/etc/gregor"
FIELD_MANAGER = "gregor-operator"
CONFIG_HASH = "gregor.dev/config-hash"
TEMPLATE_HASH = "gregor.dev/template-hash"
"""On a StatefulSet: the hash of the pod template the operator wrote (`template_hash`)."""
EXTERNAL_LABEL = "gregor.dev/listener"
"""On the Services of an external listener: the listener's name."""
RACK_ANNOTATION = "gregor.dev/rack"
"""On a broker's pod, with `spec.rack`: its node's label, which the operator copies there and
the pod reads (through the downward API) as its `broker.rack` when it starts. The pod needs
no access to nodes."""
POD_INFO_DIR = "/etc/gregor/pod"
RESTART_ANNOTATION = "gregor.dev/restart"
"""On a pod (any value): restart it, in its turn and under the roll's rules (Strimzi's
manual rolling update). The pod that replaces it does not carry it, so it restarts once."""
DRY_RUN_ANNOTATION = "gregor.dev/dry-run"
"""On a KafkaCluster (any value): apply nothing, restart nothing; say in `status.dryRun` what
the spec would restart, set without a restart, add or refuse."""
SERVICE_TYPES = {"nodeport": "NodePort", "loadbalancer": "LoadBalancer"}
DEFAULT_IMAGE = "gregor-broker:dev"

External = Mapping[str, Mapping[int, str]]
"""The address each broker advertises on each external listener: listener name → ordinal
(in the pool) → `host:port`, where a node port's host is `NODE_HOST`, the pod's node."""

NODE_HOST = "@node@"
"""Stands for the address of the node a pod runs on, which its command puts in: the downward
API's `status.hostIP`, in brackets when it is IPv6 (as `advertised.listeners` needs)."""

Claims = tuple[str, str | None] | None
"""A pool's data volume: the (size, storage class) of each pod's claim; None: an emptyDir."""


def claims_of(storage: Storage) -> Claims:
    return None if storage.type == "ephemeral" else (storage.size, storage.storage_class)


CONTROLLER_ID_BASE = 1000
"""Controllers' node ids are 1000 + ordinal, brokers' and combined nodes' their ordinal: a
pool holds at most 100 nodes, so the ranges never meet and a node keeps its id for life."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where the cluster runs: what a generator needs besides the resource itself."""

    namespace: str
    name: str
    uid: str
    cluster_id: str
    image: str = DEFAULT_IMAGE
    """The broker image when the spec names none: the one released with the operator."""
    cluster_domain: str = "cluster.local"


@dataclass(frozen=True, slots=True)
class Pool:
    """One StatefulSet of nodes with the same roles."""

    role: Role
    spec: NodePool

    @property
    def roles(self) -> tuple[str, ...]:
        return ("broker", "controller") if self.role == "combined" else (self.role,)

    @property
    def node_id_base(self) -> int:
        return CONTROLLER_ID_BASE if self.role == "controller" else 0

    @property
    def is_broker(self) -> bool:
        return self.role in BROKER_ROLES

    @property
    def is_controller(self) -> bool:
        return self.role in VOTER_ROLES


def pools(spec: KafkaClusterSpec) -> list[Pool]:
    """Controllers first: they are started, and rolled, before the brokers."""
    found: list[Pool] = []
    for role, pool in (
        ("controller", spec.controllers),
        ("combined", spec.combined),
        ("broker", spec.brokers),
    ):
        if pool is not None:
            found.append(Pool(role, pool))  # type: ignore[arg-type]
    return found


# -- names and labels -------------------------------------------------------------------------


def statefulset_name(target: Target, pool: Pool) -> str:
    return f"{target.name}-{pool.role}"


def pod_name(target: Target, pool: Pool, ordinal: int) -> str:
    return f"{statefulset_name(target, pool)}-{ordinal}"


def headless_name(target: Target) -> str:
    return f"{target.name}-nodes"


def bootstrap_name(target: Target) -> str:
    return f"{target.name}-bootstrap"


def bootstrap_address(cluster: str, namespace: str, cluster_domain: str, port: int) -> str:
    """`host:port` where a client in the Kubernetes cluster bootstraps from the listener on
    `port` of the cluster named `cluster`."""
    return f"{cluster}-bootstrap.{namespace}.svc.{cluster_domain}:{port}"


def bracketed(host: str) -> str:
    """A host as `host:port` needs it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def external_bootstrap_name(target: Target, listener: Listener) -> str:
    return f"{target.name}-bootstrap-{listener.name}"


def external_service_name(target: Target, pool: Pool, ordinal: int, listener: Listener) -> str:
    return f"{pod_name(target, pool, ordinal)}-{listener.name}"


def external_listeners(spec: KafkaClusterSpec) -> list[Listener]:
    return [listener for listener in spec.listeners if listener.type != "internal"]


def cluster_id_secret_name(cluster: str) -> str:
    return f"{cluster}-cluster-id"


def _config_map_name(target: Target, pool: Pool) -> str:
    return f"{statefulset_name(target, pool)}-config"


def _pod_host(target: Target, pod: str) -> str:
    return f"{pod}.{headless_name(target)}.{target.namespace}.svc.{target.cluster_domain}"


def cluster_labels(target: Target) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "gregor",
        "app.kubernetes.io/instance": target.name,
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        "gregor.dev/cluster": target.name,
    }


def pool_selector(target: Target, pool: Pool) -> dict[str, str]:
    return {"gregor.dev/cluster": target.name, "gregor.dev/pool": pool.role}


def pool_labels(target: Target, pool: Pool) -> dict[str, str]:
    labels = cluster_labels(target) | pool_selector(target, pool)
    labels["app.kubernetes.io/component"] = pool.role
    if pool.is_broker:
        labels["gregor.dev/broker"] = "true"
    return labels


def owned_metadata(target: Target, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """An object's metadata, owned by its cluster (and deleted with it)."""
    return {
        "name": name,
        "namespace": target.namespace,
        "labels": dict(labels),
        "ownerReferences": [
            {
                "apiVersion": "gregor.dev/v1alpha1",
                "kind": "KafkaCluster",
                "name": target.name,
                "uid": target.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


# -- configuration ----------------------------------------------------------------------------


def _kafka_name(listener: Listener) -> str:
    return listener.name.upper()


def voters(target: Target, spec: KafkaClusterSpec) -> str:
    """`controller.quorum.voters`: every controller's node id and DNS name."""
    return ",".join(
        f"{pool.node_id_base + ordinal}@{_pod_host(target, pod_name(target, pool, ordinal))}"
        f":{CONTROLLER_PORT}"
        for pool in pools(spec)
        if pool.is_controller
        for ordinal in range(pool.spec.replicas)
    )


def _listeners(spec: KafkaClusterSpec, pool: Pool) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    if pool.is_broker:
        found.append(("REPLICATION", REPLICATION_PORT))
        found += [(_kafka_name(listener), listener.port) for listener in spec.listeners]
    if pool.is_controller:
        found.append(("CONTROLLER", CONTROLLER_PORT))
    return found


def server_properties(target: Target, spec: KafkaClusterSpec, pool: Pool) -> dict[str, str]:
    """The pool's server.properties, as every node of it reads it (`node.id` and
    `advertised.listeners` come from the pod: see `_command`)."""
    listeners = _listeners(spec, pool)
    names = [name for name, _ in listeners]
    if "CONTROLLER" not in names:  # a broker reaches the controllers on it
        names.append("CONTROLLER")
    owned = {
        "process.roles": ",".join(pool.roles),
        "controller.quorum.voters": voters(target, spec),
        "controller.listener.names": "CONTROLLER",
        "listeners": ",".join(f"{name}://:{port}" for name, port in listeners),
        "listener.security.protocol.map": ",".join(f"{name}:PLAINTEXT" for name in names),
        "inter.broker.listener.name": "REPLICATION",
        "log.dirs": f"{DATA_DIR}/log",
        "gregor.metrics.listener": f"http://0.0.0.0:{METRICS_PORT}",
    }
    user = spec.config.properties() if spec.config is not None else {}
    return owned | user


def _properties_text(properties: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in properties.items())


def _address_variable(listener: Listener) -> str:
    return f"GREGOR_ADDRESS_{_kafka_name(listener)}"


ADDRESSES_FILE = "addresses"
"""In the pool's ConfigMap: `<LISTENER>.<ordinal>=<host:port>`, a line per broker and
external listener; each pod reads its own lines when it starts."""

FORMATTED_FILE = "formatted"
"""In a persistent pool's ConfigMap: the node ids (a line each) the operator has seen run on a
formatted volume. A pod formats its volume only for a node id not listed."""


def _format_script(ephemeral: bool) -> str:
    """`gregor format` for a new node: one not listed in the ConfigMap's `formatted`, or any
    on an ephemeral volume. `--ignore-formatted` leaves a volume formatted already as it is
    (a new node's pod that started before, or a node not listed yet)."""
    command = (
        f"gregor format --config {CONFIG_DIR}/server.properties "
        '--override "node.id=$GREGOR_NODE_ID" --cluster-id="$GREGOR_CLUSTER_ID" '
        "--ignore-formatted || exit 1"
    )
    if ephemeral:
        return command
    return f'grep -qsx "$GREGOR_NODE_ID" {CONFIG_DIR}/{FORMATTED_FILE} || {command}'


def _command(target: Target, spec: KafkaClusterSpec, pool: Pool, *, ephemeral: bool) -> list[str]:
    """The node's command: its ordinal is the end of its pod's name, its id the pool's base
    plus the ordinal, its advertised listeners its own DNS name, and on an external listener
    its line of the ConfigMap's `addresses`. It formats the volume of a new node only
    (`_format_script`), and starts the node with the cluster id, which checks the volume is
    this cluster's. The template is the same for every pod, so a scale-up (new lines in the
    ConfigMap) restarts no running pod."""
    overrides = ['--override "node.id=$GREGOR_NODE_ID"']
    lines = ["GREGOR_NODE_ID=$((GREGOR_NODE_ID_BASE + ${POD_NAME##*-}))"]
    outside = {_kafka_name(listener): listener for listener in external_listeners(spec)}
    if pool.is_broker and outside:
        if any(listener.type == "nodeport" for listener in outside.values()):
            lines.append(
                'case "$HOST_IP" in *:*) GREGOR_NODE_HOST="[$HOST_IP]" ;; '
                '*) GREGOR_NODE_HOST="$HOST_IP" ;; esac'
            )
        for name, listener in outside.items():
            variable = _address_variable(listener)
            lines.append(
                f'{variable}=$(sed -n "s/^{name}\\.${{POD_NAME##*-}}=//p" '
                f'{CONFIG_DIR}/{ADDRESSES_FILE} | sed "s/{NODE_HOST}/$GREGOR_NODE_HOST/")'
            )
            lines.append(
                f'[ -n "${variable}" ] || {{ echo "$POD_NAME has no address on listener '
                f'{listener.name} yet" >&2; exit 1; }}'
            )
    if pool.is_broker:
        host = _pod_host(target, "${POD_NAME}")
        advertised = []
        for name, port in _listeners(spec, pool):
            if name == "CONTROLLER":
                continue
            if name in outside:
                advertised.append(f"{name}://${{{_address_variable(outside[name])}}}")
            else:
                advertised.append(f"{name}://{host}:{port}")
        overrides.append(f'--override "advertised.listeners={",".join(advertised)}"')
    if pool.is_broker and spec.rack is not None:
        lines.append(_rack_script(spec.rack.topology_key))
        overrides.append('--override "broker.rack=$GREGOR_RACK"')
    lines.append(_format_script(ephemeral))
    script = (
        f"exec gregor broker --config {CONFIG_DIR}/server.properties "
        f'--cluster-id="$GREGOR_CLUSTER_ID" ' + " ".join(overrides)
    )
    return ["/bin/sh", "-c", "\n".join([*lines, script])]


def _rack_script(topology_key: str) -> str:
    """Wait for the operator to put the node's `topology_key` label on the pod (as
    RACK_ANNOTATION), read through the downward API's annotations file."""
    pattern = RACK_ANNOTATION.replace(".", "\\.").replace("/", "\\/")
    return "\n".join(
        [
            'GREGOR_RACK=""',
            'while [ -z "$GREGOR_RACK" ]; do',
            f"  GREGOR_RACK=$(sed -n 's/^{pattern}=\"\\(.*\\)\"$/\\1/p' "
            f"{POD_INFO_DIR}/annotations 2>/dev/null)",
            f'  [ -n "$GREGOR_RACK" ] || {{ echo "waiting for the operator to give $POD_NAME '
            f"its rack (its node's label {topology_key})\" >&2; sleep 2; }}",
            "done",
        ]
    )


def _spread(
    target: Target, spec: KafkaClusterSpec, pool: Pool, theirs: list[dict[str, Any]] | None
) -> list[dict[str, Any]] | None:
    """The pod's topology spread constraints: the user's, and with `spec.rack` one that
    spreads the pool over the rack label's values (one pod more at most in any), unless the
    user already spreads over that key. Nodes without the label take none of its pods."""
    constraints = list(theirs or [])
    if spec.rack is None:
        return constraints or None
    key = spec.rack.topology_key
    if not any(c.get("topologyKey") == key for c in constraints):
        constraints.append(
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": pool_selector(target, pool)},
            }
        )
    return constraints


def config_hash(target: Target, spec: KafkaClusterSpec, pool: Pool, *, ephemeral: bool) -> str:
    """What a pod of the pool runs, as one hash: a change makes a new revision to roll to.
    The external addresses and the formatted node ids are not in it: they change as the
    cluster grows, and a pod whose address changed is restarted on its own (`planner`). Nor
    are the values of the configs running brokers take as they change (`live_configs`):
    those are set on each broker instead, and restart nothing."""
    properties = {
        key: value
        for key, value in server_properties(target, spec, pool).items()
        if key not in LIVE_PER_BROKER_CONFIGS
    }
    text = _properties_text(properties) + "\0".join(
        _command(target, spec, pool, ephemeral=ephemeral)
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- the objects ------------------------------------------------------------------------------


def config_map(
    target: Target,
    spec: KafkaClusterSpec,
    pool: Pool,
    external: External | None = None,
    formatted: Collection[int] | None = None,
) -> dict[str, Any]:
    """The pool's server.properties; its brokers' external addresses; and, for a pool on
    persistent volumes (`formatted` not None), the node ids whose volumes are formatted."""
    data = {"server.properties": _properties_text(server_properties(target, spec, pool))}
    if formatted is not None:
        data[FORMATTED_FILE] = "".join(f"{node_id}\n" for node_id in sorted(formatted))
    if pool.is_broker and external_listeners(spec):
        data[ADDRESSES_FILE] = "".join(
            f"{_kafka_name(listener)}.{ordinal}={(external or {})[listener.name][ordinal]}\n"
            for listener in external_listeners(spec)
            for ordinal in sorted((external or {}).get(listener.name, {}))
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owned_metadata(
            target, _config_map_name(target, pool), pool_labels(target, pool)
        ),
        "data": data,
    }


def _service_ports(spec: KafkaClusterSpec, pool_roles: set[str]) -> list[dict[str, Any]]:
    ports = [
        {"name": listener.name, "port": listener.port, "targetPort": listener.port}
        for listener in spec.listeners
    ]
    if "controller" in pool_roles:
        ports.append({"name": "controller", "port": CONTROLLER_PORT})
    ports.append({"name": "replication", "port": REPLICATION_PORT})
    return ports


def headless_service(target: Target, spec: KafkaClusterSpec) -> dict[str, Any]:
    """Every node's own DNS name, ready or not (controllers find each other before any is
    ready)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owned_metadata(target, headless_name(target), cluster_labels(target)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"gregor.dev/cluster": target.name},
            "ports": _service_ports(spec, {"controller"}),
        },
    }


def bootstrap_service(target: Target, spec: KafkaClusterSpec) -> dict[str, Any]:
    """Where clients bootstrap: the ready brokers, on each client listener."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owned_metadata(target, bootstrap_name(target), cluster_labels(target)),
        "spec": {
            "type": "ClusterIP",
            "selector": {"gregor.dev/cluster": target.name, "gregor.dev/broker": "true"},
            "ports": [
                {"name": listener.name, "port": listener.port, "targetPort": listener.port}
                for listener in spec.listeners
            ],
        },
    }


def _external_service(
    target: Target, listener: Listener, name: str, selector: Mapping[str, str]
) -> dict[str, Any]:
    labels = cluster_labels(target) | {EXTERNAL_LABEL: listener.name}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owned_metadata(target, name, labels),
        "spec": {
            "type": SERVICE_TYPES[listener.type],
            "selector": dict(selector),
            "ports": [
                {
                    "name": listener.name,
                    "port": listener.port,
                    "targetPort": listener.port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def external_services(
    target: Target, spec: KafkaClusterSpec, replicas: Mapping[Role, int] | None = None
) -> list[dict[str, Any]]:
    """Each external listener's Services: one to bootstrap from (every ready broker) and one
    per broker (its pod alone), which is the address the broker advertises."""
    found = []
    for listener in external_listeners(spec):
        found.append(
            _external_service(
                target,
                listener,
                external_bootstrap_name(target, listener),
                {"gregor.dev/cluster": target.name, "gregor.dev/broker": "true"},
            )
        )
        for pool in pools(spec):
            if not pool.is_broker:
                continue
            for ordinal in range((replicas or {}).get(pool.role, pool.spec.replicas)):
                found.append(
                    _external_service(
                        target,
                        listener,
                        external_service_name(target, pool, ordinal, listener),
                        {"statefulset.kubernetes.io/pod-name": pod_name(target, pool, ordinal)},
                    )
                )
    return found


def bootstrap_servers(target: Target, listener: Listener) -> str:
    return bootstrap_address(target.name, target.namespace, target.cluster_domain, listener.port)


def cluster_id_secret(target: Target) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": owned_metadata(
            target, cluster_id_secret_name(target.name), cluster_labels(target)
        ),
        "type": "Opaque",
        "data": {"cluster.id": base64.b64encode(target.cluster_id.encode()).decode()},
    }


def service_account(target: Target) -> dict[str, Any]:
    """The nodes' identity: they do not call the Kubernetes API, so no token is mounted."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": owned_metadata(target, f"{target.name}-node", cluster_labels(target)),
        "automountServiceAccountToken": False,
    }


def pod_disruption_budget(target: Target, pool: Pool) -> dict[str, Any]:
    """Evictions (`kubectl drain`, a node upgrade, an autoscaler): at most one controller at
    a time, so a drain never takes two voters; no broker at all (nor combined node): which
    brokers may stop together depends on their partitions' ISRs, which only their restart
    verdicts know, so a broker on a cordoned node is moved by the roll instead (`roller`,
    rule 1), one or a verified batch at a time, and the drain goes on once it is gone."""
    unavailable = 0 if pool.is_broker else 1
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owned_metadata(
            target, statefulset_name(target, pool), pool_labels(target, pool)
        ),
        "spec": {
            "maxUnavailable": unavailable,
            "selector": {"matchLabels": pool_selector(target, pool)},
        },
    }


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": METRICS_PORT},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _container(
    target: Target, spec: KafkaClusterSpec, pool: Pool, *, ephemeral: bool
) -> dict[str, Any]:
    ports = [
        {"name": name.lower()[:15], "containerPort": port} for name, port in _listeners(spec, pool)
    ]
    ports.append({"name": "metrics", "containerPort": METRICS_PORT})
    container: dict[str, Any] = {
        "name": "gregor",
        "image": spec.image or target.image,
        "command": _command(target, spec, pool, ephemeral=ephemeral),
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "GREGOR_NODE_ID_BASE", "value": str(pool.node_id_base)},
            {
                "name": "GREGOR_CLUSTER_ID",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": cluster_id_secret_name(target.name),
                        "key": "cluster.id",
                    }
                },
            },
        ],
        "ports": ports,
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
        # Log recovery after a crash may take minutes: liveness starts once /livez answers.
        "startupProbe": _probe("/livez", 5, 120),
        "livenessProbe": _probe("/livez", 10, 3),
        "readinessProbe": _probe("/readyz", 5, 3),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        # What a node that refused to start said (its log's end), for the status to show.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if pool.is_broker and any(listener.type == "nodeport" for listener in spec.listeners):
        # A node port is reached at the address of the node the pod runs on.
        container["env"].append(
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}
        )
    resources = pool.spec.resources
    if resources is not None:
        container["resources"] = resources.model_dump(exclude_none=True)
    return container


def statefulset(
    target: Target, spec: KafkaClusterSpec, pool: Pool, replicas: int, claims: Claims
) -> dict[str, Any]:
    """The pool's nodes. `replicas` and `claims` are what the planner allows (a scale-down
    or a storage change it refuses keeps the current ones)."""
    template = spec.template
    labels = pool_labels(target, pool) | dict((template.labels if template else None) or {})
    # The operator's own pod annotations are its to set: one in the template would ask every
    # pod to restart for ever, or give every broker the same rack.
    annotations = {
        key: value
        for key, value in ((template.annotations if template else None) or {}).items()
        if key not in (RACK_ANNOTATION, RESTART_ANNOTATION)
    }
    annotations[CONFIG_HASH] = config_hash(target, spec, pool, ephemeral=claims is None)
    if spec.metrics.enabled:
        annotations |= {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT)}
    pod_spec: dict[str, Any] = {
        "serviceAccountName": f"{target.name}-node",
        "automountServiceAccountToken": False,
        # SIGTERM is a controlled shutdown: leaderships move before the node exits.
        "terminationGracePeriodSeconds": 120,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
        },
        "containers": [_container(target, spec, pool, ephemeral=claims is None)],
        "volumes": [
            {"name": "config", "configMap": {"name": _config_map_name(target, pool)}},
        ],
    }
    if template is not None:
        for field in ("affinity", "tolerations"):
            value = getattr(template, field)
            if value is not None:
                pod_spec[_camel(field)] = value
        if template.priority_class_name is not None:
            pod_spec["priorityClassName"] = template.priority_class_name
        if template.security_context is not None:
            pod_spec["securityContext"] = template.security_context
    spread = _spread(target, spec, pool, template.topology_spread_constraints if template else None)
    if spread is not None:
        pod_spec["topologySpreadConstraints"] = spread
    if pool.is_broker and spec.rack is not None:
        pod_spec["volumes"].append(
            {
                "name": "pod-info",
                "downwardAPI": {
                    "items": [
                        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
                    ]
                },
            }
        )
        pod_spec["containers"][0]["volumeMounts"].append(
            {"name": "pod-info", "mountPath": POD_INFO_DIR, "readOnly": True}
        )
    sts_spec: dict[str, Any] = {
        "replicas": replicas,
        "serviceName": headless_name(target),
        "selector": {"matchLabels": pool_selector(target, pool)},
        # Controllers must all start to elect a leader: none is ready before a quorum is.
        "podManagementPolicy": "Parallel",
        "updateStrategy": {"type": "OnDelete"},
        "persistentVolumeClaimRetentionPolicy": {
            "whenDeleted": "Delete" if spec.delete_claims else "Retain",
            "whenScaled": "Retain",
        },
        "template": {
            "metadata": {"labels": labels, "annotations": annotations},
            "spec": pod_spec,
        },
    }
    if claims is None:
        pod_spec["volumes"].append({"name": "data", "emptyDir": {}})
    else:
        size, storage_class = claims
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
        }
        if storage_class is not None:
            claim["storageClassName"] = storage_class
        sts_spec["volumeClaimTemplates"] = [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "labels": pool_labels(target, pool)},
                "spec": claim,
            }
        ]
    metadata = owned_metadata(target, statefulset_name(target, pool), pool_labels(target, pool))
    metadata["annotations"] = {TEMPLATE_HASH: template_hash(sts_spec["template"])}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata, "spec": sts_spec}


def template_hash(template: Mapping[str, Any]) -> str:
    """A pod template as one hash: the StatefulSet carries its own (`TEMPLATE_HASH`), so a
    dry run can tell which pools a spec would give a new revision, and so restart."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.title() for word in rest)


def desired_objects(
    target: Target,
    cluster: KafkaCluster,
    replicas: Mapping[Role, int] | None = None,
    claims: Mapping[Role, Claims] | None = None,
    external: Mapping[Role, External] | None = None,
    *,
    formatted: Collection[int] = (),
) -> list[dict[str, Any]]:
    """Every object of the cluster, in the order they are applied: what the pods need before
    the StatefulSets that start them. `replicas` and `claims` override a pool's size and
    volume (a refused scale-down or storage change keeps the current ones). With external
    listeners, a broker pool's ConfigMap and StatefulSet are left out until `external` has
    its addresses: a pod would start with a configuration it has no address for. The pods of
    node ids in `formatted` format no new volume."""
    spec = cluster.spec
    found = [
        service_account(target),
        cluster_id_secret(target),
        headless_service(target, spec),
        bootstrap_service(target, spec),
        *external_services(target, spec, replicas),
    ]
    outside = external_listeners(spec)
    held = {
        pool.role
        for pool in pools(spec)
        if pool.is_broker and outside and (external or {}).get(pool.role) is None
    }
    volumes = {
        pool.role: (claims or {}).get(pool.role, claims_of(pool.spec.storage))
        for pool in pools(spec)
    }
    for pool in pools(spec):
        if pool.role not in held:
            count = (replicas or {}).get(pool.role, pool.spec.replicas)
            ids = range(pool.node_id_base, pool.node_id_base + count)
            listed = None if volumes[pool.role] is None else set(ids) & set(formatted)
            found.append(config_map(target, spec, pool, (external or {}).get(pool.role), listed))
    for pool in pools(spec):
        found.append(pod_disruption_budget(target, pool))
        if pool.role in held:
            continue
        count = (replicas or {}).get(pool.role, pool.spec.replicas)
        found.append(statefulset(target, spec, pool, count, volumes[pool.role]))
    return found
