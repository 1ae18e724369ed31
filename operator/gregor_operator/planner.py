"""The planner: what the operator does next for a `KafkaCluster`, decided from the resource,
what Kubernetes shows of its objects, and what the brokers say.

What it owns: every decision of a reconciliation — which objects to apply, which change to
refuse (and keep the old value for), which pod to restart next, and the status that says so.
It is pure: the same inputs give the same plan, and `tests/unit/operator` tries them by the
hundred without a cluster. What it must never do: call Kubernetes or Kafka, read a clock, or
apply half of an invalid spec.

Which pod a rolling restart takes next, and what holds it, is the roller's business
(`roller`, its rules numbered there); the planner gives it the pods the spec should have and
says what it decided.

An external listener's addresses come from Kubernetes: a Service's node port as soon as it
exists, a load balancer's address when the cloud has made one. They go into the pool's
ConfigMap, not its template, so a new broker's address restarts no other broker; the status
records what each broker pod started with. Until every broker of a pool has its address, the
pool's ConfigMap and StatefulSet are not applied (a pod would advertise nothing), and the
status says which Services are waited for. Services of a listener no longer in the spec are
deleted. (ADR 0022.)

Changes Kubernetes or this version cannot carry out safely are refused with a `ChangeRefused`
condition, and the current value is kept: scaling a pool down (the day-2 work moves the
partitions off first), resizing the controller quorum (its voters are static), and changing
a pool's storage (a StatefulSet's volume claims are immutable).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from broker.config import BrokerConfig, parse_properties
from broker.storage.config import InvalidConfig

from .listeners import (
    Started,
    bootstrap_servers_of,
    external_addresses,
    started_with,
)
from .live_configs import LIVE_PER_BROKER_CONFIGS, LiveChanges, live_changes, live_part
from .models import KafkaCluster, problems
from .objects import (
    BROKER_ROLES,
    DRY_RUN_ANNOTATION,
    RACK_ANNOTATION,
    TEMPLATE_HASH,
    Claims,
    Pool,
    Role,
    Target,
    claims_of,
    desired_objects,
    pod_name,
    pools,
    server_properties,
    statefulset_name,
)
from .observed import (
    STUCK_REASONS,
    BrokerFacts,
    Observed,
    PodState,
    ServiceState,
    StatefulSetState,
    Verdict,
)
from .roller import (
    Ask,
    Restart,
    Step,
    a_voter_is_due,
    due,
    next_step,
    node_id,
    reason,
    rollout_status,
    verdicts_wanted,
)
from .volumes import FORMAT_ANNOTATION, Volumes, lost_volume, says_not_formatted, volumes

__all__ = [
    "STUCK_REASONS",
    "Ask",
    "BrokerFacts",
    "ConditionState",
    "Observed",
    "Plan",
    "PodState",
    "Restart",
    "ServiceState",
    "StatefulSetState",
    "Verdict",
    "a_voter_is_due",
    "merge_conditions",
    "plan",
]

WAIT_S = 10.0
"""How soon to look again while something is in progress."""

QUORUM_GRACE_S = 30.0
"""How long dedicated controllers may run without a leader before the status calls it a
quorum that did not form (an election takes a second or two; a start, a few more)."""

PENDING_WAIT_S = 2.0
"""How soon to look again for addresses Kubernetes gives out (a node port: at once)."""

DNS_TTL_S = 30.0
"""How long the cluster DNS may answer with a pod's old address: CoreDNS's `ttl` and `cache`
as kubeadm configures them."""


@dataclass(frozen=True, slots=True)
class ConditionState:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    objects: list[dict[str, Any]]
    """What to apply, in order (empty for an invalid spec: nothing is half-applied)."""
    restarts: tuple[Restart, ...]
    """The pods to delete now: one, or a batch of brokers (`spec.rollout.maxParallel`)."""
    conditions: list[ConditionState]
    status: dict[str, Any]
    """Status fields besides the conditions and observedGeneration."""
    events: list[tuple[str, str, str]]
    """(type, reason, message) for Kubernetes Events."""
    requeue_after: float | None
    """Look again this soon (the handler does, when it is sooner than its timer)."""
    deletions: list[tuple[str, str]] = field(default_factory=list)
    """(kind, name) of owned objects the spec no longer has."""
    annotations: dict[str, str | None] = field(default_factory=dict)
    """The resource's own annotations to set (None: remove), once a request in one is done."""
    pod_annotations: dict[str, dict[str, str]] = field(default_factory=dict)
    """Annotations to set on the cluster's pods, by pod: each broker's rack (spec.rack)."""
    asks: list[Ask] = field(default_factory=list)
    """Restart verdicts the roll would weigh that `facts` lacks: the handler asks the nodes
    and plans again with their answers."""
    config_updates: Mapping[int, Mapping[str, str | None]] = field(default_factory=dict)
    """By broker node id: configs to set (None: delete) for that broker alone, which it
    applies without a restart (`live_configs`)."""
    applied: bool = True
    """False for a dry run (`gregor.dev/dry-run`): the spec's generation is not carried
    out, so `observedGeneration` stays what it was."""

    @property
    def restart(self) -> Restart | None:
        """The first pod to delete now, if any."""
        return self.restarts[0] if self.restarts else None


# -- the plan ---------------------------------------------------------------------------------


def plan(
    resource: Mapping[str, Any],
    *,
    namespace: str,
    cluster_id: str,
    observed: Observed,
    facts: BrokerFacts | None,
    image: str,
    cluster_domain: str = "cluster.local",
    dns_ttl_s: float = DNS_TTL_S,
) -> Plan:
    metadata = resource.get("metadata", {})
    try:
        cluster = KafkaCluster.model_validate(dict(resource) | {"status": None})
    except ValidationError as exc:
        return _invalid(problems(exc))
    target = Target(
        namespace=namespace,
        name=metadata.get("name", ""),
        uid=metadata.get("uid", ""),
        cluster_id=cluster_id,
        image=image,
        cluster_domain=cluster_domain,
    )
    refusal = _broker_refuses(target, cluster)
    if refusal is not None:
        return _invalid(refusal)
    replicas, refused = _allowed_replicas(cluster, observed)
    cluster = _voters_kept(cluster, replicas)
    claims, refused_claims = _allowed_claims(cluster, observed)
    refused += refused_claims
    external, pending = external_addresses(target, cluster, observed, replicas)
    disks = volumes(resource, cluster, observed, replicas)
    refused += disks.refused
    objects = desired_objects(target, cluster, replicas, claims, external, formatted=disks.listed)
    too_long = _names_too_long(objects)
    if too_long is not None:
        return _invalid(too_long, reason="NameTooLong")
    started, moved = started_with(resource, cluster, observed, external)
    every_pool = pools(cluster.spec)
    live = _live(cluster, facts)
    moved = _stale(target, every_pool, live, observed) | moved
    expected = [
        pod_name(target, pool, ordinal)
        for pool in every_pool
        for ordinal in range(replicas.get(pool.role, pool.spec.replicas))
    ]
    step = next_step(
        every_pool,
        expected,
        observed,
        facts,
        dns_ttl_s=dns_ttl_s,
        moved=moved,
        to_format=disks.to_format,
        paused=cluster.spec.rollout.paused,
        max_parallel=cluster.spec.rollout.max_parallel,
    )
    restart, settling = step.restart, step.settling
    asks = (
        [
            ask
            for ask in verdicts_wanted(every_pool, observed, moved, facts)
            if ask.nodes not in facts.verdicts
        ]
        if facts is not None and restart is None and not cluster.spec.rollout.paused
        else list(step.asks)
    )
    conditions, requeue = _conditions(
        cluster,
        observed,
        facts,
        replicas,
        step.restarts,
        target=target,
        settling=settling,
        held=step.held,
        moved=moved,
        disks=disks,
        live=live,
    )
    if pending and conditions[0].reason not in ("NodesStuck", "QuorumNotFormed", LOST_VOLUME):
        message = "waiting for Kubernetes to give these Services an address: " + ", ".join(
            name for name, _ in pending
        )
        conditions[0] = ConditionState("Ready", "False", "ExternalAddressesPending", message)
        if restart is None:
            conditions[1] = ConditionState(
                "Reconciling", "True", "ExternalAddressesPending", message
            )
        # A node port is allocated with its Service; a load balancer takes its time.
        soon = any(kind == "nodeport" for _, kind in pending)
        requeue = min(requeue or WAIT_S, PENDING_WAIT_S if soon else WAIT_S)
    if settling is not None and requeue is not None:
        requeue = min(requeue, settling[0])
    if refused:
        conditions.append(
            ConditionState("ChangeRefused", "True", refused[0][0], "; ".join(m for _, m in refused))
        )
    racks, unlabelled = _racks(cluster, observed)
    if racks:
        requeue = min(requeue or WAIT_S, PENDING_WAIT_S)  # the pods wait for it to start
    events = _events(cluster, observed, refused, unlabelled=unlabelled, step=step, live=live)
    wanted = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    found = Plan(
        objects=objects,
        restarts=step.restarts,
        conditions=conditions,
        status=_status(
            cluster, target, observed, facts, replicas, started=started, formatted=disks.formatted
        )
        | {
            "rollout": rollout_status(
                observed,
                moved,
                facts,
                step,
                paused=cluster.spec.rollout.paused,
                recorded=(resource.get("status") or {}).get("rollout"),
                expected=expected,
            ),
            "dryRun": None,
        },
        events=events,
        requeue_after=requeue,
        deletions=[
            ("Service", name)
            for name, service in sorted(observed.services.items())
            if service.listener is not None and service.owner == target.uid and name not in wanted
        ],
        annotations=(
            {} if disks.annotation is None else {FORMAT_ANNOTATION: disks.annotation or None}
        ),
        asks=asks,
        pod_annotations={pod: {RACK_ANNOTATION: rack} for pod, rack in racks.items()},
        config_updates=live.updates,
    )
    if DRY_RUN_ANNOTATION not in (metadata.get("annotations") or {}):
        return found
    report = _dry_run(
        every_pool=every_pool,
        target=target,
        objects=objects,
        observed=observed,
        moved=moved,
        expected=expected,
        refused=refused,
        generation=metadata.get("generation"),
    )
    rollout = rollout_status(
        observed,
        moved,
        facts,
        Step(held=f"held by the {DRY_RUN_ANNOTATION} annotation"),
        paused=cluster.spec.rollout.paused,
        recorded=(resource.get("status") or {}).get("rollout"),
        expected=expected,
    )
    return _held_for_dry_run(found, report, rollout)


def _events(
    cluster: KafkaCluster,
    observed: Observed,
    refused: Sequence[tuple[str, str]],
    *,
    unlabelled: Sequence[str],
    step: Step,
    live: LiveChanges,
) -> list[tuple[str, str, str]]:
    """The plan's Events: refusals, nodes the operator cannot read or that lack the rack
    label, each restart, and the configs set without one."""
    events = [("Warning", reason, message) for reason, message in refused]
    if observed.nodes_refused is not None:
        events.append(
            (
                "Warning",
                "NodesUnreadable",
                "the operator reads the nodes its pods run on, to follow drains and for "
                "spec.rack (the chart's ClusterRole gives it `get nodes`): "
                f"{observed.nodes_refused}",
            )
        )
    if unlabelled:
        key = cluster.spec.rack.topology_key if cluster.spec.rack else ""
        events.append(
            (
                "Warning",
                "RackLabelMissing",
                f"these pods' nodes have no label {key}, so they do not start: "
                + ", ".join(unlabelled),
            )
        )
    events += [
        ("Normal", "RollingRestart", f"restarting {each.pod}: {each.reason}")
        for each in step.restarts
    ]
    if live.updates:
        events.append(("Normal", "ConfigUpdated", "set without a restart: " + _live_text(live)))
    return events


def _held_for_dry_run(found: Plan, report: dict[str, Any], rollout: dict[str, Any] | None) -> Plan:
    """A dry run's plan: nothing applied, deleted, annotated, set or restarted; the status
    and conditions as they are, with the report and what holds the roll."""
    reconciling = ConditionState(
        "Reconciling",
        "False",
        "DryRun",
        f"nothing is applied while the resource carries {DRY_RUN_ANNOTATION}: " + report["summary"],
    )
    return Plan(
        objects=[],
        restarts=(),
        conditions=[found.conditions[0], reconciling, *found.conditions[2:]],
        status=found.status | {"rollout": rollout, "dryRun": report},
        events=[event for event in found.events if event[0] == "Warning"],
        requeue_after=None,  # the timer looks again; the annotation's removal, at once
        applied=False,
    )


def _dry_run(
    *,
    every_pool: Sequence[Pool],
    target: Target,
    objects: Sequence[Mapping[str, Any]],
    observed: Observed,
    moved: Mapping[str, str],
    expected: Sequence[str],
    refused: Sequence[tuple[str, str]],
    generation: int | None,
) -> dict[str, Any]:
    """`status.dryRun`: which pods the spec would restart and why (those already due, and
    every pod of a pool whose pod template it changes), which configs it would set on the
    running brokers instead, which pods it adds, and what it would refuse."""
    wanted_sets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}
    wanted_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    restarts = {pod.name: reason(pod, observed, moved) for pod in due(observed, moved)}
    live: dict[str, str | None] = {}
    for pool in every_pool:
        name = statefulset_name(target, pool)
        current = observed.statefulsets.get(pool.role)
        wanted = wanted_sets.get(name)
        config = wanted_maps.get(f"{name}-config")
        before = observed.properties.get(pool.role, {})
        after = parse_properties(config["data"]["server.properties"]) if config else before
        for key in sorted(set(live_part(before)) | set(live_part(after))):
            if before.get(key) != after.get(key):
                live[key] = after.get(key)
        if current is None or wanted is None:
            continue
        why = _template_change(wanted, current, before, after)
        for pod in observed.pods:
            if why is not None and pod.pool == pool.role and pod.name not in restarts:
                restarts[pod.name] = why
    present = {pod.name for pod in observed.pods}
    adds = [name for name in expected if name not in present]
    said = [f"{len(restarts)} pod(s) would restart" if restarts else "no pod would restart"]
    if live:
        said.append(f"{len(live)} config(s) would be set without a restart")
    if adds:
        said.append(f"{len(adds)} pod(s) would be added")
    if refused:
        said.append(f"{len(refused)} change(s) would be refused")
    return {
        "generation": generation,
        "summary": "; ".join(said),
        "restarts": [{"pod": pod, "reason": why} for pod, why in sorted(restarts.items())],
        "withoutRestart": [
            {"config": key} | ({} if value is None else {"value": value})
            for key, value in sorted(live.items())
        ],
        "adds": adds,
        "refused": [message for _, message in refused],
    }


def _template_change(
    wanted: Mapping[str, Any],
    current: StatefulSetState,
    before: Mapping[str, str],
    after: Mapping[str, str],
) -> str | None:
    """Why a pool's pods would restart: its new pod template (its image, the configuration
    they must restart to take, anything else of the pod), None if it keeps its template. A
    StatefulSet an earlier operator wrote has no template hash: its image and configuration
    are compared alone."""
    if current.template_hash == wanted["metadata"]["annotations"][TEMPLATE_HASH]:
        return None
    reasons = []
    image = wanted["spec"]["template"]["spec"]["containers"][0]["image"]
    if current.image is not None and image != current.image:
        reasons.append(f"its image changes ({current.image} → {image})")
    changed = [
        f"{key} ({before.get(key, 'unset')} → {after.get(key, 'unset')})"
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key) and key not in LIVE_PER_BROKER_CONFIGS
    ]
    if changed:
        reasons.append("its configuration changes: " + ", ".join(changed))
    if not reasons and current.template_hash is not None:
        reasons.append("its pod template changes")
    return "; ".join(reasons) or None


def _live(cluster: KafkaCluster, facts: BrokerFacts | None) -> LiveChanges:
    """What to set on running brokers, and which still run with what the spec dropped."""
    if facts is None or not facts.configs:
        return LiveChanges()
    wanted = live_part(cluster.spec.config.properties() if cluster.spec.config else {})
    return live_changes(wanted, facts.configs)


def _stale(
    target: Target, every_pool: Sequence[Pool], live: LiveChanges, observed: Observed
) -> dict[str, str]:
    """The broker pods to restart because they run with a config the spec no longer has
    (`live_configs`, rule 3), with why."""
    present = {pod.name for pod in observed.pods}
    found: dict[str, str] = {}
    for pool in every_pool:
        if not pool.is_broker:
            continue
        for node, keys in live.stale.items():
            ordinal = node - pool.node_id_base
            name = pod_name(target, pool, ordinal)
            if ordinal >= 0 and name in present:
                found[name] = f"it runs with {', '.join(keys)} from its file, no longer set"
    return found


def _live_text(live: LiveChanges) -> str:
    """What is set (or deleted) on which brokers."""
    by_change: dict[str, list[int]] = {}
    for node, changes in sorted(live.updates.items()):
        for key, value in sorted(changes.items()):
            said = f"{key}={value}" if value is not None else f"{key} (per-broker value deleted)"
            by_change.setdefault(said, []).append(node)
    return "; ".join(
        f"{said} on broker(s) {', '.join(map(str, nodes))}" for said, nodes in by_change.items()
    )


def _racks(cluster: KafkaCluster, observed: Observed) -> tuple[dict[str, str], list[str]]:
    """With `spec.rack`: the rack to tell each broker pod that was scheduled and does not
    have it yet (its node's label), and the pods whose node has no such label (or an empty
    one). A pod is told once: its broker runs with what it was told until it restarts."""
    rack = cluster.spec.rack
    if rack is None:
        return {}, []
    told: dict[str, str] = {}
    unlabelled: list[str] = []
    for pod in observed.pods:
        if pod.pool not in BROKER_ROLES or pod.node is None or pod.deleting:
            continue
        labels = observed.node_labels.get(pod.node)
        if labels is None:
            continue  # the node could not be read: nothing to say yet
        value = labels.get(rack.topology_key)
        if not value:
            unlabelled.append(f"{pod.name} (on {pod.node})")
        elif pod.rack is None:
            told[pod.name] = value  # once: the broker started with it
    return told, unlabelled


def _invalid(message: str, *, reason: str = "InvalidSpec") -> Plan:
    return Plan(
        objects=[],
        restarts=(),
        conditions=[
            ConditionState("Ready", "False", reason, message),
            ConditionState("Reconciling", "False", reason, "waiting for the spec to be fixed"),
        ],
        status={},
        events=[("Warning", reason, message)],
        requeue_after=None,
    )


MAX_NAME = {"Service": 63, "StatefulSet": 52}
"""A Service's name is a DNS label; a StatefulSet's, with the revision hash Kubernetes adds
to label its pods (`<name>-<10 characters>`), must fit in a label value."""


def _names_too_long(objects: Sequence[Mapping[str, Any]]) -> str | None:
    long = [
        f"{o['kind']} {o['metadata']['name']} ({len(o['metadata']['name'])} characters, at "
        f"most {MAX_NAME[o['kind']]})"
        for o in objects
        if len(o["metadata"]["name"]) > MAX_NAME.get(o["kind"], 253)
    ]
    if not long:
        return None
    return (
        "names too long for Kubernetes: "
        + ", ".join(long)
        + ("; shorten the cluster's name or its listeners'")
    )


def _broker_refuses(target: Target, cluster: KafkaCluster) -> str | None:
    """What the broker would say of its configuration at start, if it would not start: each
    pool's properties, with a node id and advertised listeners as its pods give them."""
    for pool in pools(cluster.spec):
        properties = server_properties(target, cluster.spec, pool) | {
            "node.id": str(pool.node_id_base)
        }
        try:
            BrokerConfig.from_properties(properties)
        except InvalidConfig as exc:
            return f"{pool.role} configuration: {exc}"
    return None


def _allowed_replicas(
    cluster: KafkaCluster, observed: Observed
) -> tuple[dict[Role, int], list[tuple[str, str]]]:
    allowed: dict[Role, int] = {}
    refused: list[tuple[str, str]] = []
    for pool in pools(cluster.spec):
        current = observed.statefulsets.get(pool.role)
        wanted = pool.spec.replicas
        allowed[pool.role] = wanted
        if current is None or current.replicas == wanted:
            continue
        if pool.is_controller:
            allowed[pool.role] = current.replicas
            refused.append(
                (
                    "ControllerScalingNotSupported",
                    f"{pool.role} replicas stay {current.replicas}: the controller quorum's "
                    f"voters are fixed when the cluster is created (asked: {wanted})",
                )
            )
        elif wanted < current.replicas:
            allowed[pool.role] = current.replicas
            refused.append(
                (
                    "ScaleDownNotSupported",
                    f"{pool.role} replicas stay {current.replicas}: removing brokers needs "
                    f"their partitions moved first, which is not supported yet (asked: {wanted})",
                )
            )
    return allowed, refused


def _voters_kept(cluster: KafkaCluster, replicas: Mapping[Role, int]) -> KafkaCluster:
    """The cluster as the plan carries it out: a voters' pool keeps the size it has when its
    resizing is refused, so `controller.quorum.voters` (in every pool's configuration) keeps
    naming the voters that run, and no pod restarts for a change that was refused."""
    spec = cluster.spec
    for pool in pools(spec):
        kept = replicas.get(pool.role, pool.spec.replicas)
        if pool.is_controller and kept != pool.spec.replicas:
            field_name = "controllers" if pool.role == "controller" else "combined"
            spec = spec.model_copy(
                update={field_name: pool.spec.model_copy(update={"replicas": kept})}
            )
    return cluster if spec is cluster.spec else cluster.model_copy(update={"spec": spec})


def _allowed_claims(
    cluster: KafkaCluster, observed: Observed
) -> tuple[dict[Role, Claims], list[tuple[str, str]]]:
    """A StatefulSet's volume claims cannot change: a pool keeps the ones it has, and says
    so."""
    allowed: dict[Role, Claims] = {}
    refused: list[tuple[str, str]] = []
    for pool in pools(cluster.spec):
        wanted = claims_of(pool.spec.storage)
        current = observed.statefulsets.get(pool.role)
        allowed[pool.role] = wanted
        if current is None or current.claims == wanted:
            continue
        allowed[pool.role] = current.claims
        refused.append(
            (
                "StorageChangeNotSupported",
                f"{pool.role} storage stays {_storage_text(current.claims)}: a StatefulSet's "
                f"volume claims cannot change (asked: {_storage_text(wanted)})",
            )
        )
    return allowed, refused


def _storage_text(claims: Claims) -> str:
    if claims is None:
        return "ephemeral"
    size, storage_class = claims
    return size if storage_class is None else f"{size} of class {storage_class}"


# -- status -----------------------------------------------------------------------------------


def _expected_pods(cluster: KafkaCluster, replicas: Mapping[Role, int]) -> int:
    return sum(replicas.get(pool.role, pool.spec.replicas) for pool in pools(cluster.spec))


LOST_VOLUME = "VolumeNotFormatted"
"""The `Ready` reason while a node does not start because its volume is empty (lost or
replaced after it ran on a formatted one)."""

LAST_ERROR_CHARACTERS = 300
"""How much of what a stuck node said the status repeats."""


def _stuck_text(pod: PodState) -> str:
    said = f"{pod.name} ({pod.stuck})" if pod.stuck else pod.name
    if pod.stuck and pod.last_error:
        error = pod.last_error
        if len(error) > LAST_ERROR_CHARACTERS:
            error = error[: LAST_ERROR_CHARACTERS - 1] + "…"
        said += f": {error}"
    return said


def _lost_volumes(
    cluster: KafkaCluster, target: Target, observed: Observed, disks: Volumes
) -> list[str]:
    """What to say of each node that does not start because its volume is empty."""
    by_role = {pool.role: pool for pool in pools(cluster.spec)}
    return [
        lost_volume(target.name, pool, node_id(pool, pod.ordinal), pod.name, disks.to_format)
        for pod in observed.pods
        if not pod.ready and says_not_formatted(pod) and (pool := by_role.get(pod.pool))
    ]


def _conditions(
    cluster: KafkaCluster,
    observed: Observed,
    facts: BrokerFacts | None,
    replicas: Mapping[Role, int],
    restarts: Sequence[Restart],
    *,
    target: Target,
    settling: tuple[float, str] | None = None,
    held: str | None = None,
    moved: Mapping[str, str] | None = None,
    disks: Volumes,
    live: LiveChanges | None = None,
) -> tuple[list[ConditionState], float | None]:
    expected = _expected_pods(cluster, replicas)
    ready = [pod for pod in observed.pods if pod.ready and not pod.deleting]
    outdated = [pod.name for pod in due(observed, moved or {})]
    not_ready = sorted(_stuck_text(pod) for pod in observed.pods if not pod.ready or pod.deleting)
    missing = expected - len(observed.pods)
    brokers = [
        node_id(pool, ordinal)
        for pool in pools(cluster.spec)
        if pool.is_broker
        for ordinal in range(replicas.get(pool.role, pool.spec.replicas))
    ]
    if not_ready or missing > 0:
        waiting = ", ".join(not_ready + ([f"{missing} not created yet"] if missing > 0 else []))
        reason = "NodesNotReady"
        message = f"{len(ready)}/{expected} nodes ready; waiting for {waiting}"
        controllers = [pod for pod in observed.pods if pod.pool == "controller"]
        lost = _lost_volumes(cluster, target, observed, disks)
        if lost:
            reason = LOST_VOLUME
            message = f"{len(ready)}/{expected} nodes ready; " + "; ".join(lost)
        elif any(pod.stuck for pod in observed.pods):
            reason = "NodesStuck"
        elif controllers and all(
            p.running_for_s >= QUORUM_GRACE_S and not p.ready and not p.deleting
            for p in controllers
        ):
            reason = "QuorumNotFormed"
            message += (
                "; every controller runs but none is ready: they have not elected a leader "
                "(a majority of them must reach each other on port 9093)"
            )
        ready_condition = ConditionState("Ready", "False", reason, message)
    elif facts is None:
        ready_condition = ConditionState(
            "Ready", "False", "BrokersUnreachable", "the brokers' Admin API did not answer"
        )
    elif unfenced := [b for b in brokers if facts.brokers.get(b) != "Unfenced"]:
        ready_condition = ConditionState(
            "Ready",
            "False",
            "BrokersNotRegistered",
            "brokers not registered and unfenced yet: " + ", ".join(map(str, unfenced)),
        )
    elif outdated:
        ready_condition = ConditionState(
            "Ready",
            "False",
            "RollingRestart",
            f"{len(outdated)} node(s) to restart: {', '.join(sorted(outdated))}",
        )
    elif live is not None and live.updates:
        ready_condition = ConditionState(
            "Ready", "False", "ConfigUpdating", "setting without a restart: " + _live_text(live)
        )
    elif facts.under_replicated:
        ready_condition = ConditionState(
            "Ready",
            "False",
            "PartitionsUnderReplicated",
            f"{facts.under_replicated} partition(s) have fewer in-sync replicas than replicas",
        )
    else:
        ready_condition = ConditionState(
            "Ready", "True", "Ready", f"{expected}/{expected} nodes ready, every broker in sync"
        )
    busy = ready_condition.status != "True"
    reconciling = ConditionState(
        "Reconciling",
        "True" if busy else "False",
        (
            "RollingRestart"
            if restarts or outdated
            else ready_condition.reason
            if busy
            else "Reconciled"
        ),
        (
            "restarting " + "; ".join(f"{each.pod}: {each.reason}" for each in restarts)
            if restarts
            else settling[1]
            if settling is not None
            else f"{ready_condition.message}; {held}"
            if held is not None and outdated and ready_condition.reason == "RollingRestart"
            else ready_condition.message
            if busy
            else "every object is as the spec asks"
        ),
    )
    return [ready_condition, reconciling], WAIT_S if busy else None


def _status(
    cluster: KafkaCluster,
    target: Target,
    observed: Observed,
    facts: BrokerFacts | None,
    replicas: Mapping[Role, int],
    *,
    started: Started | None = None,
    formatted: Collection[int] = (),
) -> dict[str, Any]:
    by_name = {pod.name: pod for pod in observed.pods}
    nodes = []
    for pool in pools(cluster.spec):
        for ordinal in range(replicas.get(pool.role, pool.spec.replicas)):
            name = pod_name(target, pool, ordinal)
            pod = by_name.get(name)
            node: dict[str, Any] = {
                "nodeId": node_id(pool, ordinal),
                "roles": list(pool.roles),
                "pod": name,
                "ready": pod is not None and pod.ready and not pod.deleting,
                "formatted": node_id(pool, ordinal) in formatted,
            }
            if pool.is_broker and facts is not None:
                node["brokerState"] = facts.brokers.get(node_id(pool, ordinal), "NotRegistered")
            if pod is not None and pod.rack is not None and cluster.spec.rack is not None:
                node["rack"] = pod.rack
            if name in (started or {}):
                uid, addresses = (started or {})[name]
                node |= {"podUid": uid, "addresses": dict(addresses)}
            nodes.append(node)
    ready = sum(1 for node in nodes if node["ready"])
    return {
        "clusterId": target.cluster_id,
        "listeners": [
            {
                "name": listener.name,
                "type": listener.type,
                "bootstrapServers": bootstrap_servers_of(target, listener, observed),
            }
            # Internal ones first: `kubectl get kc` shows the first, and topics use it.
            for listener in sorted(cluster.spec.listeners, key=lambda x: x.type != "internal")
        ],
        "nodes": nodes,
        "readyNodes": f"{ready}/{len(nodes)}",
    }


def merge_conditions(
    current: Sequence[Mapping[str, Any]],
    wanted: Sequence[ConditionState],
    *,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The conditions to write: `lastTransitionTime` moves only when a status changes, and a
    condition no longer wanted (a refusal that was lifted) is dropped."""
    previous = {c.get("type"): c for c in current}
    merged = []
    for condition in wanted:
        before = previous.get(condition.type)
        since = now
        if before is not None and before.get("status") == condition.status:
            since = before.get("lastTransitionTime", now)
        merged.append(
            {
                "type": condition.type,
                "status": condition.status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        )
    return merged
